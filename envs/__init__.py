"""worldstep.envs: the gymnasium surface of worldstep.

``WorldModelEnv`` (one rollout per env), ``WorldModelVectorEnv`` (N rollouts batched through one model),
``Episode`` (what both step), ``make_world_model_env`` (the env in the wrappers its keywords ask for:
``NormalizeActions``, ``JudgeSuccess``, ``WindowLimit``), the ``RecordRollout``, ``MultiCameraObservation``
and ``RobotStateObservation`` wrappers and the ground-truth simulator ``PushSimEnv``.
The ids are registered by ``worldstep.registration``. The classes import the engine (torch, diffusers) on
first use, so ``import worldstep`` stays fast.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "WorldModelEnv": ".world_model_env",
    "Episode": ".episode",
    "WorldModelVectorEnv": ".vector_env",
    "make_world_model_env": ".make",
    "NormalizeActions": ".wrappers.episode",
    "JudgeSuccess": ".wrappers.episode",
    "WindowLimit": ".wrappers.episode",
    "RecordRollout": ".wrappers",
    "ImageObservation": ".wrappers",
    "fork_env": ".wrappers",
    "CameraGrid": ".cameras",
    "CameraLayout": ".cameras",
    "MultiCameraObservation": ".camera_observation",
    "RobotStateObservation": ".robot_state",
    "PushSimEnv": ".push_sim",
    "Mp4Writer": ".video",
    "frame_fps": ".video",
}

__all__ = [*_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
