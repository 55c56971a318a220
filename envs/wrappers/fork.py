"""``fork_env``: fork a wrapped world-model env inside copies of its wrappers (the fork shares the committed KV
pages), for planners and agreement checks."""

from __future__ import annotations

import copy

import gymnasium as gym

from ..camera_observation import MultiCameraObservation
from ..robot_state import RobotStateObservation
from .episode import JudgeSuccess, NormalizeActions, WindowLimit
from .image import ImageObservation

# Wrappers whose state is plain values, so a shallow copy continues the same episode (what make_env and gym.make
# add, plus the observation wrappers; the robot state's arrays are replaced, never written in place, on every step).
# Wrappers that own files or buffers (RecordRollout, RecordVideo) cannot be forked: two envs would write one video.
FORKABLE_WRAPPERS = (
    WindowLimit,
    JudgeSuccess,
    NormalizeActions,
    gym.wrappers.TimeLimit,
    gym.wrappers.OrderEnforcing,
    gym.wrappers.PassiveEnvChecker,
    ImageObservation,
    MultiCameraObservation,
    RobotStateObservation,
)


def fork_env(env: gym.Env, seed: int | None = None) -> gym.Env:
    """Fork a (wrapped) world-model env: ``env.unwrapped.fork(seed)`` inside copies of ``env``'s wrappers.

    ``make_env`` wraps the env (``WindowLimit``, ``JudgeSuccess``, ``NormalizeActions``) and ``gym.make`` adds
    ``TimeLimit``, ``OrderEnforcing`` and ``PassiveEnvChecker``, so ``env.fork`` is out of reach of the wrapper
    chain; this keeps the chain, with the step counts of ``WindowLimit`` and ``TimeLimit`` carried over. A
    wrapper outside ``FORKABLE_WRAPPERS`` raises ``TypeError`` naming it.
    """
    chain = []
    inner = env
    while isinstance(inner, gym.Wrapper):
        if not isinstance(inner, FORKABLE_WRAPPERS):
            raise TypeError(f"fork_env cannot copy wrapper {type(inner).__name__}; allowed: "
                            f"{', '.join(w.__name__ for w in FORKABLE_WRAPPERS)} (fork env.unwrapped and wrap it "
                            "again instead)")
        chain.append(inner)
        inner = inner.env
    fork = getattr(inner, "fork", None)
    if fork is None:
        raise TypeError(f"env={env!r} is invalid; allowed: a worldstep world-model env (with fork())")
    forked = fork(seed=seed)
    for wrapper in reversed(chain):
        outer = copy.copy(wrapper)
        outer.env = forked
        forked = outer
    return forked
