"""worldstep and LeRobot's own code read each other's datasets: LeRobot's writer (lerobot 0.4.4: format v3.0;
lerobot 0.3.3: format v2.1) -> worldstep's reader, and worldstep's writer -> LeRobot's reader, AV1 and H.264.

lerobot pins torch<2.11, so it runs in venvs of its own that ``make test`` builds (``WORLDSTEP_LEROBOT_PYTHON``,
``WORLDSTEP_LEROBOT_V21_PYTHON``; default the repository's ``.venv-lerobot`` and ``.venv-lerobot-v21``), through
tests/lerobot_io.py. LeRobot's side of the second direction checks what its reader loads without decoding (fps,
cameras, every row, tasks, success) and worldstep's decoded frames are checked against the source; LeRobot's own
decode of the same videos (torchcodec) is tests/test_lerobot_pixels.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from lerobot_data import CAMERAS, assert_frames_match, episodes, run_lerobot
from worldstep.lerobot import RobotDataset
from worldstep.lerobot.writer import DatasetWriter


def write_spec(path: Path, recorded, fps: int) -> Path:
    arrays = {"cameras": np.array(json.dumps(list(CAMERAS))), "tasks": np.array(json.dumps([r.task for r in recorded])),
              "fps": np.array(fps)}
    for e, r in enumerate(recorded):
        arrays[f"actions_{e}"], arrays[f"state_{e}"] = r.actions, r.state
        for c, key in enumerate(CAMERAS):
            arrays[f"frames_{e}_{c}"] = r.frames[key]
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("version,codec", [("v3.0", "av1"), ("v3.0", "h264"), ("v2.1", "av1"), ("v2.1", "h264")])
def test_worldstep_reads_what_lerobot_writes(tmp_path, version, codec):
    recorded = episodes([8, 5, 7], seed=3)
    run_lerobot(version, "write", tmp_path / "ds", codec, write_spec(tmp_path / "spec.npz", recorded, 15))
    ds = RobotDataset(tmp_path / "ds")
    assert (ds.info.version, ds.fps, ds.camera_keys, ds.num_episodes) == (version, 15.0, CAMERAS, 3)
    assert ds.info.features[CAMERAS[0]].shape == (48, 64, 3)
    for e, r in enumerate(recorded):
        episode = ds.episode(e)
        assert episode.task == r.task
        np.testing.assert_array_equal(episode.actions, r.actions)
        np.testing.assert_array_equal(episode.state, r.state)
        for key in CAMERAS:
            assert_frames_match(episode.frames[key], r.frames[key])


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_lerobot_reads_what_worldstep_writes(tmp_path, codec):
    recorded = episodes([6, 9], seed=5)
    outcomes = [True, False]
    with DatasetWriter(tmp_path / "ds", fps=15, cameras={k: (48, 64) for k in CAMERAS}, action_width=10,
                       state_width=7, codec=codec) as writer:
        for r, success in zip(recorded, outcomes):
            writer.add_episode(frames=r.frames, actions=r.actions, state=r.state, task=r.task, success=success)
    run_lerobot("v3.0", "read", tmp_path / "ds", tmp_path / "out.npz")
    seen = np.load(tmp_path / "out.npz")
    assert int(seen["fps"]) == 15 and int(seen["num_episodes"]) == 2
    assert json.loads(str(seen["camera_keys"])) == list(CAMERAS)
    np.testing.assert_array_equal(seen["action"], np.concatenate([r.actions for r in recorded]))
    np.testing.assert_array_equal(seen["observation.state"], np.concatenate([r.state for r in recorded]))
    np.testing.assert_array_equal(seen["episode_index"], [0] * 6 + [1] * 9)
    assert json.loads(str(seen["tasks"])) == [[r.task] for r in recorded]
    assert json.loads(str(seen["success"])) == outcomes
    assert json.loads(str(seen["codec"])) == [codec, codec]
    ds = RobotDataset(tmp_path / "ds")
    for e, r in enumerate(recorded):
        for key in CAMERAS:
            assert_frames_match(ds.episode(e).frames[key], r.frames[key])
