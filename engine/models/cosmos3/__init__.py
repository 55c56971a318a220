"""Cosmos3 forward dynamics rolled out window by window over the paged KV cache.

The settings models (`RolloutKnobs`, `Cosmos3Architecture`) import without torch, so the YAML config can use
them; everything else loads on first use.
"""

from __future__ import annotations

from .architecture import FAMILY_SWITCHES, Cosmos3Architecture, PipelineOptions
from .knobs import RolloutKnobs

__all__ = [
    "FAMILY_SWITCHES",
    "Cosmos3Architecture",
    "PipelineOptions",
    "RolloutKnobs",
    "ActionConvention",
    "ActionNormalizer",
    "ActionRangeWarning",
    "ActionStats",
    "Conditioning",
    "FramePlan",
    "plan_first_frame",
    "SessionFrame",
    "frame_for_size",
    "Embodiment",
    "EmbodimentRegistry",
    "build_checkpoint",
    "build_pipeline",
    "ensure_embedded_checkpoint",
    "CheckpointNotFoundError",
    "Cosmos3Components",
    "load_components",
    "model_spec",
    "Cosmos3WorldModel",
    "resolve_device",
    "RolloutSession",
    "SessionClosedError",
    "KVStats",
    "ModelSpec",
    "PhaseTimings",
    "WindowResult",
]


def __getattr__(name: str):
    """The names whose modules import torch, imported on first use; every import is spelled out, so tools and the
    structure test see each edge."""
    if name == "ActionConvention":
        from .action_convention import ActionConvention

        return ActionConvention
    if name == "ActionNormalizer":
        from .action_normalizer import ActionNormalizer

        return ActionNormalizer
    if name == "ActionRangeWarning":
        from .action_normalizer import ActionRangeWarning

        return ActionRangeWarning
    if name == "ActionStats":
        from .action_stats import ActionStats

        return ActionStats
    if name == "Conditioning":
        from .conditioning import Conditioning

        return Conditioning
    if name == "FramePlan":
        from .canvas import FramePlan

        return FramePlan
    if name == "plan_first_frame":
        from .canvas import plan_first_frame

        return plan_first_frame
    if name == "SessionFrame":
        from .first_frame import SessionFrame

        return SessionFrame
    if name == "frame_for_size":
        from .first_frame import frame_for_size

        return frame_for_size
    if name == "Embodiment":
        from .embodiment import Embodiment

        return Embodiment
    if name == "EmbodimentRegistry":
        from .embodiments import EmbodimentRegistry

        return EmbodimentRegistry
    if name == "build_checkpoint":
        from .checkpoint import build_checkpoint

        return build_checkpoint
    if name == "build_pipeline":
        from .checkpoint import build_pipeline

        return build_pipeline
    if name == "ensure_embedded_checkpoint":
        from .checkpoint import ensure_embedded_checkpoint

        return ensure_embedded_checkpoint
    if name == "CheckpointNotFoundError":
        from .loader import CheckpointNotFoundError

        return CheckpointNotFoundError
    if name == "Cosmos3Components":
        from .loader import Cosmos3Components

        return Cosmos3Components
    if name == "load_components":
        from .loader import load_components

        return load_components
    if name == "model_spec":
        from .loader import model_spec

        return model_spec
    if name == "Cosmos3WorldModel":
        from .model import Cosmos3WorldModel

        return Cosmos3WorldModel
    if name == "resolve_device":
        from .loader import resolve_device

        return resolve_device
    if name == "RolloutSession":
        from .session import RolloutSession

        return RolloutSession
    if name == "SessionClosedError":
        from .session import SessionClosedError

        return SessionClosedError
    if name == "KVStats":
        from .spec import KVStats

        return KVStats
    if name == "ModelSpec":
        from .spec import ModelSpec

        return ModelSpec
    if name == "PhaseTimings":
        from .spec import PhaseTimings

        return PhaseTimings
    if name == "WindowResult":
        from .spec import WindowResult

        return WindowResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
