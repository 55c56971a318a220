"""The README runs as written: every python snippet and every CLI block, each in a fresh process in an empty
folder, as a new user would paste them.

Not run, by the rules below (each rule names why): blocks that need the real Cosmos3-Edge weights, `make` (the
test suite itself and the demo's install), and the 80-minute training and full fidelity runs. A new README block
runs unless it matches a rule, so the README cannot rot silently.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)

NOT_RUN = {  # a substring of a block -> why it does not run here
    "needs the Cosmos3-Edge weights": "needs the real Cosmos3-Edge weights",
    "huggingface-cli download": "downloads the real Cosmos3-Edge weights",
    "make demo": "make: installs the venv and runs the suite that runs this test",
    "worldstep train": "trains for 80 minutes",
}


def readme_blocks() -> list[tuple[str, str, str | None]]:
    """(language, code, the reason it is not run or None) for every fenced python/bash block."""
    text = (ROOT / "README.md").read_text()
    out = []
    for lang, code in BLOCK.findall(text):
        reason = next((why for key, why in NOT_RUN.items() if key in code), None)
        out.append((lang, code, reason))
    return out


BLOCKS = readme_blocks()
RUN = [(lang, code) for lang, code, reason in BLOCKS if reason is None]


def block_id(block: tuple[str, str]) -> str:
    lang, code = block
    first = next(line for line in code.splitlines() if line.strip() and not line.startswith("#"))
    return f"{lang}:{first[:40]}"


def test_the_readme_blocks_that_do_not_run_are_the_expected_ones():
    skipped = sorted(reason for _, _, reason in BLOCKS if reason is not None)
    assert skipped == sorted(["needs the real Cosmos3-Edge weights", "downloads the real Cosmos3-Edge weights",
                              "make: installs the venv and runs the suite that runs this test",
                              "trains for 80 minutes"])
    assert len(RUN) >= 5  # the pusher snippet, the API tour (3 blocks) and the CLI tour


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("readme_cache")


@pytest.mark.parametrize("block", RUN, ids=block_id)
def test_readme_block_runs_as_written(block, tmp_path, cache):
    lang, code = block
    env = {**os.environ, "WORLDSTEP_CACHE": str(cache),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"{code}\n--- stderr ---\n{proc.stderr[-4000:]}"
    if lang == "bash":
        assert (tmp_path / "rollout.mp4").is_file() and (tmp_path / "pusher.mp4").is_file()
        assert (tmp_path / "runs" / "eval" / "report.json").is_file()
