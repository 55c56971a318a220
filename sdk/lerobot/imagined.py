"""Imagined episodes out: a wrapper that records what an env shows and is given, as a LeRobot v3.0 dataset.

Each episode becomes one LeRobot episode of ``1 + windows * chunk`` frames: the first frame, then every frame
of every window. Row ``t`` holds frame ``t`` and the action executed from it (action row ``t`` of the window
that produced frame ``t + 1``); the last frame has no action of its own, so it repeats the one before (LeRobot
keeps one action per frame). ``observation.state`` is ``obs["state"]`` when the env has one (row ``t``: the state
frame ``t`` shows). The task is the episode's prompt, ``success`` whether any step's ``info["is_success"]``
was true. Cameras: the env's ``frames`` is ``observation.image``; a multi-camera env's view ``c`` is
``observation.images.<c>``.

An episode is added when the next one starts or on ``finish``, which writes the dataset (atomically,
see ``writer.py``); ``close`` without ``finish`` drops it, so an interrupted run leaves no dataset. Batched
evaluations record each slot into an ``EpisodeBuffer`` and add a batch's episodes in their order.
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


class EpisodeBuffer:
    """One imagined episode as it arrives (its first observation, then each window), added to a writer whole."""

    def __init__(self, keys: dict[str, str], action_width: int, obs: dict[str, Any], task: str) -> None:
        self.keys, self.action_width, self.task = keys, action_width, task
        self.frames = {k: [np.asarray(obs[k])[:1]] for k in keys}
        self.state = [np.asarray(obs["state"])[:1]] if "state" in obs else None
        self.actions: list[np.ndarray] = []
        self.success = False

    def step(self, obs: dict[str, Any], actions: np.ndarray, info: dict[str, Any]) -> None:
        """One window: its frames (and state rows), the actions that drove them; a window that ran out of KV pages
        executed nothing and is skipped."""
        if info.get("kv_exhausted", False):
            return
        for k in self.keys:
            self.frames[k].append(np.asarray(obs[k]))
        self.actions.append(np.asarray(actions, dtype=np.float32).reshape(-1, self.action_width))
        if self.state is not None:
            self.state.append(np.asarray(obs["state"]))
        self.success = self.success or bool(info.get("is_success", False))

    def add_to(self, writer: DatasetWriter) -> None:
        """Append the episode to ``writer`` (nothing when no window ran)."""
        if not self.actions:
            return
        actions = np.concatenate(self.actions)
        actions = np.concatenate([actions, actions[-1:]])  # the last frame repeats the action before it
        state = None if self.state is None else np.concatenate(self.state).astype(np.float32)
        writer.add_episode(frames={self.keys[k]: np.concatenate(v) for k, v in self.frames.items()},
                           actions=actions, state=state, task=self.task, success=self.success)


def open_writer(env: Any, root: str | os.PathLike, codec: str = "av1") -> tuple[DatasetWriter, dict[str, str]]:
    """A writer for the episodes of ``env`` (a gymnasium env, or a vector env: its single spaces) and its camera
    keys (observation key -> LeRobot video feature)."""
    space = getattr(env, "single_observation_space", env.observation_space)
    action_space = getattr(env, "single_action_space", env.action_space)
    keys = camera_keys(space)
    fps = frame_fps(env)
    if fps != int(fps):
        raise ValueError(f"the env's frame fps {fps} is invalid for a LeRobot dataset; allowed: whole numbers")
    state = space.spaces.get("state")
    writer = DatasetWriter(root, fps=int(fps), codec=codec, action_width=int(action_space.shape[-1]),
                           state_width=None if state is None else int(state.shape[-1]),
                           cameras={keys[k]: tuple(int(n) for n in space[k].shape[1:3]) for k in keys})
    return writer, keys


def episode_task(env: Any, options: dict[str, Any] | None) -> str:
    """The prompt an episode ran with: its reset option, else the env's default."""
    prompt = (options or {}).get("prompt") or getattr(getattr(env, "unwrapped", env), "prompt", None)
    return str(prompt or "imagined episode")


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
        self.writer, self.keys = open_writer(env, root, codec)
        self.episode: EpisodeBuffer | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._flush()
        self.episode = EpisodeBuffer(self.keys, self.writer.action_width, obs, episode_task(self.env, options))
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self.episode is not None:
            self.episode.step(obs, actions, info)
        return obs, reward, terminated, truncated, info

    def _flush(self) -> None:
        episode, self.episode = self.episode, None
        if episode is not None:
            episode.add_to(self.writer)

    def finish(self):
        """Add the episode in progress and write the dataset; returns its folder."""
        self._flush()
        return self.writer.close()

    def close(self) -> None:
        """Drop the dataset unless ``finish`` wrote it, then close the env."""
        self.writer.abort()
        super().close()
