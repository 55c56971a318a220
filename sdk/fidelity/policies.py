"""Scripted pusher policies of graded quality that act from pixels only.

Each reads the last frame with `detect_objects` (goal latched from the episode's first frame), so the
same policy runs unchanged in the simulator and in the world model; noisy variants add seeded
Gaussian noise to an expert plan, which grades their quality.
"""

from __future__ import annotations

import numpy as np
from worldstep.envs.push_sim import PushState, detect_objects, physics_step, push_oracle


class PixelPushPolicy:
    """The push expert planned on detected positions, plus `noise` std Gaussian noise per action.

    Within a window it rolls its own belief forward with the simulator's physics (open loop), since a
    world model returns frames only once per window.
    """

    def __init__(self, noise: float, chunk_size: int = 4, name: str | None = None) -> None:
        if noise < 0:
            raise ValueError(f"noise={noise!r} is invalid; allowed: >= 0")
        self.noise, self.chunk_size = float(noise), chunk_size
        self.name = name or f"oracle_noise{noise:g}"
        self.rng = np.random.default_rng(0)
        self.goal: np.ndarray | None = None

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.goal = None

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        found = detect_objects(obs["frames"][-1])
        if self.goal is None:
            self.goal = found["goal"]
        noise = self.rng.normal(size=(self.chunk_size, 2)) * self.noise
        if found["effector"] is None or found["block"] is None or self.goal is None:
            plan = np.zeros((self.chunk_size, 2))
        else:
            state = PushState(found["effector"], found["block"], np.asarray(self.goal))
            plan = np.empty((self.chunk_size, 2))
            for i in range(self.chunk_size):
                plan[i] = push_oracle(state)
                state = physics_step(state, plan[i])
        return np.clip(plan + noise, -1, 1).astype(np.float32)


class UniformPolicy:
    """Uniform random actions in [-1, 1]."""

    def __init__(self, chunk_size: int = 4, name: str = "random") -> None:
        self.chunk_size, self.name = chunk_size, name
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return self.rng.uniform(-1, 1, size=(self.chunk_size, 2)).astype(np.float32)


class IdlePolicy:
    """Does nothing: a floor every other policy should beat (in the simulator and in the model)."""

    def __init__(self, chunk_size: int = 4, name: str = "idle") -> None:
        self.chunk_size, self.name = chunk_size, name

    def reset(self, seed: int | None = None) -> None:
        pass

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return np.zeros((self.chunk_size, 2), dtype=np.float32)


def graded_policies(chunk_size: int = 4) -> list:
    """Seven policies from expert to idle."""
    noisy = [PixelPushPolicy(n, chunk_size) for n in (0.0, 0.3, 0.6, 1.0, 2.0)]
    return [*noisy, UniformPolicy(chunk_size), IdlePolicy(chunk_size)]
