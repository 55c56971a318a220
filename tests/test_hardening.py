"""Hardening at the gymnasium surface: random bad inputs, aborts, mid-episode resets, interleaved
vector episodes with forks. Every case ends by counting pages and decoder caches."""

from __future__ import annotations

import numpy as np
import pytest
import worldstep
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tiny_world import FAST, assert_frames_match_batched, cache_dir, ramp, world, zeros  # noqa: F401 - fixtures
from worldstep.envs import fork_env

SETTINGS = settings(max_examples=30, deadline=None)


def _resources(world):  # noqa: F811
    return world.model.kv.num_used_pages, world.model.decoder.live_warm_sessions, world.model.live_sessions


@pytest.fixture
def env(world):  # noqa: F811
    env = worldstep.make_env(world, max_windows=1000)
    env.reset(seed=0)
    yield env
    env.close()
    assert _resources(world) == (0, 0, 0)


bad_actions = st.one_of(
    hnp.arrays(np.float32, st.tuples(st.integers(0, 6), st.integers(0, 20))),
    hnp.arrays(np.float32, st.just((4, 10)), elements=st.sampled_from([np.nan, np.inf, -np.inf, 1.5, -3.0])),
    hnp.arrays(st.sampled_from([np.bool_, np.complex64, np.dtype("U2")]), st.just((4, 10))),
    st.sampled_from([None, "forward", 1.0, [[0.0] * 16] * 3]),
)


@SETTINGS
@given(actions=bad_actions)
def test_random_bad_actions_are_rejected_before_any_work(env, actions):
    model = env.unwrapped.model
    before = (model.kv.num_used_pages, env.unwrapped.windows)
    with pytest.raises(ValueError, match="action"):
        env.step(actions)
    assert (model.kv.num_used_pages, env.unwrapped.windows) == before


bad_options = st.one_of(
    st.fixed_dictionaries({"domain_id": st.one_of(st.integers(max_value=-1), st.integers(min_value=32),
                                                   st.floats(), st.booleans(), st.text(max_size=2))}),
    st.fixed_dictionaries({"prompt": st.one_of(st.just(""), st.just("   "), st.integers(), st.just("x" * 30000))}),
    st.fixed_dictionaries({"image": st.one_of(
        hnp.arrays(np.uint8, st.sampled_from([(16, 16), (16, 16, 4), (2, 2, 3)])),
        hnp.arrays(np.float64, (16, 16, 3), elements=st.floats(1.5, 9)),
        st.just("frame.png"),
    )}),
)


@SETTINGS
@given(options=bad_options)
def test_random_bad_reset_options_keep_the_episode(env, options):
    field = next(iter(options))
    pages = env.unwrapped.model.kv.num_used_pages
    with pytest.raises(ValueError, match=field):
        env.reset(options=options)
    assert env.unwrapped.model.kv.num_used_pages == pages
    env.step(zeros(env.action_space))  # the running episode is untouched


def test_reset_in_the_middle_of_an_episode_returns_its_pages(world):  # noqa: F811
    env = worldstep.make_env(world, max_windows=50)
    env.reset(seed=1)
    fresh = world.model.kv.num_used_pages
    for _ in range(3):
        env.step(ramp(env.action_space))
    assert world.model.kv.num_used_pages > fresh
    env.reset(seed=1)
    assert world.model.kv.num_used_pages == fresh and world.model.live_sessions == 1
    env.close()
    assert _resources(world) == (0, 0, 0)


@pytest.mark.parametrize("phase", ["denoise", "commit", "decode"])
def test_an_exception_inside_a_window_returns_everything_and_the_env_recovers(world, monkeypatch, phase):  # noqa: F811
    from worldstep.engine.models.cosmos3 import window

    env = worldstep.make_env(world, max_windows=10)
    env.reset(seed=2)
    env.step(zeros(env.action_space))
    target = {"denoise": (window, "_denoise"), "commit": (window, "_commit"),
              "decode": (world.model.decoder, "decode_checked")}[phase]
    with monkeypatch.context() as patch:
        patch.setattr(*target, lambda *a, **k: (_ for _ in ()).throw(RuntimeError(f"injected in {phase}")))
        with pytest.raises(RuntimeError, match=phase):
            env.step(zeros(env.action_space))
    assert _resources(world) == (0, 0, 0)
    obs, _ = env.reset(seed=2)
    obs, *_ = env.step(zeros(env.action_space))
    assert obs["frames"].shape[0] == env.action_space.shape[0]
    env.close()
    assert _resources(world) == (0, 0, 0)


def test_interleaved_vector_episodes_with_forks_match_sequential_runs(world):  # noqa: F811
    lengths, steps = [1, 2, 3], 7
    envs = worldstep.world.make_vec_env(world, num_envs=3, max_windows=3, embodiment="umi")  # domain 6
    for sub, length in zip(envs.envs, lengths):
        sub.max_windows = length  # episodes of different lengths finish at different steps
    space = envs.single_action_space
    actions = [np.stack([ramp(space, ((s + 1) * (i + 1) % 9) / 10 - 0.4) for i in range(3)]) for s in range(steps)]

    obs, _ = envs.reset(seed=[10, 11, 12], options={"domain_id": 6})
    got = [[obs["frames"][i]] for i in range(3)]
    forks = []
    for s in range(steps):
        obs, _, _, truncs, _ = envs.step(actions[s])
        for i in range(3):
            got[i].append(obs["frames"][i])
        if s in (1, 3) and not truncs[2] and envs.envs[2].unwrapped.episode is not None:
            fork = fork_env(envs.envs[2], seed=s)  # a branch taken mid-episode, stepped alongside
            fork.step(ramp(space, 0.9))
            forks.append(fork)
    for fork in forks:
        fork.close()
    envs.close()
    assert _resources(world) == (0, 0, 0)

    for i, length in enumerate(lengths):  # the same episodes one env at a time (next-step autoreset)
        env = worldstep.make_env(world, max_windows=length, embodiment="umi")
        obs, _ = env.reset(seed=10 + i, options={"domain_id": 6})
        expected, done = [obs["frames"]], False
        for s in range(steps):
            if done:
                obs, _ = env.reset(options={"domain_id": 6})
                done = False
            else:
                obs, _, term, trunc, _ = env.step(actions[s][i])
                done = term or trunc
            expected.append(obs["frames"])
        env.close()
        for a, b in zip(got[i], expected):  # batched vs alone: equal within the stated bound
            assert_frames_match_batched(a, b)
    assert _resources(world) == (0, 0, 0)


def test_property_tests_read_no_clock():
    """The suite's Hypothesis profile (conftest.py): no deadline and no too-slow health check, so a loaded box
    cannot fail a property test (a fresh clone's CI once failed one that passes alone)."""
    from hypothesis import HealthCheck, settings

    assert settings.default.deadline is None and HealthCheck.too_slow in settings.default.suppress_health_check
    assert SETTINGS.deadline is None and HealthCheck.too_slow in SETTINGS.suppress_health_check  # inherited
