"""`worldstep stats`: action statistics from .npy/.npz arrays and LeRobot parquet files; pose rows."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from worldstep.action_data import load_lerobot_actions, relative_pose_actions
from worldstep.cli import main
from worldstep.engine.embodiment.action_stats import ActionStats


def _rows(seed=0, shape=(3, 40, 10)):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_stats_from_npy_and_npz(tmp_path, capsys):
    actions = _rows()
    np.save(tmp_path / "a.npy", actions)
    assert main(["stats", str(tmp_path / "a.npy"), "--out", str(tmp_path / "s.json")]) == 0
    assert "120 action rows, 10 dimensions" in capsys.readouterr().out
    written = ActionStats.from_json(tmp_path / "s.json")
    expected = ActionStats.compute(actions.reshape(-1, 10))
    for key in ("q01", "q99", "mean", "std", "min", "max"):
        np.testing.assert_array_equal(getattr(written, key), getattr(expected, key))

    np.savez(tmp_path / "b.npz", observations=np.zeros((5, 2)), joint_actions=actions[0, :, :3])
    assert main(["stats", str(tmp_path / "b.npz"), "--key", "joint_actions", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["q01"]) == 3
    assert main(["stats", str(tmp_path / "b.npz")]) == 2  # two arrays, no key: refused, names them
    assert "allowed: ['observations', 'joint_actions']" in capsys.readouterr().err
    assert main(["stats", str(tmp_path / "a.npy"), "--dims", "0:11"]) == 2
    assert main(["stats", str(tmp_path / "missing.npy")]) == 2


def _lerobot(root, episodes, fixed=True):
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps({
        "fps": 15, "features": {"action": {"dtype": "float32", "shape": [7], "names": [f"a{i}" for i in range(7)]}}}))
    for index, episode in enumerate(episodes):
        folder = root / "data" / "chunk-000"
        folder.mkdir(parents=True, exist_ok=True)
        kind = pa.list_(pa.float32(), 7) if fixed else pa.list_(pa.float32())
        table = pa.table({"action": pa.array(episode.tolist(), type=kind),
                          "frame_index": pa.array(np.arange(len(episode)))})
        pq.write_table(table, folder / f"episode_{index:06d}.parquet")


@pytest.mark.parametrize("fixed", [True, False])
def test_stats_from_a_lerobot_dataset(tmp_path, capsys, fixed):
    episodes = [_rows(1, (30, 7)), _rows(2, (25, 7))]
    _lerobot(tmp_path / "ds", episodes, fixed)
    rows, meta = load_lerobot_actions(tmp_path / "ds")
    np.testing.assert_array_equal(rows, np.concatenate(episodes))
    assert meta["fps"] == 15 and meta["names"][0] == "a0" and meta["files"] == 2
    assert main(["stats", str(tmp_path / "ds"), "--dims", "0:3", "--out", str(tmp_path / "s.json")]) == 0
    stats = ActionStats.from_json(tmp_path / "s.json")
    np.testing.assert_allclose(stats.q99, np.quantile(np.concatenate(episodes)[:, :3], 0.99, axis=0), rtol=1e-6)
    assert stats.metadata["fps"] == 15 and stats.metadata["dims"] == "0:3"
    assert main(["stats", str(tmp_path / "ds"), "--column", "state"]) == 2
    assert "column='state' is missing" in capsys.readouterr().err


def _pose(yaw, xyz):
    c, s = np.cos(yaw), np.sin(yaw)
    pose = np.eye(4)
    pose[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    pose[:3, 3] = xyz
    return pose


def test_relative_pose_rows_follow_the_cosmos3_convention():
    still = relative_pose_actions(np.stack([np.eye(4)] * 3), gripper=[0.0, 1.0])
    np.testing.assert_array_equal(still, [[0, 0, 0, 1, 0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0, 0, 1, 0, 1]])
    # turned 90 degrees about z, then step 1 along world x = -1 along the gripper's own y
    poses = np.stack([_pose(np.pi / 2, [0, 0, 0]), _pose(np.pi / 2 + 0.3, [1, 0, 0])])
    row = relative_pose_actions(poses)[0]
    np.testing.assert_allclose(row[:3], [0, -1, 0], atol=1e-6)
    np.testing.assert_allclose(row[3:], [np.cos(0.3), np.sin(0.3), 0, -np.sin(0.3), np.cos(0.3), 0], atol=1e-6)
    # the rows rebuild the trajectory: T_t+1 = T_t @ dT
    rng = np.random.default_rng(3)
    poses = np.stack([_pose(rng.uniform(-3, 3), rng.normal(size=3)) for _ in range(6)])
    rows = relative_pose_actions(poses).astype(np.float64)
    current = poses[0]
    for t, r in enumerate(rows):
        col0, col1 = r[3:6], r[6:9]
        delta = np.eye(4)
        delta[:3, :3] = np.stack([col0, col1, np.cross(col0, col1)], axis=1)
        delta[:3, 3] = r[:3]
        current = current @ delta
        np.testing.assert_allclose(current, poses[t + 1], atol=1e-5)
    with pytest.raises(ValueError, match="one per step"):
        relative_pose_actions(poses, gripper=[0.0])
    with pytest.raises(ValueError, match="T >= 2"):
        relative_pose_actions(poses[:1])
