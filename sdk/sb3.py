"""Stable-Baselines3 stepping the batched engine: one ``VecEnv`` whose N episodes cost ONE engine call per step.

SB3's ``make_vec_env`` builds N separate envs that step one by one (and each loads its own model unless handed
a ``World``), so the engine's batching is never used. :class:`WorldModelVecEnv` holds N world-model envs and
steps them together: local envs of one model through ``worldstep.envs.batched.step_batch`` (one ``model.step``),
remote envs (``worldstep serve``) concurrently, so the server batches them into one engine call. Observations
are images (``ImageObservation``: the window's last frame or every frame stacked on the channels), what
``CnnPolicy`` trains on.

```python
venv = WorldModelVecEnv.local("pusher", num_envs=4, max_windows=8)    # or .remote("ws://...", num_envs=4)
model = stable_baselines3.PPO("CnnPolicy", venv, n_steps=16)
```
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from worldstep.envs.batched import step_batch

try:
    from stable_baselines3.common.vec_env import VecEnv
except ImportError as err:
    raise ImportError("worldstep.sb3 needs Stable-Baselines3: pip install 'stable-baselines3>=2.3'") from err


__all__ = ["WorldModelVecEnv"]


class WorldModelVecEnv(VecEnv):
    """An SB3 ``VecEnv`` over a ``WorldModelVectorEnv`` (or ``RemoteWorldModelEnv`` clients), batched per step.

    Args:
        envs: a ``WorldModelVectorEnv`` (its sub-environments step through one engine call), or a list of
            ``RemoteWorldModelEnv`` of one server (stepped concurrently; the server batches them).
        frames: ``"stack"`` (every frame of the window on the channel axis) or ``"last"``; see
            ``worldstep.envs.ImageObservation``.

    Autoreset is SB3's: a finished episode resets in the same step, its last observation in
    ``infos[i]["terminal_observation"]`` and ``infos[i]["TimeLimit.truncated"]`` set on truncation.
    ``reset()`` uses the seeds of ``seed()`` (sub-env ``i`` gets ``seed + i``) once.
    """

    def __init__(self, envs: Any, frames: Literal["last", "stack"] = "stack") -> None:
        from worldstep.envs import ImageObservation, WorldModelVectorEnv

        from .serve.client import RemoteWorldModelEnv

        if isinstance(envs, WorldModelVectorEnv):
            self.vector_env, self.envs, self.remote = envs, list(envs.envs), False
        elif isinstance(envs, Sequence) and envs and all(isinstance(e, RemoteWorldModelEnv) for e in envs):
            self.vector_env, self.envs, self.remote = None, list(envs), True
        else:
            raise TypeError(f"envs={envs!r} is invalid; allowed: a WorldModelVectorEnv or a non-empty list of "
                            "RemoteWorldModelEnv")
        self.images = [ImageObservation(env, frames) for env in self.envs]  # one definition of the image
        self._pool = ThreadPoolExecutor(len(self.envs), "worldstep-sb3") if self.remote else None
        self._actions: np.ndarray | None = None
        super().__init__(len(self.envs), self.images[0].observation_space, self.envs[0].action_space)

    @classmethod
    def local(cls, model: Any = "tiny", num_envs: int = 1, frames: Literal["last", "stack"] = "stack",
              **env_kwargs: Any) -> WorldModelVecEnv:
        """N episodes of one model loaded in this process (``worldstep.load``'s ``model``, or a ``World``)."""
        from .world import make_vec_env

        return cls(make_vec_env(model, num_envs, **env_kwargs), frames)

    @classmethod
    def remote(cls, url: str, num_envs: int = 1, token: str | None = None,
               frames: Literal["last", "stack"] = "stack", **env_kwargs: Any) -> WorldModelVecEnv:
        """N sessions of a ``worldstep serve`` process; no model is loaded here."""
        from .serve.client import RemoteWorldModelEnv

        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r} is invalid; allowed: an int >= 1")
        envs: list[RemoteWorldModelEnv] = []
        try:
            for _ in range(num_envs):
                envs.append(RemoteWorldModelEnv(url, token, **env_kwargs))
        except BaseException:
            for env in envs:
                env.close()
            raise
        return cls(envs, frames)

    # --- the VecEnv API --------------------------------------------------------------------------

    def reset(self):
        observations = []
        for i, env in enumerate(self.envs):
            options = {"options": self._options[i]} if self._options[i] else {}
            obs, self.reset_infos[i] = env.reset(seed=self._seeds[i], **options)
            observations.append(self.images[i].observation(obs))
        self._reset_seeds()
        self._reset_options()
        return np.stack(observations)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=np.float32)

    def step_wait(self):
        actions, self._actions = self._actions, None
        if actions is None:
            raise RuntimeError("step_wait() without step_async(actions); call step(actions)")
        if self.remote:
            outcomes = list(self._pool.map(_step_or_error, self.envs, actions))
        else:
            outcomes = step_batch(self.envs, list(actions))  # ONE engine call for every sub-environment
        observations, rewards, dones, infos = [], np.zeros(self.num_envs, np.float32), np.zeros(self.num_envs, bool), []
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, Exception):
                raise outcome
            obs, rewards[i], terminated, truncated, info = outcome
            image = self.images[i].observation(obs)
            info = dict(info, **{"TimeLimit.truncated": bool(truncated and not terminated)})
            dones[i] = terminated or truncated
            if dones[i]:
                info["terminal_observation"] = image
                obs, self.reset_infos[i] = self.envs[i].reset()
                image = self.images[i].observation(obs)
            observations.append(image)
            infos.append(info)
        return np.stack(observations), rewards, dones, infos

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.vector_env is not None:
            self.vector_env.close()
        else:
            for env in self.envs:
                env.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [env.render() for env in self.envs]

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        return [self.envs[i].get_wrapper_attr(attr_name) for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        for i in self._get_indices(indices):
            self.envs[i].set_wrapper_attr(attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        return [self.envs[i].get_wrapper_attr(method_name)(*method_args, **method_kwargs)
                for i in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices=None) -> list[bool]:
        return [isinstance(self.images[i], wrapper_class) for i in self._get_indices(indices)]


def _step_or_error(env: Any, actions: np.ndarray) -> tuple | Exception:
    try:
        return env.step(actions)
    except Exception as err:
        return err
