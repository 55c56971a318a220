"""worldstep's LeRobot v3.0 writer: bad input refused before anything is written, naming the argument, with the
writer still usable; everything written comes back (no open files, no hidden folder) on close and on abort."""

from __future__ import annotations

import gc
import os

import pytest
from lerobot_data import CAMERAS, assert_frames_match, episodes
from worldstep.lerobot import RobotDataset
from worldstep.lerobot.writer import DatasetWriter

SIZES = {k: (48, 64) for k in CAMERAS}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kwargs, match", [
    ({"fps": 0}, "fps=0 is invalid"), ({"fps": 15.0}, "fps=15.0 is invalid"),
    ({"codec": "vp9"}, r"codec='vp9' is invalid; allowed: \['av1', 'h264'\]"),
    ({"cameras": {}}, "cameras={} is invalid"), ({"cameras": {"observation.image": (47, 64)}}, "even"),
    ({"action_width": 0}, "action_width=0 is invalid"), ({"crf": 60}, "crf=60 is invalid"),
    ({"pix_fmt": "rgb24"}, "pix_fmt='rgb24' is invalid"),
])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, kwargs, match):
    args = {"fps": 15, "cameras": SIZES, "action_width": 10, "state_width": 7, **kwargs}
    with pytest.raises(ValueError, match=match):
        DatasetWriter(tmp_path / "ds", **args)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_refused(tmp_path):
    (tmp_path / "ds").mkdir()
    with pytest.raises(ValueError, match="root=.* is invalid: it exists"):
        DatasetWriter(tmp_path / "ds", fps=15, cameras=SIZES, action_width=10)


def test_a_refused_episode_changes_nothing_and_the_writer_goes_on(tmp_path):
    good, other = episodes([5, 6], seed=1)
    writer = DatasetWriter(tmp_path / "ds", fps=15, cameras=SIZES, action_width=10, state_width=7, codec="h264")
    writer.add_episode(frames=good.frames, actions=good.actions, state=good.state, task=good.task)
    bad = [({"frames": {CAMERAS[0]: other.frames[CAMERAS[0]]}}, "frames keys"),
           ({"frames": {**other.frames, CAMERAS[1]: other.frames[CAMERAS[1]][:, :40]}}, r"frames\['observation"),
           ({"actions": other.actions[:, :3]}, r"actions.shape=\(6, 3\) is invalid"),
           ({"state": other.state[:4]}, "state of shape"), ({"task": " "}, "task=' ' is invalid"),
           ({"success": "yes"}, "success='yes' is invalid")]
    for change, match in bad:
        args = {"frames": other.frames, "actions": other.actions, "state": other.state, "task": other.task, **change}
        with pytest.raises(ValueError, match=match):
            writer.add_episode(**args)
    writer.add_episode(frames=other.frames, actions=other.actions, state=other.state, task=other.task, success=True)
    writer.close()
    ds = RobotDataset(tmp_path / "ds")
    assert ds.num_episodes == 2 and [s.length for s in ds.spans] == [5, 6]
    assert_frames_match(ds.episode(1).frames[CAMERAS[1]], other.frames[CAMERAS[1]])
    with pytest.raises(ValueError, match="closed"):
        writer.add_episode(frames=good.frames, actions=good.actions, state=good.state, task=good.task)


def test_files_come_back_on_close_abort_and_reads(tmp_path):
    before = open_fds()
    recorded = episodes([5] * 4, seed=2)
    writer = DatasetWriter(tmp_path / "ds", fps=15, cameras=SIZES, action_width=10, state_width=7, codec="h264")
    for r in recorded:
        writer.add_episode(frames=r.frames, actions=r.actions, state=r.state, task=r.task)
    assert open_fds() > before  # the two videos are open while episodes arrive
    writer.close()
    assert open_fds() == before
    aborted = DatasetWriter(tmp_path / "gone", fps=15, cameras=SIZES, action_width=10, state_width=7, codec="h264")
    aborted.add_episode(frames=recorded[0].frames, actions=recorded[0].actions, state=recorded[0].state, task="x")
    aborted.abort()
    assert open_fds() == before and sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    ds = RobotDataset(tmp_path / "ds")
    ds.episode(0)  # the first parquet read starts pyarrow's thread pools, which keep their descriptors
    warm = open_fds()
    for _ in range(3):
        for i in range(ds.num_episodes):
            ds.episode(i)
    assert open_fds() == warm
    (tmp_path / "ds" / "videos" / CAMERAS[0] / "chunk-000" / "file-000.mp4").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="cannot be decoded"):
        ds.episode(0)  # the first failed open may start what FFmpeg's error path keeps (once per process)
    gc.collect()
    failing = open_fds()
    assert failing <= warm + 1
    for _ in range(3):
        with pytest.raises(ValueError, match="cannot be decoded"):
            ds.episode(0)
    gc.collect()
    assert open_fds() == failing  # no descriptor per failed read


def test_close_without_episodes_leaves_nothing(tmp_path):
    writer = DatasetWriter(tmp_path / "ds", fps=15, cameras=SIZES, action_width=10)
    with pytest.raises(ValueError, match="no episode was added"):
        writer.close()
    assert list(tmp_path.iterdir()) == []


def test_the_av1_encoder_prints_nothing_unless_asked(tmp_path):
    """--quiet was not quiet: SVT-AV1 printed its banner and preset notes (~25 lines) per encoder. Shown failing by
    removing the writer's SVT_LOG default."""
    import subprocess
    import sys

    code = ("import sys, numpy as np\nfrom pathlib import Path\nfrom worldstep.lerobot.writer import _Video\n"
            "v = _Video(Path(sys.argv[1]) / 'v.mp4', 'av1', 10, 64, 64, 30, 'yuv420p')\n"
            "v.add(np.zeros((4, 64, 64, 3), np.uint8))\nv.close()\n")
    env = {k: v for k, v in os.environ.items() if k != "SVT_LOG"}
    quiet = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                           timeout=300)
    assert quiet.returncode == 0 and "Svt[" not in quiet.stdout + quiet.stderr, quiet.stderr
    told = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          env={**env, "SVT_LOG": "3"}, timeout=300)
    assert "Svt[info]" in told.stdout + told.stderr  # the user's own setting wins
