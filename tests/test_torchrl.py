"""torchrl drives worldstep envs by id: GymEnv, its spec checker, rollouts, SerialEnv and ParallelEnv.

torchrl's GymEnv passes ``frameskip=`` to ``gym.make`` and drops it only when the constructor raises a
``TypeError`` reading "unexpected keyword argument 'frameskip'"; worldstep's unknown-key error is one.
"""

from __future__ import annotations

import pytest
import torch
import torchrl.envs as torchrl_envs  # noqa: E402 - the dev extra installs it
import worldstep
from tiny_world import FAST, cache_dir  # noqa: F401 - fixture (a private WORLDSTEP_CACHE)

GymEnv, SerialEnv, ParallelEnv, check_env_specs = (torchrl_envs.GymEnv, torchrl_envs.SerialEnv,
                                                    torchrl_envs.ParallelEnv, torchrl_envs.check_env_specs)


def make_tiny():
    import worldstep  # noqa: F401 - a ParallelEnv worker process registers the ids itself

    return GymEnv("worldstep/Tiny-v0", **FAST)


def test_unknown_constructor_keyword_is_a_type_error_naming_it(cache_dir):  # noqa: F811
    with pytest.raises(TypeError, match="unexpected keyword argument 'frameskip'") as info:
        worldstep.make_env("tiny", frameskip=4, **FAST)
    assert isinstance(info.value, worldstep.ConfigError) and isinstance(info.value, ValueError)


def test_gym_env_specs_and_rollout(cache_dir):  # noqa: F811
    env = make_tiny()
    try:
        check_env_specs(env)
        td = env.rollout(3)
        assert td["next", "frames"].shape == (3, 4, 32, 32, 3) and td["next", "frames"].dtype == torch.uint8
        assert td["action"].shape == (3, 4, 10)
    finally:
        env.close()


def test_serial_env(cache_dir):  # noqa: F811
    env = SerialEnv(2, make_tiny)
    try:
        td = env.rollout(2)
        assert td["next", "frames"].shape == (2, 2, 4, 32, 32, 3)
    finally:
        env.close()


def test_parallel_env(cache_dir):  # noqa: F811
    env = ParallelEnv(2, make_tiny, mp_start_method="spawn")
    try:
        check_env_specs(env)
        td = env.rollout(2)
        assert td["next", "frames"].shape == (2, 2, 4, 32, 32, 3)
        assert not torch.equal(td["next", "frames"][0], td["next", "frames"][1])  # two episodes, two seeds
    finally:
        env.close()
