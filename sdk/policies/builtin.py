"""The policy protocol and the built-in policies: observation in, one window's action chunk
``(chunk_size, action_width)`` out.

A policy is anything with ``__call__(obs) -> actions`` and ``reset(seed=None)`` (:class:`Policy`); a plain
function ``obs -> actions`` is one too (:func:`as_policy` wraps it in a :class:`FunctionPolicy`). The adapters
here cover the common cases: a per-step function queried ``chunk_size`` times per window (:class:`PerStepPolicy`),
recorded actions (:class:`ReplayPolicy`), seeded noise (:class:`RandomPolicy`) and smooth scripted motion
(:class:`SinePolicy`). Build each from the env's action space (a vector env's ``single_action_space``) or a
``(chunk_size, action_width)`` tuple.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from gymnasium import spaces
from worldstep.envs.push_policies import PixelPushPolicy

from .user import is_user_spec, load_user_policy

__all__ = ["FunctionPolicy", "PerStepPolicy", "Policy", "RandomPolicy", "ReplayPolicy", "SinePolicy", "as_policy",
           "make_policy"]


@runtime_checkable
class Policy(Protocol):
    """Maps an observation (``{"frames": (chunk, H, W, 3) uint8}``) to actions ``(chunk_size, action_width)``."""

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (a seeded policy reseeds when ``seed`` is given)."""

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The next window's actions, float32 in [-1, 1]."""


