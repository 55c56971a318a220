"""worldstep reads LeRobot datasets (v3.0 as worldstep's writer lays them out, v2.1 hand-made; AV1 and H.264):
episodes, tasks, fps, cameras, action and state rows, frames per camera; refuses bad datasets and datasets that do
not fit the embodiment, naming what is wrong; streams episodes one at a time.

Datasets written by LeRobot's own code are read in tests/test_lerobot_interop.py.
"""

from __future__ import annotations

import json
import weakref

import numpy as np
import pytest
from lerobot_data import CAMERAS, assert_frames_match, episodes, write_v21, write_v30
from worldstep.lerobot import DatasetError, RobotDataset
from worldstep.lerobot import reader as reader_module
from worldstep.lerobot.fit import check_fits


@pytest.mark.parametrize("version,codec", [("v3.0", "av1"), ("v3.0", "h264"), ("v2.1", "av1"), ("v2.1", "h264")])
def test_reads_every_episode(tmp_path, version, codec):
    recorded = episodes([9, 6, 11])
    root = tmp_path / "ds"
    (write_v30 if version == "v3.0" else write_v21)(root, recorded, fps=15, codec=codec)
    ds = RobotDataset(root)
    assert (ds.info.version, ds.fps, ds.camera_keys, ds.action_width, ds.state_width) == (version, 15.0, CAMERAS, 10, 7)
    assert ds.num_episodes == 3 and sorted(set(ds.tasks.values())) == ["task 0", "task 1", "task 2"]
    for e, r in enumerate(recorded):
        episode = ds.episode(e)
        assert episode.task == r.task and episode.length == len(r.actions)
        np.testing.assert_array_equal(episode.actions, r.actions)
        np.testing.assert_array_equal(episode.state, r.state)
        np.testing.assert_allclose(episode.timestamps, np.arange(len(r.actions)) / 15, atol=1e-6)
        for key in CAMERAS:
            assert_frames_match(episode.frames[key], r.frames[key])


def test_one_camera_and_rows_alone(tmp_path):
    recorded = episodes([5, 7])
    ds = RobotDataset(write_v30(tmp_path / "ds", recorded, codec="h264"), cameras=[CAMERAS[1]])
    episode = ds.episode(1)
    assert list(episode.frames) == [CAMERAS[1]]
    assert_frames_match(episode.frames[CAMERAS[1]], recorded[1].frames[CAMERAS[1]])
    actions, state, _ = ds.rows(0)
    np.testing.assert_array_equal(actions, recorded[0].actions)


def test_hub_id_resolves_from_the_local_cache_only(tmp_path, monkeypatch):
    write_v30(tmp_path / "home" / "someone" / "pushes", episodes([5]), codec="h264")
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    assert RobotDataset("someone/pushes").num_episodes == 1
    with pytest.raises(FileNotFoundError, match="someone/absent.*not on disk"):
        RobotDataset("someone/absent")


@pytest.fixture
def small(tmp_path):
    return write_v30(tmp_path / "ds", episodes([5, 6]), codec="h264")


def edit_info(root, **changes):
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))


def test_refuses_missing_info(small):
    (small / "meta" / "info.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"meta/info.json does not exist"):
        RobotDataset(small)


def test_refuses_unknown_version(small):
    edit_info(small, codebase_version="v1.6")
    with pytest.raises(DatasetError, match=r"codebase_version='v1.6' is not supported; allowed: \['v2.1', 'v3.0'\]"):
        RobotDataset(small)


def test_refuses_absent_features(small):
    with pytest.raises(DatasetError, match=r"state_key='observation.joints' is not a feature"):
        RobotDataset(small, state_key="observation.joints")
    with pytest.raises(DatasetError, match=r"action_key='actions' is not a feature"):
        RobotDataset(small, action_key="actions")
    with pytest.raises(DatasetError, match=r"camera 'observation.images.top' is not a video feature"):
        RobotDataset(small, cameras=["observation.images.top"])


def test_refuses_undecodable_video(small):
    video = small / "videos" / CAMERAS[0] / "chunk-000" / "file-000.mp4"
    video.write_bytes(b"not an mp4 at all" * 100)
    ds = RobotDataset(small)
    with pytest.raises(DatasetError, match=r"file-000.mp4 cannot be decoded"):
        ds.episode(0)
    assert ds.rows(0)[0].shape == (5, 10)  # the dataset object stays usable


def test_refuses_video_shorter_than_its_episode(tmp_path):
    recorded = episodes([5, 6])
    root = write_v21(tmp_path / "ds", recorded, fps=15)
    from lerobot_data import encode

    encode(root / "videos" / "chunk-000" / CAMERAS[0] / "episode_000001.mp4", recorded[1].frames[CAMERAS[0]][:3],
           15, "h264")
    with pytest.raises(DatasetError, match=r"episode_000001.mp4 holds 3 frames.*needs 6"):
        RobotDataset(root).episode(1)


def test_mismatch_names_each_one(tmp_path):
    ds = RobotDataset(write_v30(tmp_path / "ds", episodes([3, 9, 4]), fps=15, codec="h264"))
    with pytest.raises(DatasetError) as caught:
        check_fits(ds, fps=24, action_width=2, chunk=4, cameras=["observation.images.top", CAMERAS[0]])
    message = str(caught.value)
    assert "fps: the dataset records 15 frames per second; the embodiment runs at 24" in message
    assert "action width: the dataset's 'action' rows have 10 numbers; the embodiment takes 2" in message
    assert "camera key: 'observation.images.top'" in message and f"{CAMERAS[0]!r} is not" not in message
    assert "2 episode(s) are shorter than one window (5 frames" in message and "0 (3 frames), 2 (4 frames)" in message
    check_fits(ds, fps=15, action_width=10, chunk=2, cameras=list(CAMERAS))  # fits: no error


def test_refuses_bad_episode_index(small):
    ds = RobotDataset(small)
    for bad in (2, -1, True, "0"):
        with pytest.raises(ValueError, match="episode=.* is invalid; allowed: 0 .. 1"):
            ds.episode(bad)


def test_twenty_episodes_stream_one_at_a_time(tmp_path, monkeypatch):
    """Replaying 20 episodes holds at most one episode's frames: every decoded clip is tracked by a weak
    reference, and when a clip is decoded no clip of another episode is still alive."""
    ds = RobotDataset(write_v30(tmp_path / "ds", episodes([5] * 20), codec="h264"))
    alive: list[tuple[int, weakref.ref]] = []
    peak = []
    decode = reader_module.decode_span

    def counting(path, from_s, count, fps):
        clip = decode(path, from_s, count, fps)
        episode = round(from_s * fps) // 5
        others = {e for e, ref in alive if ref() is not None and e != episode}
        peak.append(len(others))
        alive.append((episode, weakref.ref(clip)))
        return clip

    monkeypatch.setattr(reader_module, "decode_span", counting)

    def replay_one(index):  # a consumer that lets each episode go, as replay does
        episode = ds.episode(index)
        return float(episode.frames[CAMERAS[0]].mean())

    means = [replay_one(i) for i in range(ds.num_episodes)]
    assert len(means) == 20 and len(peak) == 40
    assert max(peak) == 0, peak
    # the check can fail: a consumer that keeps its episodes holds every earlier one
    kept = [ds.episode(i) for i in range(3)]
    assert peak[-1] == 2 and len(kept) == 3
