"""Cosmos3 forward dynamics rolled out window by window over the paged KV cache."""

from .checkpoint import build_checkpoint, build_pipeline, ensure_embedded_checkpoint
from .loader import CheckpointNotFoundError, Cosmos3Components, load_components
from .model import Cosmos3WorldModel
from .session import RolloutSession, SessionClosedError
from .spec import KVStats, ModelSpec, PhaseTimings, RolloutKnobs, WindowResult

__all__ = [
    "CheckpointNotFoundError",
    "Cosmos3Components",
    "Cosmos3WorldModel",
    "KVStats",
    "ModelSpec",
    "PhaseTimings",
    "RolloutKnobs",
    "RolloutSession",
    "SessionClosedError",
    "WindowResult",
    "build_checkpoint",
    "build_pipeline",
    "ensure_embedded_checkpoint",
    "load_components",
]
