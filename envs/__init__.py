"""worldstep.envs: the gymnasium surface of worldstep.

``WorldModelEnv`` (one rollout per env), ``WorldModelVectorEnv`` (N rollouts batched through one model),
the wrappers ``RecordRollout`` (every frame to mp4) and ``ImageObservation`` (frames as one image for image RL),
``fork_env`` (fork through gym.make's wrappers), ``PushSimEnv`` and the registered ids (``ENV_IDS`` and
``worldstep/PushSim-v0``).
The classes import the engine (torch, diffusers) on first use, so ``import worldstep`` stays fast.
"""

from __future__ import annotations

import importlib

from .registration import ENV_IDS, register_envs

_LAZY = {
    "WorldModelEnv": ".world_model_env",
    "WorldModelVectorEnv": ".vector_env",
    "RecordRollout": ".wrappers",
    "ImageObservation": ".wrappers",
    "fork_env": ".wrappers",
    "PushSimEnv": ".push_sim",
    "Mp4Writer": ".video",
    "frame_fps": ".video",
}

__all__ = ["ENV_IDS", "register_envs", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
