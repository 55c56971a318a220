"""examples/droid_two_cameras.py closes the loop on the tiny model: the remote policy sees both cameras and the
commanded state every window, and the state it sees next is the one its actions commanded."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from worldstep.envs.video import read_video

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = 3
LINE = re.compile(r"window (\d+): policy saw exterior (\(.*?\)) wrist (\(.*?\)) position (\[.*?\]) gripper (\S+); "
                  r"commanded position (\[.*?\]) gripper")


def test_droid_two_cameras_closes_the_loop(tmp_path):
    video = tmp_path / "droid.mp4"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "droid_two_cameras.py"), "--windows", str(WINDOWS),
                           "--out", str(video), "--height", "32", "--width", "32", "--num-steps", "1"],
                          env={**os.environ, "WORLDSTEP_CACHE": str(tmp_path / "cache")}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    windows = [m.groups() for m in LINE.finditer(proc.stdout)]
    assert [int(w[0]) for w in windows] == list(range(WINDOWS))
    for _, exterior, wrist, *_ in windows:  # both cameras, each half of the 32x32 frame
        assert ast.literal_eval(exterior) == ast.literal_eval(wrist) == (32, 16, 3)
    seen = [ast.literal_eval(w[3]) for w in windows]
    commanded = [ast.literal_eval(w[5]) for w in windows]
    assert seen[0] == [0.0, 0.0, 0.3]  # the reset state
    assert np.allclose(seen[1:], commanded[:-1], atol=1e-4)  # the policy sees the state its actions commanded
    assert [float(w[4]) for w in windows] == [0.0, 1.0, 1.0]  # the gripper it closed
    # the servo steps a quarter of the remaining way per action: the commanded state follows in closed form
    start, target = np.array([0.0, 0.0, 0.3]), np.array([0.2, -0.1, 0.15])
    want = target - (target - start) * 0.75 ** (4 * WINDOWS)
    assert np.allclose(commanded[-1], want, atol=1e-4)
    frames = read_video(video)
    assert frames.shape == (1 + 4 * WINDOWS, 32, 32, 3)  # both cameras side by side, every frame
