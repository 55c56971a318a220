"""Trust signals per sub-environment of a vector env, in gymnasium's vector info convention.

A batched rollout (`gym.make_vec`, `worldstep.make_vec_env`) needs the same signals as one env, per row:
`info["trust"]` is an object array of `TrustSignals` (None where a row has none this step) beside the `_trust`
mask, as the vector env groups every other info key. Each row is measured as `TrustSignalsWrapper` measures one
env; `agreement` is not offered here (it forks a session, and a batched session is forked per row elsewhere).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from worldstep.engine.checks import check_int

from .signals import TrustSignals
from .trackers import Tracker


class TrustSignalsVectorWrapper(gym.vector.VectorWrapper):
    """Adds `info["trust"]` and `info["_trust"]` to every step of a vector env of world models.

    Args:
        env: a vector env whose observations hold `frames` `[num_envs, T, H, W, 3]`, with autoreset mode
            NEXT_STEP (a row's reset step carries no signals) or DISABLED.
        trained_horizon: windows the model was trained on (`trained_horizon_for(model)`); None: no `horizon`.
        tracker: a task's `Tracker` (e.g. `PushTracker`); None: no `consistency`.
    """

    def __init__(self, env: gym.vector.VectorEnv, *, trained_horizon: int | None = None,
                 tracker: Tracker | None = None) -> None:
        if not isinstance(env, gym.vector.VectorEnv):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.vector.VectorEnv")
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if mode is AutoresetMode.SAME_STEP:
            raise ValueError(f"env autoreset_mode={mode!r} is invalid; allowed: NEXT_STEP or DISABLED (with SAME_STEP "
                             "a row's last frames arrive in final_obs, after its reset)")
        if trained_horizon is not None:
            check_int("trained_horizon", trained_horizon, 1)
        if tracker is not None and not callable(getattr(tracker, "residual", None)):
            raise ValueError(f"tracker={tracker!r} is invalid; allowed: None or an object with "
                             "residual(previous_frame, frames, actions)")
        super().__init__(env)
        self.trained_horizon, self.tracker = trained_horizon, tracker
        n = self.num_envs
        self._window, self._streak = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self._previous: list[np.ndarray | None] = [None] * n
        self._ended = np.zeros(n, dtype=np.bool_)  # the row's next step is its reset (NEXT_STEP)

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        obs, infos = self.env.reset(seed=seed, options=options)
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if isinstance(options, dict) and "reset_mask" in options:
            mask = np.asarray(options["reset_mask"], dtype=np.bool_)
        for i in np.flatnonzero(mask):
            self._restart(i, obs["frames"][i])
        return obs, infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        success = _row_values(infos, "is_success", self.num_envs)
        exhausted = _row_values(infos, "kv_exhausted", self.num_envs)
        for i in range(self.num_envs):
            if self._ended[i]:  # this step was the row's reset
                self._restart(i, obs["frames"][i])
                continue
            infos = self._add_info(infos, {"trust": self._signals(i, obs["frames"][i], actions[i], success[i],
                                                                   bool(exhausted[i]))}, i)
        self._ended = np.asarray(terminations) | np.asarray(truncations)
        return obs, rewards, terminations, truncations, infos

    def _restart(self, i: int, frames: np.ndarray) -> None:
        self._window[i], self._streak[i], self._ended[i] = 0, 0, False
        self._previous[i] = np.asarray(frames)[-1]

    def _signals(self, i: int, frames: np.ndarray, actions: np.ndarray, success: Any, exhausted: bool) -> TrustSignals:
        self._window[i] += 1
        self._streak[i] = self._streak[i] + 1 if success else 0
        frames = np.asarray(frames)
        consistency = None
        if self.tracker is not None and self._previous[i] is not None and not exhausted:
            consistency = self.tracker.residual(self._previous[i], frames, np.asarray(actions))
        self._previous[i] = frames[-1]
        window = int(self._window[i])
        return TrustSignals(window=window,
                            horizon=None if self.trained_horizon is None else window / self.trained_horizon,
                            consistency=consistency, persistence=None if success is None else int(self._streak[i]))


def _row_values(infos: dict[str, Any], key: str, n: int) -> list[Any]:
    """Per row, the value of info `key` where its `_key` mask is set, else None."""
    if key not in infos:
        return [None] * n
    mask = infos.get(f"_{key}", np.ones(n, dtype=np.bool_))
    return [bool(infos[key][i]) if mask[i] else None for i in range(n)]
