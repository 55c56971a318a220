"""PushSim's scripted policies: pusher policies of graded quality that act from pixels only.

They live beside the simulator (``push_sim.py``) because they are PushSim's task code: the product's ``push``
policy (``worldstep.policies``), the planner's tests and the fidelity and training studies all use them.

Each reads frames with `detect_objects` (goal latched from the episode's first frame), so the same
policy runs unchanged in the simulator and in the world model. Quality is graded four ways: seeded
Gaussian noise on the expert's plan, a slower expert, an expert that looks only every few windows,
and a greedy pusher that never walks around the block. `random` and `idle` are the floor policies
(`FLOOR`): they succeed almost never in either world, so they inflate any rank correlation they enter.
"""

from __future__ import annotations

import numpy as np
from worldstep.envs.push_sim import (
    BLOCK,
    EFFECTOR,
    SPEED,
    PushState,
    detect_objects,
    physics_step,
    push_oracle,
)

FLOOR = ("random", "idle")


class PixelPushPolicy:
    """The push expert planned on detected positions, plus `noise` std Gaussian noise per action.

    Within a window it rolls its own belief forward with the simulator's physics (open loop), since a
    world model returns frames only once per window. `speed` scales the expert's actions (a slow
    expert runs out of time on far goals); `look_every` k > 1 reads the frame only every k-th window
    and acts on its rolled-forward belief in between (stale perception).
    """

    def __init__(self, noise: float, chunk_size: int = 4, name: str | None = None, *, speed: float = 1.0,
                 look_every: int = 1) -> None:
        if noise < 0:
            raise ValueError(f"noise={noise!r} is invalid; allowed: >= 0")
        if not 0 < speed <= 1:
            raise ValueError(f"speed={speed!r} is invalid; allowed: (0, 1]")
        if not isinstance(look_every, int) or look_every < 1:
            raise ValueError(f"look_every={look_every!r} is invalid; allowed: an int >= 1")
        self.noise, self.chunk_size, self.speed, self.look_every = float(noise), chunk_size, float(speed), look_every
        self.name = name or f"oracle_noise{noise:g}"
        self.rng = np.random.default_rng(0)
        self.goal: np.ndarray | None = None
        self.belief: PushState | None = None
        self.calls = 0

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.goal, self.belief, self.calls = None, None, 0

    def _look(self, frame: np.ndarray) -> PushState | None:
        found = detect_objects(frame)
        if self.goal is None:
            self.goal = found["goal"]
        if found["effector"] is None or found["block"] is None or self.goal is None:
            return None
        return PushState(found["effector"], found["block"], np.asarray(self.goal))

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        if self.calls % self.look_every == 0 or self.belief is None:
            self.belief = self._look(obs["frames"][-1])
        self.calls += 1
        noise = self.rng.normal(size=(self.chunk_size, 2)) * self.noise
        plan = np.zeros((self.chunk_size, 2))
        state = self.belief
        if state is not None:
            for i in range(self.chunk_size):
                plan[i] = self.speed * push_oracle(state)
                state = physics_step(state, plan[i])
            self.belief = state
        return np.clip(plan + noise, -1, 1).astype(np.float32)


class GreedyPushPolicy:
    """Heads straight for the spot behind the block (on the line from the goal), then pushes along that
    line; never walks around the block, so an effector on the wrong side shoves it away first."""

    def __init__(self, chunk_size: int = 4, name: str = "greedy") -> None:
        self.chunk_size, self.name = chunk_size, name
        self.goal: np.ndarray | None = None

    def reset(self, seed: int | None = None) -> None:
        self.goal = None

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        found = detect_objects(obs["frames"][-1])
        if self.goal is None:
            self.goal = found["goal"]
        plan = np.zeros((self.chunk_size, 2))
        if found["effector"] is None or found["block"] is None or self.goal is None:
            return plan.astype(np.float32)
        state = PushState(found["effector"], found["block"], np.asarray(self.goal))
        for i in range(self.chunk_size):
            plan[i] = _greedy_action(state)
            state = physics_step(state, plan[i])
        return plan.astype(np.float32)


def _greedy_action(state: PushState) -> np.ndarray:
    to_goal = state.goal - state.block
    distance = float(np.linalg.norm(to_goal))
    if distance < 1.0:
        return np.zeros(2)
    direction = to_goal / distance
    behind = state.block - direction * ((EFFECTOR + BLOCK) / 2 + 1.0)
    if np.linalg.norm(behind - state.effector) > 2.0:
        return np.clip((behind - state.effector) / SPEED, -1, 1)
    return np.clip(direction * min(1.0, distance / SPEED), -1, 1)


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
    """Ten policies: eight graded ones, from the expert down to weak but purposeful pushers, then the two
    floor policies (`FLOOR`). Their simulator success over 16 windows on the validation range spreads
    from about 0.9 to 0.05 (chosen there, so that neighbours differ by more than a 50-episode rate's
    noise; `docs/fidelity` lists the measured rates)."""
    return [
        PixelPushPolicy(0.0, chunk_size, "expert"),
        PixelPushPolicy(0.4, chunk_size, "noisy0.4"),
        GreedyPushPolicy(chunk_size),
        PixelPushPolicy(0.5, chunk_size, "glance3_noisy0.5", look_every=3),
        PixelPushPolicy(0.8, chunk_size, "noisy0.8"),
        PixelPushPolicy(1.2, chunk_size, "noisy1.2"),
        PixelPushPolicy(0.0, chunk_size, "slow0.35", speed=0.35),
        PixelPushPolicy(2.0, chunk_size, "noisy2"),
        UniformPolicy(chunk_size),
        IdlePolicy(chunk_size),
    ]