class FunctionPolicy:
    """A plain function ``obs -> actions`` as a policy: ``reset`` calls ``fn.reset(seed)`` when ``fn`` has one."""

    def __init__(self, fn: Callable[[dict[str, np.ndarray]], Any]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__qualname__", type(fn).__name__)

    def reset(self, seed: int | None = None) -> None:
        reset = getattr(self.fn, "reset", None)
        if callable(reset):
            reset(seed)

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return self.fn(obs)


def as_policy(policy: Any, name: str = "policy") -> Policy:
    """``policy`` as a :class:`Policy`: a policy object as it is, a plain callable ``obs -> actions`` wrapped in a
    :class:`FunctionPolicy`; anything else is a ``TypeError`` before any episode runs."""
    if isinstance(policy, type) or not callable(policy):
        raise TypeError(f"{name}={policy!r} is invalid; allowed: a policy (an object with __call__(obs) -> actions "
                        "and reset(seed=None)) or a plain callable obs -> actions (chunk_size, action_width)")
    if callable(getattr(policy, "reset", None)):
        return policy
    return FunctionPolicy(policy)


def chunk_shape(action_space: spaces.Box | tuple[int, int]) -> tuple[int, int]:
    """The ``(chunk_size, action_width)`` of an action space (or of such a tuple), checked."""
    shape = action_space.shape if isinstance(action_space, spaces.Box) else action_space
    if not (isinstance(shape, tuple) and len(shape) == 2 and all(isinstance(n, int) and n >= 1 for n in shape)):
        raise ValueError(f"action_space={action_space!r} is invalid; allowed: a Box or a tuple "
                         "(chunk_size, action_width) of positive ints")
    return shape


class RandomPolicy:
    """Uniform actions in [-1, 1] from a seeded generator (``reset(seed)`` reseeds)."""

    def __init__(self, action_space: spaces.Box | tuple[int, int], seed: int | None = None) -> None:
        self.shape = chunk_shape(action_space)
        self.rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return self.rng.uniform(-1.0, 1.0, self.shape).astype(np.float32)


class SinePolicy:
    """Smooth scripted motion: dimension ``d`` follows ``amplitude * sin(2 pi (t / period + d / width))``.

    ``t`` counts frames since ``reset()``, so consecutive windows join smoothly.
    """

    def __init__(self, action_space: spaces.Box | tuple[int, int], period: float = 48.0,
                 amplitude: float = 0.8) -> None:
        self.shape = chunk_shape(action_space)
        if not period > 0:
            raise ValueError(f"period={period!r} is invalid; allowed: a number of frames > 0")
        if not 0 <= amplitude <= 1:
            raise ValueError(f"amplitude={amplitude!r} is invalid; allowed: [0, 1]")
        self.period, self.amplitude = float(period), float(amplitude)
        self.t = 0

    def reset(self, seed: int | None = None) -> None:
        self.t = 0

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        chunk, width = self.shape
        frames = self.t + np.arange(chunk)[:, None]
        phase = np.arange(width)[None, :] / width
        self.t += chunk
        return (self.amplitude * np.sin(2 * np.pi * (frames / self.period + phase))).astype(np.float32)


class ReplayPolicy:
    """Recorded actions from a ``.npy`` file (or array): ``(windows, chunk, width)`` or ``(steps, width)``.

    ``steps`` must be a multiple of ``chunk_size`` and ``width`` must equal the env's ``action_width``.
    Each call returns the next window; ``reset()`` rewinds. Asking past the end raises ``IndexError``.
    """

    def __init__(self, actions: str | os.PathLike | np.ndarray, action_space: spaces.Box | tuple[int, int]) -> None:
        chunk, width = self.shape = chunk_shape(action_space)
        source = actions
        if isinstance(actions, (str, os.PathLike)):
            if not Path(actions).is_file():
                raise FileNotFoundError(f"replay actions file {str(actions)!r} does not exist")
            actions = np.load(actions)
        actions = np.asarray(actions)
        if actions.dtype.kind not in "fiu":
            raise ValueError(f"replay actions dtype {actions.dtype} is invalid; allowed: float")
        if actions.ndim == 2 and actions.shape[0] % chunk == 0 and actions.shape[0]:
            actions = actions.reshape(-1, chunk, actions.shape[1])
        if actions.ndim != 3 or actions.shape[1:] != (chunk, width) or not len(actions):
            raise ValueError(f"replay actions shape {actions.shape} from "
                             f"{source if isinstance(source, str) else 'array'} "
                             f"is invalid; allowed: (windows, {chunk}, {width}) or (steps, {width}) with steps a "
                             f"positive multiple of {chunk}")
        if not np.all(np.isfinite(actions)) or actions.min() < -1 or actions.max() > 1:
            raise ValueError("replay actions are invalid; allowed: finite values in [-1, 1]")
        self.actions = actions.astype(np.float32)
        self.index = 0

    @property
    def num_windows(self) -> int:
        return len(self.actions)

    def reset(self, seed: int | None = None) -> None:
        self.index = 0

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        if self.index >= len(self.actions):
            raise IndexError(f"ReplayPolicy has {len(self.actions)} windows; window {self.index} was asked for")
        self.index += 1
        return self.actions[self.index - 1].copy()


class PerStepPolicy:
    """A per-step policy (LeRobot-style ``select_action``) queried ``chunk_size`` times per window.

    ``fn(frame)`` takes the latest frame ``(H, W, 3)`` uint8 and returns one action ``(action_width,)``.
    The world model produces a window's frames only after all its actions are chosen, so every query of a
    window sees the same latest frame (open-loop within a chunk, like action chunking); a stateful ``fn``
    can still advance per call. ``fn.reset()`` is called on ``reset`` when it exists.
    """

    def __init__(self, fn: Callable[[np.ndarray], Any], action_space: spaces.Box | tuple[int, int]) -> None:
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is invalid; allowed: a callable frame -> action")
        self.fn = fn
        self.shape = chunk_shape(action_space)

    def reset(self, seed: int | None = None) -> None:
        reset = getattr(self.fn, "reset", None)
        if callable(reset):
            reset()

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        chunk, width = self.shape
        frame = obs["frames"][-1]
        rows = [np.asarray(self.fn(frame), dtype=np.float32) for _ in range(chunk)]
        for i, row in enumerate(rows):
            if row.shape != (width,):
                raise ValueError(f"PerStepPolicy fn returned shape {row.shape} at step {i}; allowed: ({width},)")
        return np.stack(rows)


POLICY_NAMES = ("sine", "random", "push", "replay:PATH", "module:attr", "path/to/file.py:attr")


def check_policy_spec(spec: str) -> None:
    """Refuse a ``--policy`` that names no policy, before the config or torch is loaded (a typo costs no wait)."""
    named = spec in ("sine", "random", "push") or (spec.startswith("replay:") and len(spec) > len("replay:"))
    if not (named or is_user_spec(spec)):
        raise ValueError(f"policy={spec!r} is invalid; allowed: one of {POLICY_NAMES}")


def make_policy(spec: str, action_space: spaces.Box | tuple[int, int], seed: int | None = None) -> Policy:
    """A policy from a short spec (what the CLI's ``--policy`` takes): ``sine``, ``random``, ``replay:PATH``, or
    ``push`` (the PushSim expert acting from pixels: it finds effector, block and goal by colour in the latest
    frame, so it drives the simulator and a pusher world model alike; actions ``(chunk, 2)``), or a user's own
    policy, ``module:attr`` or ``path/to/file.py:attr`` (:func:`worldstep.policies.user.load_user_policy`)."""
    if spec == "sine":
        return SinePolicy(action_space)
    if spec == "random":
        return RandomPolicy(action_space, seed=seed)
    if spec == "push":
        shape = chunk_shape(action_space)
        if shape[1] != 2:
            raise ValueError(f"policy='push' needs actions (chunk, 2); the env's action shape is {shape}")
        return PixelPushPolicy(0.0, chunk_size=shape[0], name="push")
    if spec.startswith("replay:") and len(spec) > len("replay:"):
        return ReplayPolicy(spec[len("replay:") :], action_space)
    check_policy_spec(spec)
    return as_policy(load_user_policy(spec, chunk_shape(action_space)), name=f"--policy {spec}")
