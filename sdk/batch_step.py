"""Step many world-model envs of one model through ONE engine call, each keeping its own episode.

`WorldModelVectorEnv` does this for its own sub-environments; the server (clients' envs, batched across
connections) and the SB3 ``VecEnv`` (same-step autoreset) need it for envs they hold themselves. The steps
are the ones ``WorldModelEnv.step`` makes, so every env reports exactly what it would report alone, within the
batched-GEMM rounding bound of docs/exactness.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from worldstep.engine.kv import KVPoolExhausted

__all__ = ["step_envs"]

Outcome = tuple  # (obs, reward, terminated, truncated, info)


def step_envs(envs: Sequence[Any], actions: Sequence[np.ndarray]) -> list[Outcome | Exception]:
    """Each env's ``step(actions[i])`` outcome, or the exception its own step raises, from one ``model.step``.

    Every env must be a ``WorldModelEnv`` of the same loaded model, each at most once. An env without a live
    episode gets the error ``env.step`` raises (``ResetNeeded``, ``ClosedEnvironmentError``) and stays out of
    the call. When the engine refuses the batch for a bad row (``ValueError``, raised before any work) each env
    is stepped on its own, so only the env at fault gets the error; when the pool cannot hold every window
    (``KVPoolExhausted``) the envs whose sessions it closed end by truncation and the others step alone, as in
    ``WorldModelVectorEnv``.
    """
    if len(envs) != len(actions):
        raise ValueError(f"len(actions)={len(actions)} is invalid; allowed: {len(envs)} (one per env)")
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("envs holds one env twice; allowed: distinct envs (one window per env per call)")
    out: list[Outcome | Exception | None] = [None] * len(envs)
    live, prepared = {}, {}
    for i, env in enumerate(envs):
        try:
            live[i] = env.live_episode()
            prepared[i] = env.rules.model_actions(actions[i])  # raw -> model actions (the normaliser)
        except (gym.error.Error, ValueError, TypeError) as err:
            out[i] = err
            live.pop(i, None)
    if live:
        model = envs[next(iter(live))].model
        try:
            results = model.step([e.session for e in live.values()], [prepared[i][0] for i in live])
        except KVPoolExhausted:  # a failed commit closed its group's sessions: those end as exhausted
            for i, episode in live.items():
                out[i] = _step_alone(envs[i], actions[i]) if episode.live else episode.exhausted()
        except (ValueError, TypeError):  # a bad row, refused before any window ran: one by one
            for i in live:
                out[i] = _step_alone(envs[i], actions[i])
        else:
            for (i, episode), result in zip(live.items(), results):
                out[i] = episode.outcome(result, np.asarray(actions[i], np.float32), prepared[i][1])
    return out  # type: ignore[return-value]


def _step_alone(env: Any, actions: np.ndarray) -> Outcome | Exception:
    try:
        return env.step(actions)
    except (gym.error.Error, ValueError, TypeError) as err:
        return err
