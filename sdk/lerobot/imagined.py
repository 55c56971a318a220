"""Imagined episodes out: a wrapper that records what an env shows and is given, as a LeRobot v3.0 dataset.

Each episode becomes one LeRobot episode of ``1 + windows * chunk`` frames: the first frame, then every frame
of every window. Row ``t`` holds frame ``t`` and the action executed from it (action row ``t`` of the window
that produced frame ``t + 1``); the last frame has no action of its own, so it repeats the one before (LeRobot
keeps one action per frame). ``observation.state`` is ``obs["state"]`` when the env has one (row ``t``: the state
frame ``t`` shows). The task is the episode's prompt, ``success`` whether any step's ``info["is_success"]``
was true. Cameras: the env's ``frames`` is ``observation.image``; a multi-camera env's view ``c`` is
``observation.images.<c>``.

An episode is added when the next one starts or on ``finish``, which writes the dataset (atomically,
see ``writer.py``); ``close`` without ``finish`` drops it, so an interrupted run leaves no dataset.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
from worldstep.envs.video import frame_fps

from .writer import DatasetWriter

SINGLE_CAMERA = "observation.image"


def camera_keys(observation_space: gym.spaces.Dict) -> dict[str, str]:
    """Observation key -> LeRobot video feature for every image key of a worldstep observation space."""
    images = [k for k, s in observation_space.spaces.items() if k != "state" and len(s.shape) == 4]
    if images == ["frames"]:
        return {"frames": SINGLE_CAMERA}
    return {k: f"observation.images.{k}" for k in images}


class RecordLeRobot(gym.Wrapper):
    """Record every episode of ``env`` into a LeRobot v3.0 dataset at ``root`` (written by ``finish``).

    Args:
        env: a worldstep env (a Dict observation with ``frames`` or one view per camera, optionally ``state``).
        root: the dataset folder; it must not exist yet.
        codec: ``av1`` (LeRobot's default) or ``h264``.
    """

    def __init__(self, env: gym.Env, root: str | os.PathLike, *, codec: str = "av1") -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        super().__init__(env)
        space = env.observation_space
        self.keys = camera_keys(space)
        fps = frame_fps(env)
        if fps != int(fps):
            raise ValueError(f"the env's frame fps {fps} is invalid for a LeRobot dataset; allowed: whole numbers")
        state = space.spaces.get("state")
        self.writer = DatasetWriter(root, fps=int(fps), codec=codec, action_width=int(env.action_space.shape[-1]),
                                    state_width=None if state is None else int(state.shape[-1]),
                                    cameras={self.keys[k]: tuple(int(n) for n in space[k].shape[1:3])
                                             for k in self.keys})
        self.episode: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._flush()
        prompt = (options or {}).get("prompt") or getattr(self.env.unwrapped, "prompt", None) or "imagined episode"
        self.episode = {"task": str(prompt), "frames": {k: [np.asarray(obs[k])[:1]] for k in self.keys},
                        "actions": [], "state": [np.asarray(obs["state"])[:1]] if "state" in obs else None,
                        "success": False}
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        episode = self.episode
        if episode is not None and not info.get("kv_exhausted", False):
            for k in self.keys:
                episode["frames"][k].append(np.asarray(obs[k]))
            episode["actions"].append(np.asarray(actions, dtype=np.float32).reshape(-1, self.writer.action_width))
            if episode["state"] is not None:
                episode["state"].append(np.asarray(obs["state"]))
            episode["success"] = episode["success"] or bool(info.get("is_success", False))
        return obs, reward, terminated, truncated, info

    def _flush(self) -> None:
        episode, self.episode = self.episode, None
        if episode is None or not episode["actions"]:
            return
        actions = np.concatenate(episode["actions"])
        actions = np.concatenate([actions, actions[-1:]])  # the last frame repeats the action before it
        state = None if episode["state"] is None else np.concatenate(episode["state"]).astype(np.float32)
        self.writer.add_episode(frames={self.keys[k]: np.concatenate(v) for k, v in episode["frames"].items()},
                                actions=actions, state=state, task=episode["task"], success=episode["success"])

    def finish(self):
        """Add the episode in progress and write the dataset; returns its folder."""
        self._flush()
        return self.writer.close()

    def close(self) -> None:
        """Drop the dataset unless ``finish`` wrote it, then close the env."""
        self.writer.abort()
        super().close()
