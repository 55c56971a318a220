"""worldstep.envs: the gymnasium surface of worldstep.

``WorldModelEnv`` (one rollout per env), ``WorldModelVectorEnv`` (N rollouts batched through one model),
the ``RecordRollout`` wrapper and the registered ids ``worldstep/Tiny-v0`` and ``worldstep/Cosmos3Edge-v0``.
The classes import the engine (torch, diffusers) on first use, so ``import worldstep`` stays fast.
"""

from __future__ import annotations

import importlib

from .registration import ENV_IDS, register_envs

_LAZY = {
    "WorldModelEnv": ".world_model_env",
    "WindowTimings": ".world_model_env",
    "WorldModelVectorEnv": ".vector_env",
    "RecordRollout": ".wrappers",
    "Mp4Writer": ".video",
}

__all__ = ["ENV_IDS", "register_envs", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
