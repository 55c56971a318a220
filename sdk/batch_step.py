"""Step many world-model envs of one model through ONE engine call, each keeping its own episode.

`WorldModelVectorEnv` does this for its own sub-environments; the server (clients' envs, batched across
connections) and the SB3 ``VecEnv`` (same-step autoreset) need it for envs they hold themselves. The steps
are the ones each env's own ``step`` makes (``worldstep.envs.batched``), so every env reports exactly what it
would report alone, within the batched-GEMM rounding bound of docs/exactness.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from worldstep.envs.batched import Outcome, step_batch

__all__ = ["step_envs"]


def step_envs(envs: Sequence[Any], actions: Sequence[np.ndarray]) -> list[Outcome | Exception]:
    """Each env's ``step(actions[i])`` outcome, or the exception its own step raises, from one ``model.step``.

    Every env must be a ``worldstep.make_env`` env (a ``WorldModelEnv`` in its wrappers) of the same loaded
    model, each at most once. An env without a live episode gets the error ``env.step`` raises
    (``ResetNeeded``, ``ClosedEnvironmentError``) and stays out of the call. When the engine refuses the batch
    for a bad row (``ValueError``, raised before any work) each env is stepped on its own, so only the env at
    fault gets the error; when the pool cannot hold every window (``KVPoolExhausted``) the envs whose sessions
    it closed end by truncation and the others step alone, as in ``WorldModelVectorEnv``.
    """
    if len(envs) != len(actions):
        raise ValueError(f"len(actions)={len(actions)} is invalid; allowed: {len(envs)} (one per env)")
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("envs holds one env twice; allowed: distinct envs (one window per env per call)")
    return step_batch(envs, actions, strict=False)
