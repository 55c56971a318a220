"""The commanded robot state: pose maths against scipy.spatial.transform, a round trip of deltas computed from
a pose trajectory, the conventions the registry declares, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import worldstep
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation
from tiny_world import cache_dir, world  # noqa: F401 - fixtures (a private WORLDSTEP_CACHE, the tiny model)
from worldstep.engine.embodiment.action_convention import ActionConvention, ActionKind, RotationKind
from worldstep.engine.embodiment.embodiment import Embodiment
from worldstep.engine.embodiment.embodiments import EmbodimentRegistry
from worldstep.envs import RobotStateObservation
from worldstep.envs.pose import compose, matrix_to_rot6d, relative, rot6d_to_matrix

seeds = st.integers(0, 2**32 - 2)  # numpy seeds < 2**32; one test also uses seed + 1


def rotations(seed: int, n: int) -> Rotation:
    return Rotation.random(n, random_state=seed)


@settings(max_examples=50, deadline=None)
@given(seed=seeds)
def test_rot6d_of_a_rotation_gives_it_back(seed):
    rot = rotations(seed, 8)
    six = matrix_to_rot6d(rot.as_matrix())
    assert np.allclose(six, np.concatenate([rot.as_matrix()[:, :, 0], rot.as_matrix()[:, :, 1]], axis=-1))
    assert np.allclose(rot6d_to_matrix(six), rot.as_matrix(), atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(seed=seeds, scale=st.floats(0.1, 10), skew=st.floats(-3, 3))
def test_rot6d_is_reorthonormalised(seed, scale, skew):
    """Scaled columns and a second column leaning on the first name the same rotation (Gram-Schmidt)."""
    m = rotations(seed, 1).as_matrix()[0]
    drifted = np.concatenate([scale * m[:, 0], m[:, 1] / scale + skew * m[:, 0]])
    got = rot6d_to_matrix(drifted)
    assert np.allclose(got, m, atol=1e-9)
    assert np.allclose(got.T @ got, np.eye(3), atol=1e-12) and np.isclose(np.linalg.det(got), 1.0)


@settings(max_examples=50, deadline=None)
@given(seed=seeds, steps=st.integers(1, 12))
def test_composition_matches_scipy(seed, steps):
    rng = np.random.default_rng(seed)
    deltas, d_pos = rotations(seed, steps), rng.normal(size=(steps, 3))
    pos, rot = rng.normal(size=3), rotations(seed + 1, 1)[0]
    ref_pos, ref_rot = pos.copy(), rot
    mine_pos, mine_rot = pos.copy(), rot.as_matrix()
    for i in range(steps):  # scipy: p' = p + R.apply(dp), R' = R * dR
        ref_pos, ref_rot = ref_pos + ref_rot.apply(d_pos[i]), ref_rot * deltas[i]
        mine_pos, mine_rot = compose(mine_pos, mine_rot, d_pos[i],
                                     rot6d_to_matrix(matrix_to_rot6d(deltas[i].as_matrix())))
    assert np.allclose(mine_pos, ref_pos, atol=1e-9)
    assert np.allclose(mine_rot, ref_rot.as_matrix(), atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(seed=seeds)
def test_relative_inverts_compose(seed):
    rng = np.random.default_rng(seed)
    (r0, r1), p0, p1 = rotations(seed, 2).as_matrix(), rng.normal(size=3), rng.normal(size=3)
    dp, dr = relative(p0, r0, p1, r1)
    assert np.allclose(Rotation.from_matrix(dr).as_matrix(), (Rotation.from_matrix(r0).inv()
                                                               * Rotation.from_matrix(r1)).as_matrix(), atol=1e-12)
    p, r = compose(p0, r0, dp, dr)
    assert np.allclose(p, p1, atol=1e-12) and np.allclose(r, r1, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(seed=seeds)
def test_euler_xyz_matches_scipy(seed):
    """DROID's cartesian_position form: scipy's extrinsic "xyz" Euler angles (the RemotePolicy DROID mapping)."""
    from worldstep.envs.pose import matrix_to_euler_xyz

    rots = rotations(seed, 8)
    mine = np.stack([matrix_to_euler_xyz(m) for m in rots.as_matrix()])
    assert np.allclose(mine, rots.as_euler("xyz"), atol=1e-9)
    # at gimbal lock only the rotation, not the angles, is determined: compare the rotations
    locked = Rotation.from_euler("xyz", [0.3, np.pi / 2, -0.2]).as_matrix()
    assert np.allclose(Rotation.from_euler("xyz", matrix_to_euler_xyz(locked)).as_matrix(), locked, atol=1e-9)


def test_degenerate_rotation_is_refused():
    with pytest.raises(ValueError, match="zero or parallel"):
        rot6d_to_matrix(np.array([1.0, 0, 0, 2.0, 0, 0]))


# --- the registry's conventions ----------------------------------------------------------------


def test_the_registry_declares_conventions_with_their_source():
    registry = EmbodimentRegistry.default()
    droid = registry.get("droid_lerobot").convention
    assert droid.kind is ActionKind.DELTA and droid.rotation_kind is RotationKind.ROT6D
    assert (droid.position, droid.rotation, droid.gripper) == ((0, 3), (3, 9), 9)
    assert "_EMBODIMENT_TO_RAW_ACTION_DIM" in droid.source and "technical report" in droid.source
    assert registry.get("robomind-ur").convention is None  # unknown: no state offered
    assert registry.get("pusht").convention is None


def test_a_convention_of_the_wrong_width_is_refused():
    droid = EmbodimentRegistry.default().get("droid_lerobot").convention
    with pytest.raises(ValueError, match="embodiment 'x': convention=.* is invalid; allowed: None or an "
                                         "ActionConvention of width 7"):
        Embodiment("x", 8, 7, convention=droid)


# --- the wrapper on the tiny model --------------------------------------------------------------


def make(world, **kwargs):  # noqa: F811
    return worldstep.make_env(world, embodiment="droid_lerobot", robot_state=True, **kwargs)


def pose_row(pos: np.ndarray, rot: np.ndarray, gripper: float) -> np.ndarray:
    return np.concatenate([pos, matrix_to_rot6d(rot), [gripper]])


def test_round_trip_of_deltas_from_a_pose_trajectory(world):  # noqa: F811
    """Deltas computed from a trajectory (T[t]^-1 T[t+1]) and stepped through the env give the trajectory back."""
    env = make(world)
    chunk = env.action_space.shape[0]
    rng = np.random.default_rng(7)
    n = 2 * chunk
    rots = Rotation.random(n + 1, random_state=7).as_matrix()
    # small steps: the deltas must sit in the action space's [-1, 1]
    rots = [Rotation.from_rotvec(0.3 * Rotation.from_matrix(r).as_rotvec() / np.pi).as_matrix() for r in rots]
    pos = np.cumsum(rng.uniform(-0.05, 0.05, (n + 1, 3)), axis=0)
    grip = rng.uniform(0, 1, n + 1)
    obs, _ = env.reset(seed=0, options={"state": pose_row(pos[0], rots[0], grip[0])})
    assert obs["state"].shape == (chunk, 10) and np.allclose(obs["state"], pose_row(pos[0], rots[0], grip[0]))
    deltas = []
    for t in range(n):
        dp, dr = relative(pos[t], rots[t], pos[t + 1], rots[t + 1])
        deltas.append(np.concatenate([dp, matrix_to_rot6d(dr), [grip[t + 1]]]))
    deltas = np.asarray(deltas, np.float32)
    assert np.abs(deltas).max() <= 1
    states = []
    for w in range(2):
        obs, *_ = env.step(deltas[w * chunk:(w + 1) * chunk])
        states.append(obs["state"])
    want = np.stack([pose_row(pos[t], rots[t], grip[t]) for t in range(1, n + 1)])
    # float32 actions and state rows around a float64 composition: measured 3.2e-8 (this seed), bound 1e-5
    assert np.allclose(np.concatenate(states), want, atol=1e-5)
    env.close()


def test_state_of_the_wrong_width_is_refused_before_any_model_work(world, monkeypatch):  # noqa: F811
    env = make(world)
    calls = []
    monkeypatch.setattr(env.env, "reset", lambda **kw: calls.append(kw))
    with pytest.raises(ValueError, match=r"options\['state'\] of shape \(9,\) is invalid; allowed: shape \(10,\)"):
        env.reset(seed=0, options={"state": np.zeros(9)})
    with pytest.raises(ValueError, match=r"options\['state'\].*zero or parallel"):
        env.reset(seed=0, options={"state": np.zeros(10)})
    with pytest.raises(ValueError, match="finite"):
        env.reset(seed=0, options={"state": np.full(10, np.nan)})
    assert calls == []
    monkeypatch.undo()
    env.close()


def test_unknown_convention_offers_no_state(world):  # noqa: F811
    with pytest.raises(ValueError, match="'robomind-ur' has no known action convention, so no robot state"):
        worldstep.make_env(world, embodiment="robomind-ur", robot_state=True)


def test_absolute_convention_state_is_the_last_action(world):  # noqa: F811
    absolute = ActionConvention(ActionKind.ABSOLUTE, 10, (0, 3), (3, 9), RotationKind.ROT6D, 9, "a test's own")
    env = RobotStateObservation(worldstep.make_env(world, embodiment="droid_lerobot"), absolute)
    env.reset(seed=0)
    actions = np.random.default_rng(0).uniform(-1, 1, env.action_space.shape).astype(np.float32)
    obs, *_ = env.step(actions)
    assert np.array_equal(obs["state"], actions)
    env.close()


def test_injected_violation_without_the_check_a_bad_state_reaches_the_env(world, monkeypatch):  # noqa: F811
    """The refusal above is the wrapper's check: with it bypassed, the env is reset before anything fails."""
    env = make(world)
    calls = []
    monkeypatch.setattr(env.env, "reset", lambda **kw: calls.append(kw) or ({}, {}))
    monkeypatch.setattr(env, "_check_state", lambda value, field: np.asarray(value, np.float64))
    with pytest.raises(Exception):  # noqa: B017 - whatever fails, it fails after the env was reset
        env.reset(seed=0, options={"state": np.zeros(9)})
    assert len(calls) == 1
    monkeypatch.undo()
    env.close()


