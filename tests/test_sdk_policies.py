"""Policies: shapes, ranges, seeding, replay validation and the per-step adapter."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from worldstep.policies import PerStepPolicy, Policy, RandomPolicy, ReplayPolicy, SinePolicy, make_policy

SPACE = spaces.Box(-1, 1, (4, 3), np.float32)
OBS = {"frames": np.zeros((4, 32, 32, 3), np.uint8)}


@pytest.mark.parametrize("policy", [RandomPolicy(SPACE, seed=0), SinePolicy(SPACE), SinePolicy((4, 3)),
                                    PerStepPolicy(lambda frame: np.zeros(3), SPACE),
                                    ReplayPolicy(np.zeros((2, 4, 3)), SPACE)])
def test_policies_return_chunks_in_the_action_space(policy):
    assert isinstance(policy, Policy)
    policy.reset(seed=1)
    actions = policy(OBS)
    assert actions.shape == (4, 3) and actions.dtype == np.float32
    assert actions in SPACE


def test_random_policy_is_seeded():
    a = RandomPolicy(SPACE, seed=5)
    b = RandomPolicy(SPACE, seed=7)
    b.reset(seed=5)
    assert np.array_equal(a(OBS), b(OBS))
    assert not np.array_equal(a(OBS), a(OBS))


def test_sine_policy_is_smooth_across_windows_and_resets():
    policy = SinePolicy(SPACE, period=16)
    first, second = policy(OBS), policy(OBS)
    steps = np.diff(np.concatenate([first, second]), axis=0)
    assert np.abs(steps).max() < 0.5  # no jump at the window boundary
    policy.reset()
    assert np.array_equal(policy(OBS), first)
    with pytest.raises(ValueError, match="amplitude"):
        SinePolicy(SPACE, amplitude=2)


def test_replay_policy_from_npy(tmp_path):
    steps = np.linspace(-1, 1, 8 * 3).reshape(8, 3)
    path = tmp_path / "actions.npy"
    np.save(path, steps)
    policy = make_policy(f"replay:{path}", SPACE)
    assert policy.num_windows == 2
    assert np.allclose(policy(OBS), steps[:4]) and np.allclose(policy(OBS), steps[4:])
    with pytest.raises(IndexError, match="2 windows"):
        policy(OBS)
    policy.reset()
    assert np.allclose(policy(OBS), steps[:4])


@pytest.mark.parametrize(
    ("actions", "match"),
    [(np.zeros((6, 3)), r"shape \(6, 3\)"), (np.zeros((2, 4, 5)), r"shape \(2, 4, 5\)"),
     (np.full((4, 3), 2.0), r"\[-1, 1\]"), (np.full((4, 3), np.nan), "finite"), (np.array(["a"] * 12), "dtype")],
)
def test_replay_policy_validates(actions, match):
    with pytest.raises(ValueError, match=match):
        ReplayPolicy(actions, SPACE)


def test_replay_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        ReplayPolicy(tmp_path / "nope.npy", SPACE)


def test_per_step_policy_queries_chunk_times_with_latest_frame():
    seen = []

    def fn(frame):
        seen.append(frame)
        return np.full(3, 0.1 * len(seen))

    obs = {"frames": np.arange(4)[:, None, None, None] * np.ones((4, 2, 2, 3), np.uint8)}
    actions = PerStepPolicy(fn, SPACE)(obs)
    assert len(seen) == 4 and all((f == 3).all() for f in seen)
    assert np.allclose(actions[:, 0], [0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        PerStepPolicy(lambda f: np.zeros(2), SPACE)(obs)
    with pytest.raises(TypeError):
        PerStepPolicy(3, SPACE)


def test_make_policy_names():
    assert isinstance(make_policy("sine", SPACE), SinePolicy)
    assert isinstance(make_policy("random", SPACE, seed=1), RandomPolicy)
    with pytest.raises(ValueError, match="policy='nope'"):
        make_policy("nope", SPACE)
    with pytest.raises(ValueError, match="action_space"):
        SinePolicy((4,))
