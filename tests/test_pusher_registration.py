"""The shipped pusher model and its simulator are reachable by gym id; the loader takes the trained weights."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import gymnasium as gym
import numpy as np
import worldstep  # noqa: F401 - registers the ids
from worldstep.envs.push_sim import first_frame
from worldstep.world import embedded_checkpoint


def test_embedded_pusher_resolves_to_the_shipped_weights():
    shipped = Path(str(files("worldstep.configs") / "models" / "pusher"))
    assert embedded_checkpoint("pusher", {}) == shipped
    assert (shipped / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_size > 1_000_000


def test_pusher_world_model_and_simulator_share_conventions():
    sim = gym.make("worldstep/PushSim-v0")
    model_env = gym.make("worldstep/Pusher-v0")
    assert sim.action_space.shape[0] == model_env.action_space.shape[0] == 4
    assert sim.observation_space["frames"].shape == model_env.observation_space["frames"].shape == (4, 64, 64, 3)
    image = first_frame(np.random.default_rng(0))
    obs, _ = model_env.reset(seed=0, options={"image": image})
    actions = np.zeros(model_env.action_space.shape, np.float32)
    actions[:, 0] = 1.0
    obs, *_ = model_env.step(actions)
    assert obs["frames"].dtype == np.uint8 and obs["frames"].shape == (4, 64, 64, 3)
    sim.close(), model_env.close()