def test_a_checkpoint_declares_its_embodiments_convention_in_worldstep_json():
    from worldstep.engine.embodiment.embodiment import embodiment_from_json, embodiment_to_json

    entry = {"name": "arm", "domain_id": 3, "raw_width": 10, "convention": {
        "kind": "absolute", "position": [0, 3], "rotation": [3, 9], "gripper": 9, "source": "our lab's logger"}}
    arm = embodiment_from_json(entry)
    assert arm.convention.kind is ActionKind.ABSOLUTE and arm.convention.rotation_kind is RotationKind.ROT6D
    assert embodiment_from_json(embodiment_to_json(arm)) == arm
    assert embodiment_from_json({k: v for k, v in entry.items() if k != "convention"}).convention is None  # unknown
    for bad, match in [({"kind": "absolute"}, "'source' required"), ({"kind": "sideways", "source": "x"}, "sideways"),
                       ({"kind": "delta", "source": "x", "position": [0, 2]}, "3 columns"),
                       ({"kind": "absolute", "source": "x", "gripper": 12}, r"disjoint columns in \[0, 10\)")]:
        with pytest.raises(ValueError, match=f"embodiment 'arm': convention=.*{match}"):
            embodiment_from_json({**entry, "convention": bad})


def test_fork_env_continues_the_cameras_and_the_state(world):  # noqa: F811
    from worldstep.envs import fork_env

    env = worldstep.make_env(world, embodiment="droid_lerobot", robot_state=True, cameras=("exterior", "wrist"))
    env.reset(seed=0)
    a = np.tile(np.float32([0.1, 0, 0, 1, 0, 0, 0, 1, 0, 0.5]), (env.action_space.shape[0], 1))
    env.step(a)
    fork = fork_env(env)
    (mine, *_), (theirs, *_) = env.step(a), fork.step(a)
    assert set(mine) == set(theirs) == {"exterior", "wrist", "state"}
    assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
    assert np.allclose(mine["state"][-1, :3], [0.8, 0, 0])  # 8 frames of 0.1 forward, not reset by the fork
    fork.close()
    env.close()
