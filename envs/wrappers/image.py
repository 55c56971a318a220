"""``ImageObservation``: a window's frames as one image observation (the last frame, or the window stacked on
the channels), for agents that take an image."""

from __future__ import annotations

from typing import Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..camera_observation import frames_box


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
