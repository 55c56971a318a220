"""One mapping from an engine step to gymnasium's outcomes (``envs/outcomes.py``), on every path that steps an
episode: the env, the vector env, ``step_batch`` (the SB3 ``VecEnv``'s and the server's batches) and a remote env.
A session closed under the step is gymnasium's ``ClosedEnvironmentError`` on each (the server's batched path once
answered it as an internal failure, and ``step_batch`` let the engine's ``SessionClosedError`` out), and the envs
it did not touch still step. The info keys holding the engine's records are one list, read by the vector env and
the wire alike."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from test_serve import TOKEN, serve  # noqa: F401 - fixture
from tiny_world import cache_dir, world, zeros  # noqa: F401 - fixtures
from worldstep.envs.batched import step_batch
from worldstep.envs.info import RECORD_KEYS, flat_records, records_from
from worldstep.serve import RemoteWorldModelEnv


@pytest.fixture
def closing_step(world, monkeypatch):  # noqa: F811
    """``model.step`` that first closes the sessions at the given rows, as a ``close()`` from another thread that
    lands while the step waits for their window locks (the engine then raises ``SessionClosedError``)."""
    rows: list[int] = []
    step = world.model.step

    def closing(sessions, actions, **kwargs):
        for i in rows:
            if i < len(sessions):
                world.model.close(sessions[i])
        rows.clear()  # once: the envs it left open step again alone
        return step(sessions, actions, **kwargs)

    monkeypatch.setattr(world.model, "step", closing)
    return rows


def test_the_env_raises_gymnasiums_error(world, closing_step):  # noqa: F811
    env = worldstep.make_env(world)
    env.reset(seed=0)
    closing_step.append(0)
    with pytest.raises(gym.error.ClosedEnvironmentError, match="closed while step"):
        env.step(zeros(env.action_space))
    env.close()


def test_step_batch_returns_gymnasiums_error_and_steps_the_others(world, closing_step):  # noqa: F811
    envs = [worldstep.make_env(world) for _ in range(2)]
    for env in envs:
        env.reset(seed=0)
    closing_step.append(1)
    outcomes = step_batch(envs, [zeros(env.action_space) for env in envs])
    assert isinstance(outcomes[1], gym.error.ClosedEnvironmentError), outcomes[1]
    obs, _, terminated, truncated, info = outcomes[0]  # the open env stepped on its own
    assert info["window_index"] == 0 and not info["kv_exhausted"] and not terminated and not truncated
    assert obs["frames"].shape[0] > 0
    for env in envs:
        env.close()
    assert world.model.kv.num_used_pages == 0


def test_the_vector_env_raises_gymnasiums_error(world, closing_step):  # noqa: F811
    vec = worldstep.world.make_vec_env(world, num_envs=2)
    vec.reset(seed=0)
    closing_step.append(1)
    with pytest.raises(gym.error.ClosedEnvironmentError, match="closed while step"):
        vec.step(np.zeros(vec.action_space.shape, np.float32))
    assert vec.envs[0].unwrapped.episode.windows == 0  # raised before the open row stepped alone: rows stay in step
    vec.close()


def test_the_servers_batched_step_answers_gymnasiums_error(world, serve, closing_step):  # noqa: F811
    server = serve()
    env = RemoteWorldModelEnv(server.url, token=TOKEN)
    try:
        env.reset(seed=0)
        closing_step.append(0)
        with pytest.raises(gym.error.ClosedEnvironmentError, match="closed while step"):
            env.step(zeros(env.action_space))
        env.reset(seed=0)  # the client may start again, as with a local env
        env.step(zeros(env.action_space))
    finally:
        env.close()


def test_the_info_records_are_one_list_for_the_vector_env_and_the_wire(world):  # noqa: F811
    env = worldstep.make_env(world)
    env.reset(seed=0)
    info = env.step(zeros(env.action_space))[4]
    env.close()
    records = {k for k, v in info.items() if dataclasses.is_dataclass(v)}
    assert records == set(RECORD_KEYS)  # every record the env reports is in the list, and nothing else
    flat = flat_records(info)
    assert all(isinstance(flat[k], dict) for k in RECORD_KEYS)
    assert records_from(flat) == info
    vec = worldstep.world.make_vec_env(world, num_envs=2)
    vec.reset(seed=0)
    infos = vec.step(np.zeros(vec.action_space.shape, np.float32))[4]
    vec.close()
    assert all(isinstance(infos[k], dict) and set(flat[k]) <= set(infos[k]) for k in RECORD_KEYS)  # arrays per field
