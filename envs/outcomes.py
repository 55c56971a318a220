"""The one mapping from an engine step to gymnasium's outcomes, for every path that steps episodes: the env, the
vector env, and the batches of the server and the SB3 ``VecEnv`` (``batched``).

A window the model stepped is the episode's ``outcome``; a pool that cannot hold it (``KVPoolExhausted``) ends
the episode by truncation (``exhausted``); a session closed under the step (``SessionClosedError``, a ``close()``
from another thread) is gymnasium's ``ClosedEnvironmentError``. In a batch, an episode the failure left open gets
``None``: the caller steps it again on its own, so one env's failure is not its neighbours'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from worldstep.engine.kv import KVPoolExhausted
from worldstep.engine.session import SessionClosedError
from worldstep.envs.episode import Episode

Outcome = tuple  # (obs, reward, terminated, truncated, info)
CLOSED_WHILE_STEPPING = "the env was closed while step() ran; call reset() to start a new episode"


def step_episodes(episodes: Sequence[Episode], actions: Sequence[Any]) -> list[Outcome | gym.error.Error | None]:
    """One ``model.step`` over the episodes' sessions, and each episode's outcome in gymnasium's terms: the step's
    5-tuple, a ``ClosedEnvironmentError`` to raise in its env's place, or ``None`` (step it again alone).

    Every episode must be live and of one model; ``ValueError``/``TypeError`` for a refused row (before any work)
    pass through, as they are the caller's to place.
    """
    alone = len(episodes) == 1
    try:
        results = episodes[0].rules.model.step([e.session for e in episodes], list(actions))
    except KVPoolExhausted:  # a failed commit closed its group's sessions: those end by truncation
        return [e.exhausted() if alone or not e.live else None for e in episodes]
    except SessionClosedError as err:
        return [_closed(err) if alone or not e.live else None for e in episodes]
    return [e.outcome(result) for e, result in zip(episodes, results)]


def _closed(cause: SessionClosedError) -> gym.error.ClosedEnvironmentError:
    error = gym.error.ClosedEnvironmentError(CLOSED_WHILE_STEPPING)
    error.__cause__ = cause
    return error
