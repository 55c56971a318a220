"""Trust signals per window, for any world-model env: `info["trust"]`, a `TrustSignals` record.

A model's success is worth less past the windows it was trained on (`horizon`), when its frames depart from what
the commanded actions do (`consistency`, from a task's tracker), when other noise seeds of the same window do not
agree (`agreement`, from forks that share the past by reference) and when it has not held (`persistence`). The
wrapper measures what it is given the means for; a signal it cannot measure is None, never a made-up value.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from .trackers import Tracker

HORIZON_KEY = "trained_horizon_windows"  # in a checkpoint's worldstep.json: the windows its training clips cover


@dataclass(frozen=True)
class TrustSignals:
    """One window's signals (None: not measured). `window` counts from 1; `horizon` is `window` over the trained
    horizon (> 1 past it); `consistency` the tracker's residual (`PushTracker`: px, inf when the tracked object
    vanished; `InverseDynamicsTracker`: mean |inferred - commanded| action);
    `agreement` the share of forks whose judge agrees with this window's; `persistence` the windows success has
    held up to this one (0: not a success now)."""

    window: int
    horizon: float | None = None
    consistency: float | None = None
    agreement: float | None = None
    persistence: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trained_horizon_of(checkpoint: str | os.PathLike) -> int | None:
    """The trained horizon (windows) a checkpoint folder's `worldstep.json` records, or None; a recorded value that
    is no int >= 1 is a ValueError naming the file and key."""
    meta = Path(checkpoint) / "worldstep.json"
    value = json.loads(meta.read_text()).get(HORIZON_KEY) if meta.is_file() else None
    if value is not None:
        _check_positive_int(f"{meta}: {HORIZON_KEY}", value)
    return value


def trained_horizon_for(model: Any) -> int | None:
    """The trained horizon of `model`: a `World` or `WorldstepConfig` (its `model.trained_horizon` when set, else what
    its checkpoint's `worldstep.json` records, shipped `embedded:` weights included), a shipped config name or a
    .yaml (the same), or a checkpoint folder (its `worldstep.json`); None when none is known. Reads no weights."""
    from ..config import load_config

    config = getattr(model, "config", model)  # a World carries its config
    if isinstance(config, (str, os.PathLike)):
        if Path(config).is_dir():
            return trained_horizon_of(config)
        config = load_config(config)
    section = config.model
    if section.trained_horizon is not None:
        return section.trained_horizon
    folder = Path(section.checkpoint)
    if section.embedded_name is not None:
        from importlib.resources import files

        folder = Path(str(files("worldstep.configs") / "models" / section.embedded_name))  # shipped weights
    return trained_horizon_of(folder) if folder.is_dir() else None


def _check_positive_int(name: str, value: Any, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an int >= {low}")


class TrustSignalsWrapper(gym.Wrapper):
    """Adds `info["trust"]` to every step of a (made) world-model env.

    Args:
        env: a world-model env (forkable through `worldstep.envs.wrappers.fork_env` when `agreement_forks` > 0).
        trained_horizon: windows the model was trained on (`trained_horizon_of(checkpoint)`); None: no `horizon`.
        tracker: a `Tracker` (a task's `PushTracker`, or the model's `InverseDynamicsTracker`); None: no `consistency`.
        agreement_forks: K forks with other noise seeds stepped with the same actions each window (K extra
            windows of model work); 0: no `agreement`.
        seed: seeds the forks' noise seeds (with each reset's seed), so a rerun is repeatable.
    """

    def __init__(self, env: gym.Env, *, trained_horizon: int | None = None, tracker: Tracker | None = None,
                 agreement_forks: int = 0, seed: int = 0) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        if trained_horizon is not None:
            _check_positive_int("trained_horizon", trained_horizon)
        _check_positive_int("agreement_forks", agreement_forks, allow_zero=True)
        if tracker is not None and not callable(getattr(tracker, "residual", None)):
            raise ValueError(f"tracker={tracker!r} is invalid; allowed: None or an object with "
                             "residual(previous_frame, frames, actions)")
        super().__init__(env)
        self.trained_horizon, self.tracker, self.agreement_forks, self.seed = (trained_horizon, tracker,
                                                                               int(agreement_forks), seed)
        self._window, self._streak, self._previous = 0, 0, None
        self._fork_seeds = np.random.default_rng([seed])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:
            self._fork_seeds = np.random.default_rng([self.seed, seed])
        self._window, self._streak, self._previous = 0, 0, np.asarray(obs["frames"])[-1]
        return obs, info

    def step(self, action):
        forks = self._forks()
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
            fork_success = [f.step(action)[4].get("is_success") for f in forks]
        finally:
            for f in forks:
                f.close()
        self._window += 1
        success = info.get("is_success")
        self._streak = self._streak + 1 if success else 0
        frames = np.asarray(obs["frames"])
        consistency = None
        if self.tracker is not None and self._previous is not None and not info.get("kv_exhausted", False):
            consistency = self.tracker.residual(self._previous, frames, np.asarray(action))
        self._previous = frames[-1]
        agreement = None
        if forks and success is not None and all(s is not None for s in fork_success):
            agreement = float(np.mean([bool(s) == bool(success) for s in fork_success]))
        trust = TrustSignals(
            window=self._window,
            horizon=None if self.trained_horizon is None else self._window / self.trained_horizon,
            consistency=consistency, agreement=agreement,
            persistence=None if success is None else self._streak)
        return obs, reward, terminated, truncated, {**info, "trust": trust}

    def _forks(self) -> list:
        if not self.agreement_forks:
            return []
        from worldstep.envs.wrappers import fork_env

        forks = []
        try:
            for _ in range(self.agreement_forks):
                forks.append(fork_env(self.env, seed=int(self._fork_seeds.integers(2**31))))
        except BaseException:
            for f in forks:
                f.close()
            raise
        return forks
