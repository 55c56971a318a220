"""Wrappers for world-model envs; each does one thing and checks its arguments."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .camera_observation import MultiCameraObservation, frames_box
from .episode_wrappers import JudgeSuccess, NormalizeActions, WindowLimit
from .robot_state import RobotStateObservation
from .video import Mp4Writer, frame_fps


class RecordRollout(gym.Wrapper):
    """Write every frame of every episode to ``{video_folder}/{name_prefix}-{episode:03d}.mp4``.

    A video holds the episode's first frame followed by every frame of every window (``1 + windows *
    chunk_size`` frames, the model's frame timeline), at ``env.metadata["frame_fps"]``. A window that
    ended by running out of KV pages produced no new frames and adds none. The file is written under a
    temporary name and renamed into place when the episode ends, on the next reset, or on close.
    """

    def __init__(self, env: gym.Env, video_folder: str | os.PathLike, name_prefix: str = "episode") -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        frames_box(env)
        if not isinstance(video_folder, (str, os.PathLike)):
            raise TypeError(f"video_folder={video_folder!r} is invalid; allowed: a str or os.PathLike")
        if not isinstance(name_prefix, str) or not name_prefix or os.sep in name_prefix:
            raise ValueError(f"name_prefix={name_prefix!r} is invalid; allowed: a non-empty file name prefix")
        fps = frame_fps(env)
        if not fps > 0:
            raise ValueError(f"env.metadata['frame_fps']={fps!r} is invalid; allowed: a number > 0")
        super().__init__(env)
        self.video_folder = Path(video_folder)
        self.name_prefix = name_prefix
        self.fps = float(fps)
        self.episode = -1
        self.video_paths: list[Path] = []
        self._writer: Mp4Writer | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._finish()
        self.episode += 1
        path = self.video_folder / f"{self.name_prefix}-{self.episode:03d}.mp4"
        self._writer = Mp4Writer(path, self.fps)
        self.video_paths.append(path)
        self._writer.write(obs["frames"][0])  # reset frames repeat the first frame
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._writer is not None and not info.get("kv_exhausted", False):
            self._writer.write(obs["frames"])
        if terminated or truncated:
            self._finish()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._finish()
        super().close()

    @property
    def last_video_path(self) -> Path | None:
        return self.video_paths[-1] if self.video_paths else None

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class ImageObservation(gym.ObservationWrapper):
    """The window's frames as one image ``Box`` for image RL libraries (Stable-Baselines3's ``CnnPolicy``,
    torchrl's pixel transforms).

    ``frames="last"``: the window's last frame, ``(H, W, 3)`` uint8. ``frames="stack"``: every frame of the
    window stacked on the channel axis, oldest first, ``(H, W, 3 * chunk_size)`` uint8 (the whole window
    the action chunk produced). Channels last, bounds 0..255: what SB3 recognises as an image.
    """

    def __init__(self, env: gym.Env, frames: Literal["last", "stack"] = "last") -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        box = frames_box(env)
        if frames not in ("last", "stack"):
            raise ValueError(f"frames={frames!r} is invalid; allowed: 'last' or 'stack'")
        super().__init__(env)
        self.frames = frames
        chunk, height, width, _ = box.shape
        channels = 3 if frames == "last" else 3 * chunk
        self.observation_space = spaces.Box(0, 255, (height, width, channels), np.uint8)

    def observation(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        window = observation["frames"]  # [chunk, H, W, 3]
        if self.frames == "last":
            return window[-1]
        return np.ascontiguousarray(window.transpose(1, 2, 0, 3).reshape(*window.shape[1:3], -1))  # [H, W, 3*chunk]


# Wrappers whose state is plain values, so a shallow copy continues the same episode (what make_env and gym.make
# add, plus the observation wrappers; the robot state's arrays are replaced, never written in place, on every step).
# Wrappers that own files or buffers (RecordRollout, RecordVideo) cannot be forked: two envs would write one video.
FORKABLE_WRAPPERS = (
    WindowLimit,
    JudgeSuccess,
    NormalizeActions,
    gym.wrappers.TimeLimit,
    gym.wrappers.OrderEnforcing,
    gym.wrappers.PassiveEnvChecker,
    ImageObservation,
    MultiCameraObservation,
    RobotStateObservation,
)


def fork_env(env: gym.Env, seed: int | None = None) -> gym.Env:
    """Fork a (wrapped) world-model env: ``env.unwrapped.fork(seed)`` inside copies of ``env``'s wrappers.

    ``make_env`` wraps the env (``WindowLimit``, ``JudgeSuccess``, ``NormalizeActions``) and ``gym.make`` adds
    ``TimeLimit``, ``OrderEnforcing`` and ``PassiveEnvChecker``, so ``env.fork`` is out of reach of the wrapper
    chain; this keeps the chain, with the step counts of ``WindowLimit`` and ``TimeLimit`` carried over. A
    wrapper outside ``FORKABLE_WRAPPERS`` raises ``TypeError`` naming it.
    """
    chain = []
    inner = env
    while isinstance(inner, gym.Wrapper):
        if not isinstance(inner, FORKABLE_WRAPPERS):
            raise TypeError(f"fork_env cannot copy wrapper {type(inner).__name__}; allowed: "
                            f"{', '.join(w.__name__ for w in FORKABLE_WRAPPERS)} (fork env.unwrapped and wrap it "
                            "again instead)")
        chain.append(inner)
        inner = inner.env
    fork = getattr(inner, "fork", None)
    if fork is None:
        raise TypeError(f"env={env!r} is invalid; allowed: a worldstep world-model env (with fork())")
    forked = fork(seed=seed)
    for wrapper in reversed(chain):
        outer = copy.copy(wrapper)
        outer.env = forked
        forked = outer
    return forked
