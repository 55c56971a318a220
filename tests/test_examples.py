"""Every example runs end to end with tiny flags (cleanrl-style subprocess smoke tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--height", "32", "--width", "32", "--num-steps", "1"]

EXAMPLES = {
    "action_loop.py": ["--windows", "1", "--out", "{tmp}"],
    "evaluate_policy.py": ["--episodes", "2", "--windows", "1", "--out", "{tmp}"],
    "closed_loop_sim.py": ["--windows", "1", "--out", "{tmp}/closed.mp4"],
    "best_of_n.py": ["--windows", "1", "--candidates", "2", "--out", "{tmp}/best.mp4"],
    "planning.py": ["--episodes", "1", "--windows", "1", "--candidates", "2", "--out", "{tmp}"],
}
# the pusher's simulator draws 64x64 frames, so its examples keep the model's frame size
SIZE_FIXED = {"planning.py"}


@pytest.fixture(scope="module")
def env_vars(tmp_path_factory):
    return {**os.environ, "WORLDSTEP_CACHE": str(tmp_path_factory.mktemp("cache"))}


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script, tmp_path, env_vars):
    flags = [f.format(tmp=tmp_path) for f in EXAMPLES[script]]
    tiny = TINY[-2:] if script in SIZE_FIXED else TINY
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *flags, *tiny],
                          env=env_vars, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp_path.rglob("*.mp4")), f"{script} wrote no video"


def test_examples_use_only_the_public_api():
    for script in EXAMPLES:
        text = (ROOT / "examples" / script).read_text()
        assert "worldstep.engine" not in text and "from worldstep.world" not in text and "._" not in text, script
