"""``RecordRollout``: a world-model env's episodes written to mp4, on the model's frame timeline."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym

from ..camera_observation import frames_box
from ..video import Mp4Writer, frame_fps


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
