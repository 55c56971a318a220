"""Step many wrapped world-model envs of one model through ONE engine call, each keeping its own episode.

Each env is a ``WorldModelEnv`` inside ``SplitStep`` wrappers (what ``worldstep.make_env`` builds). The first
halves of every env's wrappers run outermost first, the engine steps every session at once, and each window's
outcome goes back up through the second halves: the code ``env.step`` runs, so every env reports what it would
report alone (within the batched-GEMM rounding bound of docs/exactness.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from .episode import Episode
from .outcomes import Outcome, step_episodes
from .world_model_env import WorldModelEnv
from .wrappers.episode import SplitStep


@dataclass
class Pending:
    """One env's step between the halves: its wrappers with what each was given and keeps, its episode and the
    actions the engine gets."""

    layers: list[tuple[SplitStep, Any, Any]]  # (wrapper, its action, its carry), outermost first
    episode: Episode
    actions: Any

    def finish(self, outcome: Outcome) -> Outcome:
        for wrapper, action, carry in reversed(self.layers):
            outcome = wrapper.step_out(outcome, action, carry)
        return outcome


def split_env(env: gym.Env) -> tuple[list[SplitStep], WorldModelEnv]:
    """``env``'s wrappers (outermost first) and the ``WorldModelEnv`` inside; TypeError naming a wrapper whose
    step cannot be split."""
    wrappers, inner = [], env
    while isinstance(inner, gym.Wrapper):
        if not isinstance(inner, SplitStep):
            raise TypeError(f"env wrapper {type(inner).__name__} cannot be stepped in a batch; allowed: a "
                            "WorldModelEnv inside NormalizeActions, JudgeSuccess and WindowLimit wrappers")
        wrappers.append(inner)
        inner = inner.env
    if not isinstance(inner, WorldModelEnv):
        raise TypeError(f"env={env!r} is invalid; allowed: a (wrapped) WorldModelEnv")
    return wrappers, inner


def prepare(env: gym.Env, action: Any) -> Pending:
    """The first halves of ``env``'s wrappers on ``action``, and its live episode read once (a ``close()`` in
    another thread cannot pull it away before the engine call). Nothing changes: ``step_in`` keeps no state."""
    wrappers, base = split_env(env)
    episode = base.live_episode()
    layers = []
    for wrapper in wrappers:
        inner, carry = wrapper.step_in(action)
        layers.append((wrapper, action, carry))
        action = inner
    return Pending(layers, episode, action)


def step_batch(envs: Sequence[gym.Env], actions: Sequence[Any]) -> list[Outcome | Exception]:
    """Each env's ``step(actions[i])`` outcome, or the exception its own step raises, from one ``model.step``: the
    entry point for envs a caller holds itself (the server's clients' envs, the SB3 ``VecEnv``).

    Every env must be a ``worldstep.make_env`` env (a ``WorldModelEnv`` in its wrappers) of the same loaded
    model, each at most once. An env without a live episode gets the error ``env.step`` raises (``ResetNeeded``,
    ``ClosedEnvironmentError``) and stays out of the call. When the engine refuses the batch for a bad row
    (``ValueError``, raised before any work) each env is stepped on its own, so only the env at fault gets the
    error; when the pool cannot hold every window (``KVPoolExhausted``) the envs whose sessions it closed end by
    truncation and the others step alone, as in ``WorldModelVectorEnv``.
    """
    if len(envs) != len(actions):
        raise ValueError(f"len(actions)={len(actions)} is invalid; allowed: {len(envs)} (one per env)")
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("envs holds one env twice; allowed: distinct envs (one window per env per call)")
    out: dict[int, Outcome | Exception] = {}
    pending: dict[int, Pending] = {}
    for i, env in enumerate(envs):
        try:
            pending[i] = prepare(env, actions[i])
        except (gym.error.Error, ValueError, TypeError) as err:
            out[i] = err
    out.update(step_prepared(envs, actions, pending, strict=False))
    return [out[i] for i in range(len(envs))]


def step_prepared(envs: Sequence[gym.Env], actions: Sequence[Any], pending: dict[int, Pending], *,
                  strict: bool) -> dict[int, Outcome | Exception]:
    """The outcomes of the ``prepare``d envs (``pending[i]`` of ``envs[i]``) from one ``model.step``.

    ``strict`` (a vector env): a row the engine refuses (``ValueError``, ``TypeError``) or a session closed under
    the step (``ClosedEnvironmentError``) is raised. Otherwise (envs of different clients, ``step_batch``) each
    env goes through its own ``step`` and the env at fault gets its error in its place. The engine's outcomes
    map to gymnasium's in ``outcomes.step_episodes``: when the batch fails, the envs it left open step alone."""
    if not pending:
        return {}
    try:
        outcomes = step_episodes([p.episode for p in pending.values()], [p.actions for p in pending.values()])
    except (ValueError, TypeError):  # a bad row, refused before any window ran
        if strict:
            raise
        return {i: _step_alone(envs[i], actions[i], strict) for i in pending}
    closed = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    if strict and closed:  # raised before any other row steps alone, so the vector env's rows stay in step
        raise closed[0]
    out: dict[int, Outcome | Exception] = {}
    for (i, p), outcome in zip(pending.items(), outcomes):
        if outcome is None:  # the batch failed, this episode is still open: it steps on its own
            out[i] = _step_alone(envs[i], actions[i], strict)
        else:  # a window, a truncation, or the ClosedEnvironmentError of a session closed under the step
            out[i] = outcome if isinstance(outcome, Exception) else p.finish(outcome)
    return out


def _step_alone(env: gym.Env, actions: Any, strict: bool) -> Outcome | Exception:
    try:
        return env.step(actions)
    except (gym.error.Error, ValueError, TypeError) as err:
        if strict:
            raise
        return err
