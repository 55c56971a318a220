"""Cosmos3 forward dynamics rolled out window by window over the paged KV cache.

The settings models (`RolloutKnobs`, `Cosmos3Architecture`) import without torch, so the YAML config can use
them; everything else loads on first use.
"""

from __future__ import annotations

import importlib

from .architecture import FAMILY_SWITCHES, Cosmos3Architecture, PipelineOptions
from .knobs import RolloutKnobs

_LAZY = {
    "ActionConvention": ".action_convention",
    "ActionNormalizer": ".action_normalizer",
    "ActionRangeWarning": ".action_normalizer",
    "ActionStats": ".action_stats",
    "Conditioning": ".conditioning",
    "FramePlan": ".canvas",
    "plan_first_frame": ".canvas",
    "SessionFrame": ".first_frame",
    "frame_for_size": ".first_frame",
    "Embodiment": ".embodiment",
    "EmbodimentRegistry": ".embodiments",
    "build_checkpoint": ".checkpoint",
    "build_pipeline": ".checkpoint",
    "ensure_embedded_checkpoint": ".checkpoint",
    "CheckpointNotFoundError": ".loader",
    "Cosmos3Components": ".loader",
    "load_components": ".loader",
    "model_spec": ".loader",
    "Cosmos3WorldModel": ".model",
    "resolve_device": ".loader",
    "RolloutSession": ".session",
    "SessionClosedError": ".session",
    "KVStats": ".spec",
    "ModelSpec": ".spec",
    "PhaseTimings": ".spec",
    "WindowResult": ".spec",
}

__all__ = ["FAMILY_SWITCHES", "Cosmos3Architecture", "PipelineOptions", "RolloutKnobs", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
