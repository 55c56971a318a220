"""LeRobot's own video reader decodes what worldstep writes: LeRobot 0.4.4's ``LeRobotDataset`` with its default
backend, torchcodec, over a v3.0 dataset of worldstep's ``DatasetWriter``, H.264 and AV1.

Every row's frame is the source frame within the codec's bound, in order (a frame off by one is nearest its
neighbour's source: ``assert_frames_match``), and equals worldstep's own PyAV decode exactly: both decoders
run FFmpeg 7.1 (torchcodec loads the av wheel's bundled copy, linked by the Makefile), so LeRobot trains on the
pixels worldstep scores. Missing libraries fail the test with what to run.
"""

from __future__ import annotations

import numpy as np
import pytest
from lerobot_data import CAMERAS, assert_frames_match, episodes, run_lerobot
from worldstep.lerobot import RobotDataset
from worldstep.lerobot.writer import DatasetWriter


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_lerobot_torchcodec_decodes_worldsteps_videos(tmp_path, codec):
    recorded = episodes([7, 10], seed=11)
    with DatasetWriter(tmp_path / "ds", fps=15, cameras={k: (48, 64) for k in CAMERAS}, action_width=10,
                       state_width=7, codec=codec) as writer:
        for r in recorded:
            writer.add_episode(frames=r.frames, actions=r.actions, state=r.state, task=r.task)
    run_lerobot("v3.0", "decode", tmp_path / "ds", tmp_path / "out.npz")
    seen = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(seen["episode_index"], [0] * 7 + [1] * 10)
    ds = RobotDataset(tmp_path / "ds")
    for key in CAMERAS:
        by_lerobot = np.split(seen[key], [7])
        for e, r in enumerate(recorded):
            assert_frames_match(by_lerobot[e], r.frames[key])
            np.testing.assert_array_equal(by_lerobot[e], ds.episode(e).frames[key])
