"""WorldModelVectorEnv: make_vec, one batched engine call, equality with single envs, autoreset, masks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from gymnasium.vector import AutoresetMode
from tiny_world import FAST, assert_frames_match_batched, cache_dir, ramp, world, zeros  # noqa: F401 - fixtures
from worldstep.envs import WorldModelVectorEnv


def test_make_vec_returns_the_batched_env(world):  # noqa: F811
    envs = gym.make_vec("worldstep/Tiny-v0", num_envs=2, vectorization_mode="vector_entry_point", model=world)
    assert isinstance(envs, WorldModelVectorEnv) and envs.num_envs == 2
    assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert envs.single_action_space.shape == (4, 10)  # droid_lerobot (tiny.yaml: domain 8), exactly 10 wide
    assert envs.action_space.shape == (2, 4, 10)
    assert envs.observation_space["frames"].shape == (2, *envs.single_observation_space["frames"].shape)
    assert all(env.unwrapped.model is world.model for env in envs.envs)  # one model, not copies
    envs.close()


@pytest.mark.exactness
def test_batched_steps_match_single_envs_and_autoreset_next_step(world, monkeypatch):  # noqa: F811
    envs = worldstep.world.make_vec_env(world, num_envs=2, max_windows=2)
    calls = []
    original = world.model.step
    monkeypatch.setattr(world.model, "step", lambda s, a, **k: calls.append(len(s)) or original(s, a, **k))
    space = envs.single_action_space
    actions = [np.stack([ramp(space, 0.4), ramp(space, -0.4)]), np.stack([zeros(space), ramp(space, 0.8)])]

    obs, infos = envs.reset(seed=10, options={"prompt": ["first prompt", "second prompt"], "domain_id": 8})
    assert infos["_frame_start"].all()
    batched = [obs["frames"]]
    for i, a in enumerate(actions):
        obs, rewards, terms, truncs, infos = envs.step(a)
        batched.append(obs["frames"])
        assert truncs.tolist() == [i == 1, i == 1] and not terms.any()
    assert calls == [2, 2]  # ONE engine call per step for both sessions
    assert infos["_timings"].all() and infos["timings"]["denoise_s"].dtype == np.float64
    assert infos["kv"]["pages_in_use"].shape == (2,) and infos["_kv"].all()
    assert infos["window_index"].tolist() == [1, 1]

    # next-step autoreset: the actions are ignored, reset observations come back with reward 0
    obs, rewards, terms, truncs, infos = envs.step(np.stack([ramp(space, 0.1)] * 2))
    assert rewards.tolist() == [0, 0] and not terms.any() and not truncs.any()
    assert "window_index" not in infos and infos["_frame_start"].all()
    autoreset = obs["frames"]

    for i, (seed, prompt) in enumerate([(10, "first prompt"), (11, "second prompt")]):
        env = worldstep.make_env(world)
        single, _ = env.reset(seed=seed, options={"prompt": prompt, "domain_id": 8})
        frames = [single["frames"]] + [env.step(a[i])[0]["frames"] for a in actions]
        for b, s in zip(batched, frames):  # batched transformer rows: equal within the stated bound
            assert_frames_match_batched(b[i], s)
        again, _ = env.reset(options={"prompt": prompt, "domain_id": 8})  # the RNG continues as in the vector env
        assert np.array_equal(autoreset[i], again["frames"])  # a reset decodes frame 0 alone in both: same calls
        env.close()
    envs.close()
    assert world.model.kv.num_used_pages == 0


def test_vector_bad_inputs(world):  # noqa: F811
    envs = worldstep.world.make_vec_env(world, num_envs=2)
    with pytest.raises(ValueError, match="seed="):
        envs.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match=r"options\['prompt'\] has 3 values"):
        envs.reset(options={"prompt": ["a", "b", "c"]})
    with pytest.raises(ValueError, match=r"options\['domain_id'\]=99"):
        envs.reset(options={"domain_id": [8, 99]})
    assert world.model.live_sessions == 0  # nothing opened by a rejected reset
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions.shape=\(4, 16\)"):
        envs.step(np.zeros((4, 16), np.float32))
    with pytest.raises(ValueError, match="num_envs=0"):
        WorldModelVectorEnv(world.model, 0, world.knobs)
    envs.close()
    envs.close()
    assert world.model.kv.num_used_pages == 0
