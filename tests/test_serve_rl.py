"""RL libraries stepping the batched engine: ``worldstep.sb3.WorldModelVecEnv`` (one engine call per step for all
N envs, locally and through a server), and SB3's ``SubprocVecEnv`` and torchrl's ``ParallelEnv`` with 4 worker
processes driving one server without loading the model (counted)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import stable_baselines3 as sb3
import worldstep
from serve_client import remote_image_env, remote_torchrl_env, serve_actions
from stable_baselines3.common.vec_env import SubprocVecEnv
from test_serve import TOKEN, engine_calls, serve  # noqa: F401 - fixtures
from tiny_world import assert_frames_match_batched, cache_dir, world  # noqa: F401 - fixtures
from worldstep.sb3 import WorldModelVecEnv


@pytest.fixture(scope="module")
def pusher(cache_dir):  # noqa: F811
    return worldstep.load("pusher", device="cpu")


def test_ppo_cnn_policy_trains_on_pusher_with_one_engine_call_per_step(pusher, monkeypatch):
    calls: list[int] = []
    step = pusher.model.step
    monkeypatch.setattr(pusher.model, "step", lambda s, a, **k: calls.append(len(s)) or step(s, a, **k))
    venv = WorldModelVecEnv.local(pusher, num_envs=4, max_windows=3)
    try:
        model = sb3.PPO("CnnPolicy", venv, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu", verbose=0)
        before = [p.detach().clone() for p in model.policy.parameters()]
        model.learn(total_timesteps=32)  # two rollouts of 4 steps x 4 envs, two updates
        assert model.num_timesteps == 32
        assert any(not np.array_equal(a.numpy(), b.detach().numpy()) for a, b in zip(before, model.policy.parameters()))
        assert calls == [4] * 8  # one engine call per vector step, all four episodes in it
    finally:
        venv.close()
    assert pusher.model.kv.allocator.num_used == 0


def test_vec_env_autoresets_in_the_same_step_like_sb3(world):  # noqa: F811
    venv = WorldModelVecEnv.local(world, num_envs=2, max_windows=2)
    try:
        venv.seed(3)
        first = venv.reset()
        assert first.shape == (2, *venv.observation_space.shape) and first.dtype == np.uint8
        zeros = np.zeros((2, *venv.action_space.shape), np.float32)
        _, _, dones, _ = venv.step(zeros)
        assert not dones.any()
        obs, rewards, dones, infos = venv.step(zeros)
        assert dones.all() and all(i["TimeLimit.truncated"] for i in infos)
        assert all(i["terminal_observation"].shape == venv.observation_space.shape for i in infos)
        assert not np.array_equal(obs[0], infos[0]["terminal_observation"])  # a fresh episode's first frames
    finally:
        venv.close()


def test_vec_env_frames_equal_single_envs(world):  # noqa: F811
    venv = WorldModelVecEnv.local(world, num_envs=2, max_windows=8, frames="last")
    try:
        venv.seed(7)
        venv.reset()
        actions = np.stack([serve_actions(venv.action_space.shape, k) for k in (0, 1)])
        got = venv.step(actions)[0]
    finally:
        venv.close()
    for i in range(2):
        env = worldstep.make_env(world, max_windows=8)
        env.reset(seed=7 + i)
        want = env.step(actions[i])[0]["frames"][-1]
        env.close()
        assert_frames_match_batched(got[i], want)


def test_vec_env_through_a_server_is_one_engine_call_per_step(serve, engine_calls):  # noqa: F811
    server = serve(max_wait_ms=10_000)
    venv = WorldModelVecEnv.remote(server.url, num_envs=3, token=TOKEN, max_windows=8)
    try:
        venv.reset()
        for _ in range(2):
            obs, _, _, _ = venv.step(np.zeros((3, *venv.action_space.shape), np.float32))
        assert obs.shape == (3, *venv.observation_space.shape)
        assert engine_calls == [3, 3]
    finally:
        venv.close()


def test_subproc_vec_env_with_four_workers_drives_one_server(serve, engine_calls):  # noqa: F811
    server = serve(max_wait_ms=10_000)
    venv = SubprocVecEnv([functools.partial(remote_image_env, server.url, TOKEN)] * 4, start_method="spawn")
    try:
        venv.seed(0)
        obs = venv.reset()
        for _ in range(2):
            obs, _, _, _ = venv.step(np.zeros((4, *venv.action_space.shape), np.float32))
        assert obs.shape == (4, *venv.observation_space.shape)
        assert engine_calls == [4, 4]  # the workers' steps met in one engine call (no worker loaded the model)
    finally:
        venv.close()
    assert server.open_sessions() == 0


def test_torchrl_parallel_env_with_four_workers_drives_one_server(serve, engine_calls):  # noqa: F811
    from torchrl.envs import ParallelEnv

    server = serve(max_wait_ms=10_000)
    env = ParallelEnv(4, functools.partial(remote_torchrl_env, server.url, TOKEN), mp_start_method="spawn")
    try:
        td = env.rollout(2)
        assert td["next", "frames"].shape[:2] == (4, 2)
        assert sum(engine_calls) == 8 and max(engine_calls) > 1  # the workers' steps batched on the server
    finally:
        env.close()
