"""Stable-Baselines3 on worldstep envs: ``ImageObservation`` turns the window into an image ``Box`` that SB3's
checker accepts silently and ``CnnPolicy`` trains on, for the simulator and for the pusher world model."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import stable_baselines3 as sb3  # noqa: E402 - the dev extra installs it
import worldstep  # noqa: F401 - registers the ids
from stable_baselines3.common.env_checker import check_env  # noqa: E402
from tiny_world import cache_dir  # noqa: F401 - fixture (a private WORLDSTEP_CACHE)
from worldstep.envs import ImageObservation


def make(env_id: str, frames: str) -> gym.Env:
    if env_id == "worldstep/PushSim-v0":
        return ImageObservation(gym.make(env_id, max_episode_steps=4), frames)
    return ImageObservation(gym.make(env_id, max_windows=4), frames)


def test_raw_frames_are_not_an_image_for_sb3(cache_dir):  # noqa: F811
    env = gym.make("worldstep/PushSim-v0")
    with pytest.warns(UserWarning, match="unconventional shape"):
        check_env(env)  # why the wrapper exists: (chunk, H, W, 3) is neither an image nor a vector


@pytest.mark.parametrize("env_id", ["worldstep/PushSim-v0", "worldstep/Pusher-v0"])
@pytest.mark.parametrize("frames", ["last", "stack"])
def test_checker_is_silent(env_id, frames, cache_dir):  # noqa: F811
    env = make(env_id, frames)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    env.close()


def test_image_observation_content(cache_dir):  # noqa: F811
    raw = gym.make("worldstep/PushSim-v0")
    window, _ = raw.reset(seed=1)
    for frames, shape in (("last", (64, 64, 3)), ("stack", (64, 64, 12))):
        env = make("worldstep/PushSim-v0", frames)
        obs, _ = env.reset(seed=1)
        assert obs.shape == shape and obs.dtype == np.uint8 and obs in env.observation_space
        expected = window["frames"][-1] if frames == "last" else np.concatenate(list(window["frames"]), axis=-1)
        assert np.array_equal(obs, expected)
    with pytest.raises(ValueError, match="frames='all'"):
        ImageObservation(raw, "all")
    with pytest.raises(TypeError, match="observation_space"):
        ImageObservation(gym.make("CartPole-v1"))


@pytest.mark.parametrize("env_id", ["worldstep/PushSim-v0", "worldstep/Pusher-v0"])
def test_ppo_cnn_policy_trains(env_id, cache_dir):  # noqa: F811
    env = make(env_id, "stack")
    model = sb3.PPO("CnnPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu", verbose=0)
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(total_timesteps=8)
    assert model.num_timesteps == 8
    assert any(not np.array_equal(a.numpy(), b.detach().numpy()) for a, b in zip(before, model.policy.parameters()))
    action, _ = model.predict(env.reset(seed=0)[0], deterministic=True)
    assert action.shape == env.action_space.shape and env.action_space.contains(action.astype(np.float32))
    env.close()
