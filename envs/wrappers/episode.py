"""What gymnasium puts in wrappers around a world-model env: raw actions, success and reward, the window limit.

Each wrapper's step is split in two halves around the inner step (``SplitStep``): ``step_in`` maps the action
down, ``step_out`` maps the outcome back up. ``WorldModelEnv.step`` runs one window; the batched steppers
(``worldstep.envs.batched``) run the halves of every env's wrappers around ONE engine call, so a vector env,
the server and SB3 report exactly what each wrapped env reports alone, from the same wrapper code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec
from worldstep.engine.checks import check_callable, check_int
from worldstep.engine.embodiment.action_normalizer import ActionNormalizer

SUCCESS_MODES = ("sim", "none")


class SplitStep(gym.Wrapper):
    """A wrapper whose ``step`` is ``step_out(env.step(step_in(action)))``, so many envs can share one engine
    call between the halves. ``step_in`` returns the inner action and what ``step_out`` needs of this step.

    The outermost ``SplitStep`` of a chain checks the env's live episode once, before any ``step_in`` reads the
    actions (ResetNeeded first, as the batched steppers and gymnasium's ``OrderEnforcing`` do); the layers
    below it and the env take that episode as given (``step_live``)."""

    def step_in(self, action: Any) -> tuple[Any, Any]:
        return action, None

    def step_out(self, outcome: tuple, action: Any, carry: Any) -> tuple:
        return outcome

    def step(self, action: Any):
        live_episode = getattr(self.env.unwrapped, "live_episode", None)  # any gymnasium env may be wrapped
        return self.step_live(action, None if live_episode is None else live_episode())

    def step_live(self, action: Any, episode: Any) -> tuple:
        """This layer's step on ``episode``, which the outermost layer checked (None: not a worldstep env)."""
        inner, carry = self.step_in(action)
        return self.step_out(step_below(self.env, inner, episode), action, carry)


def step_below(env: gym.Env, action: Any, episode: Any) -> tuple:
    """``env``'s step on an episode already checked: a ``SplitStep``'s or the env's ``step_live``; any other
    wrapper's ``step`` (the ``SplitStep`` below it checks again)."""
    if isinstance(env, SplitStep):
        return env.step_live(action, episode)
    if episode is not None and not isinstance(env, gym.Wrapper):
        return env.step_live(action, episode)
    return env.step(action)


class NormalizeActions(SplitStep):
    """Raw actions in, the model's normalised actions to the env: ``action_normalizer`` maps every step's actions.

    The action space is the raw one: the stats' range (unbounded when the stats give none). Raw values outside
    it raise an ``ActionRangeWarning`` and pass through unclipped, as in training (``clip=True`` clips), so the
    env's engine no longer holds the model's actions to ``[-1, 1]``. ``info`` gains ``actions_outside_stats`` and
    ``actions_clipped`` (counts over the window's values).
    """

    def __init__(self, env: gym.Env, action_normalizer: ActionNormalizer) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        if not isinstance(action_normalizer, ActionNormalizer):
            raise ValueError(f"action_normalizer={action_normalizer!r} is invalid; allowed: an ActionNormalizer or "
                             "None")
        chunk, width = env.action_space.shape
        if action_normalizer.width is not None and action_normalizer.width != width:
            raise ValueError(f"action_normalizer width={action_normalizer.width} is invalid; allowed: {width} (the "
                             "actions' width)")
        super().__init__(env)
        self.normalizer = action_normalizer
        bounds = action_normalizer.range()
        if bounds is None:
            self.action_space = spaces.Box(-np.inf, np.inf, (chunk, width), np.float32)
        else:
            low, high = (np.broadcast_to(b, (chunk, width)).astype(np.float32) for b in bounds)
            self.action_space = spaces.Box(low, high, (chunk, width), np.float32)
        set_action_bounds = getattr(env.unwrapped, "set_action_bounds", None)  # any gymnasium env may be wrapped
        if set_action_bounds is not None:
            set_action_bounds(None)  # normalised values may leave [-1, 1], as in training

    def step_in(self, action: Any) -> tuple[Any, dict[str, int]]:
        result = self.normalizer(action)
        return result.actions, result.info()

    def step_out(self, outcome: tuple, action: Any, carry: dict[str, int]) -> tuple:
        obs, reward, terminated, truncated, info = outcome
        if not info.get("kv_exhausted", False):
            info = {**info, **carry}
        return obs, reward, terminated, truncated, info


class JudgeSuccess(SplitStep):
    """Success, termination and reward of each window.

    ``success_fn``: ``frames -> bool``; ``"sim"``: the env's simulator's pixel judge
    (``success_from_frames(first_frame, frames)``, the goal read from the episode's first image); ``"none"``:
    never successful; None: ``"sim"`` when the env's simulator has a judge, else ``"none"``. A successful window
    terminates the episode and sets ``info["is_success"]``. The reward is ``reward_fn(frames, actions)`` (the
    actions this wrapper was given) when one is given, else 1.0 for a successful window and 0.0 else. A window
    the KV pool could not hold (``info["kv_exhausted"]``) is not judged: 0.0, not successful.

    An env with ``observation="latents"`` has no frames per step: ``success_fn`` and ``reward_fn`` get the window's
    ``latents`` instead, ``"sim"`` (a pixel judge) is refused and None means ``"none"``.
    """

    def __init__(self, env: gym.Env, success_fn: Callable[[np.ndarray], bool] | Literal["sim", "none"] | None = None,
                 reward_fn: Callable[[np.ndarray, np.ndarray], float] | None = None) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        self.key = "latents" if getattr(env.unwrapped, "observation_mode", "frames") == "latents" else "frames"
        judge = getattr(env.unwrapped, "simulator_judge", None)
        judge = judge() if callable(judge) and self.key == "frames" else None
        if success_fn is None:
            success_fn = "sim" if judge is not None else "none"
        if isinstance(success_fn, str):
            if success_fn not in SUCCESS_MODES:
                raise ValueError(f"success_fn={success_fn!r} is invalid; allowed: a callable {self.key} -> bool, "
                                 "'sim' or 'none'")
            if success_fn == "sim" and self.key == "latents":
                raise ValueError("success_fn='sim' is invalid with observation='latents': the simulator judges "
                                 "pixels, which a latent step does not decode; allowed: a callable latents -> bool "
                                 "or 'none'")
            if success_fn == "sim" and judge is None:
                simulator = getattr(env.unwrapped, "simulator", None)
                raise ValueError(f"success_fn='sim' is invalid with simulator={simulator!r}; allowed: a simulator "
                                 "with success_from_frames (e.g. 'worldstep/PushSim-v0')")
        else:
            check_callable("success_fn", success_fn)
        self.reward_fn = check_callable("reward_fn", reward_fn)
        super().__init__(env)
        self.success_fn = None if isinstance(success_fn, str) else success_fn
        self.simulator_judge = judge if success_fn == "sim" else None

    @property
    def judges(self) -> bool:
        """Whether a window can be judged a success here, and so end the episode (False for ``"none"``)."""
        return self.simulator_judge is not None or self.success_fn is not None

    def is_success(self, frames: np.ndarray) -> bool:
        if self.simulator_judge is not None:
            return bool(self.simulator_judge(self.env.unwrapped.first_image, frames))
        return bool(self.success_fn(frames)) if self.success_fn is not None else False

    def step_out(self, outcome: tuple, action: Any, carry: None) -> tuple:
        obs, reward, terminated, truncated, info = outcome
        if info.get("kv_exhausted", False):
            return obs, 0.0, False, truncated, {**info, "is_success": False}
        frames = obs[self.key]  # the window's latents in latent mode
        is_success = self.is_success(frames)
        if self.reward_fn is not None:
            reward = float(self.reward_fn(frames, np.asarray(action, dtype=np.float32)))
        else:
            reward = float(is_success)
        return obs, reward, terminated or is_success, truncated, {**info, "is_success": is_success}


class WindowLimit(SplitStep):
    """Truncates after ``max_windows`` windows (one step is one window), as gymnasium's ``TimeLimit`` does after
    ``max_episode_steps`` steps, but counted in ``step_out``, which the batched steppers call too.

    ``max_windows`` is settable (applies from the next window on); ``elapsed_windows`` is this episode's count
    (0 after a reset). Forks through ``fork_env`` carry the count. ``spec.max_episode_steps`` is ``max_windows``,
    as ``TimeLimit`` reports its limit.
    """

    def __init__(self, env: gym.Env, max_windows: int) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        max_windows = check_int("max_windows", max_windows, 1)
        super().__init__(env)
        self._max_windows = max_windows
        self.elapsed_windows = 0

    @property
    def max_windows(self) -> int:
        return self._max_windows

    @max_windows.setter
    def max_windows(self, value: int) -> None:
        self._max_windows = check_int("max_windows", value, 1)

    @property
    def spec(self) -> EnvSpec | None:
        spec = self.env.spec
        return None if spec is None else dataclasses.replace(spec, max_episode_steps=self._max_windows)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.elapsed_windows = 0
        return super().reset(seed=seed, options=options)

    def step_out(self, outcome: tuple, action: Any, carry: None) -> tuple:
        obs, reward, terminated, truncated, info = outcome
        self.elapsed_windows += 1
        return obs, reward, terminated, truncated or self.elapsed_windows >= self._max_windows, info
