"""The vector env's three autoreset modes, and torchrl stepping it batched: one engine call per step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from gymnasium.vector import AutoresetMode
from tiny_world import assert_frames_match_batched, cache_dir, ramp, world  # noqa: F401 - fixtures


@pytest.fixture
def engine_calls(world, monkeypatch):  # noqa: F811
    """The number of sessions in each ``model.step`` call."""
    calls, original = [], world.model.step
    monkeypatch.setattr(world.model, "step", lambda s, a, **k: calls.append(len(s)) or original(s, a, **k))
    return calls


def _actions(envs, scale: float) -> np.ndarray:
    return np.stack([ramp(envs.single_action_space, scale * (i + 1)) for i in range(envs.num_envs)])


@pytest.mark.exactness
def test_same_step_resets_in_the_ending_step_with_final_obs(world, engine_calls):  # noqa: F811
    nxt = worldstep.world.make_vec_env(world, num_envs=2, max_windows=1)
    same = worldstep.world.make_vec_env(world, num_envs=2, max_windows=1, autoreset_mode="same_step")
    assert same.autoreset_mode is AutoresetMode.SAME_STEP and same.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    nxt.reset(seed=3)
    same.reset(seed=3)
    ended, *_ = nxt.step(_actions(nxt, 0.3))
    reset, *_ = nxt.step(_actions(nxt, 0.3))  # NEXT_STEP: this step is the reset
    engine_calls.clear()
    obs, rewards, terms, truncs, infos = same.step(_actions(same, 0.3))
    assert engine_calls == [2]  # one engine call for both; the resets that follow run no window
    assert truncs.all() and infos["_final_obs"].all() and infos["_final_info"].all()
    assert infos["final_info"]["window_index"].tolist() == [0, 0]  # windows count from 0
    for i in range(2):  # the ending window is in final_obs; obs is the next episode's first observation
        assert np.array_equal(infos["final_obs"][i]["frames"], ended["frames"][i])  # gymnasium: one obs per env
        assert np.array_equal(obs["frames"][i], reset["frames"][i])  # the same RNG draw as NEXT_STEP's reset
    assert infos["_frame_start"].all() and infos["frame_start"].tolist() == [0, 0]  # the reset's info
    obs, *_ = same.step(_actions(same, 0.3))  # the new episodes step at once: no step is spent resetting
    assert engine_calls == [2, 2]
    same.close()
    nxt.close()
    assert world.model.live_sessions == 0


@pytest.mark.exactness
def test_disabled_resets_only_where_the_mask_says(world, engine_calls):  # noqa: F811
    envs = worldstep.world.make_vec_env(world, num_envs=2, max_windows=2, autoreset_mode="disabled")
    twin = worldstep.world.make_vec_env(world, num_envs=2, max_windows=2)
    envs.reset(seed=5)
    twin.reset(seed=5)
    first, *_ = envs.step(_actions(envs, 0.2))
    twin.step(_actions(twin, 0.2))
    obs, infos = envs.reset(options={"reset_mask": np.array([True, False])})
    assert infos["_frame_start"].tolist() == [True, False]  # infos only for the sub-environment that reset
    assert np.array_equal(obs["frames"][1], first["frames"][1])  # env 1's episode is untouched
    obs, _, terms, truncs, infos = envs.step(_actions(envs, 0.2))
    assert infos["window_index"].tolist() == [0, 1] and truncs.tolist() == [False, True]
    want, *_ = twin.step(_actions(twin, 0.2))  # env 1 as if nothing had happened (rows batched the same way)
    assert_frames_match_batched(obs["frames"][1], want["frames"][1])
    with pytest.raises(gym.error.ResetNeeded, match=r"sub-environments \[1\] ended and autoreset_mode is DISABLED"):
        envs.step(_actions(envs, 0.2))
    envs.reset(options={"reset_mask": np.array([False, True])})
    _, _, _, truncs, infos = envs.step(_actions(envs, 0.2))
    assert infos["window_index"].tolist() == [1, 0] and truncs.tolist() == [True, False]
    envs.close()
    twin.close()
    assert world.model.live_sessions == 0


def test_bad_autoreset_arguments_are_refused_before_work(world):  # noqa: F811
    with pytest.raises(ValueError, match=r"autoreset_mode='sometimes' is invalid; allowed: 'next_step', "
                                         r"'same_step', 'disabled'"):
        worldstep.world.make_vec_env("tiny-that-does-not-exist", num_envs=2, autoreset_mode="sometimes")
    envs = worldstep.world.make_vec_env(world, num_envs=2, autoreset_mode=AutoresetMode.DISABLED)
    envs.reset(seed=0)
    for mask in (np.array([False, False]), np.array([1, 0]), np.array([True]), [True, False]):
        with pytest.raises(ValueError, match=r"options\['reset_mask'\]=.* is invalid; allowed: a numpy bool array"):
            envs.reset(options={"reset_mask": mask})
    envs.step(_actions(envs, 0.1))  # still usable: nothing was reset
    envs.close()


def test_torchrl_steps_the_vector_env_in_one_engine_call(world, engine_calls):  # noqa: F811
    import torch
    from torchrl.envs import GymWrapper, check_env_specs

    vec = gym.make_vec("worldstep/Tiny-v0", num_envs=3, vectorization_mode="vector_entry_point", model=world,
                       max_windows=2, autoreset_mode="disabled")  # torchrl resets by mask
    env = GymWrapper(vec)
    try:
        assert env.batch_size == torch.Size([3])
        check_env_specs(env)
        env.set_seed(0)
        engine_calls.clear()
        td = env.rollout(5, break_when_any_done=False)  # episodes of 2 windows end and restart inside
        assert td.batch_size == torch.Size([3, 5])
        assert engine_calls == [3] * 5  # one engine call per torchrl step, for all three episodes
        done = td["next", "done"].squeeze(-1)
        assert done[:, 1].all() and done[:, 3].all() and not done[:, [0, 2, 4]].any()
        assert td["next", "frames"].dtype == torch.uint8 and td["next", "frames"].shape[:2] == (3, 5)
    finally:
        env.close()
    assert world.model.live_sessions == 0
