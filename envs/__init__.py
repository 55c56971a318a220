"""worldstep.envs: the gymnasium surface of worldstep.

``WorldModelEnv`` (one rollout per env), ``WorldModelVectorEnv`` (N rollouts batched through one model),
``Episode`` (what both step), ``make_world_model_env`` (the env in the wrappers its keywords ask for:
``NormalizeActions``, ``JudgeSuccess``, ``WindowLimit``), the ``RecordRollout``, ``MultiCameraObservation``
and ``RobotStateObservation`` wrappers and the ground-truth simulator ``PushSimEnv``.
The ids are registered by ``worldstep.registration``. The four names that import the engine (torch, diffusers)
load on first use, so the torch-free parts (the simulator, the wrappers, the CLI's argument checks) stay fast.
"""

from __future__ import annotations

from .camera_observation import MultiCameraObservation
from .cameras import CameraGrid, CameraLayout
from .push_sim import PushSimEnv
from .robot_state import RobotStateObservation
from .video import Mp4Writer, frame_fps
from .wrappers import ImageObservation, JudgeSuccess, NormalizeActions, RecordRollout, WindowLimit, fork_env

__all__ = [
    "CameraGrid",
    "CameraLayout",
    "Episode",
    "ImageObservation",
    "JudgeSuccess",
    "Mp4Writer",
    "MultiCameraObservation",
    "NormalizeActions",
    "PushSimEnv",
    "RecordRollout",
    "RobotStateObservation",
    "WindowLimit",
    "WorldModelEnv",
    "WorldModelVectorEnv",
    "fork_env",
    "frame_fps",
    "make_world_model_env",
]


def __getattr__(name: str):
    """The names whose modules import the engine (torch), imported on first use; every import is spelled out, so
    tools and the structure test see each edge."""
    if name == "WorldModelEnv":
        from .world_model_env import WorldModelEnv

        return WorldModelEnv
    if name == "Episode":
        from .episode import Episode

        return Episode
    if name == "WorldModelVectorEnv":
        from .vector_env import WorldModelVectorEnv

        return WorldModelVectorEnv
    if name == "make_world_model_env":
        from .make import make_world_model_env

        return make_world_model_env
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
