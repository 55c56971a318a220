"""The README and the usage pages it links run as written: every python snippet and every CLI block, each in a
fresh process in an empty folder, as a new user would paste them.

Not run, by the rules below (each rule names why): blocks that need the real Cosmos3-Edge weights and `make` (the
test suite itself and the demo's install). A new block in these pages runs unless it matches a rule, so they cannot
rot silently. (docs/fidelity/ holds the hour-long training and fidelity commands; it is not run.)
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

PAGES = ("README.md", "docs/usage.md", "docs/embodiments.md", "docs/viewing.md", "docs/observations.md",
         "docs/lerobot.md")
NOT_RUN = {  # a substring of a block -> why it does not run here
    "needs the Cosmos3-Edge weights": "needs the real Cosmos3-Edge weights",
    "huggingface-cli download": "downloads the real Cosmos3-Edge weights",
    "make demo": "make: installs the venv and runs the suite that runs this test",
    "lerobot-eval --policy.path": "LeRobot's own venv: tests/test_lerobot_eval.py runs it",
}
LEAVES = {  # a substring of a CLI block -> the files it must leave behind
    "worldstep eval episodes.yaml": ["rollout.mp4", "pusher.mp4", "runs/eval/report.json"],
    "--rerun-save run.rrd": ["live.mp4", "live.json", "run.rrd"],
    "--rerun-save tiny.rrd": ["tiny.rrd"],
    "worldstep serve --config pusher": ["serve.log", "train_ppo.py", "ppo_pusher.zip"],
    "worldstep replay --dataset pushsim-clips": ["pushsim-clips/meta/info.json", "runs/replay/report.json",
                                                 "runs/replay/psnr.png", "runs/replay/videos/episode-000.mp4"],
    "--lerobot-out imagined-pusher": ["pusher.mp4", "imagined-pusher/meta/info.json"],
    "worldstep eval pushsim-starts": ["runs/starts/report.json"],
}


EXPECTED = re.compile(r"\s*```text\n(.*?)^```", re.S | re.M)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def page_blocks() -> list[tuple[str, str, str, str | None]]:
    """(page, language, code, the reason it is not run or None) for every fenced python/bash block."""
    out = []
    for page in PAGES:
        for lang, code in BLOCK.findall((ROOT / page).read_text()):
            reason = next((why for key, why in NOT_RUN.items() if key in code), None)
            out.append((page, lang, code, reason))
    return out


def expected_outputs(page: str = "README.md") -> dict[str, str | None]:
    """Each python block of ``page`` -> the ```text block right after it (what it prints), or None."""
    text = (ROOT / page).read_text()
    out = {}
    for match in BLOCK.finditer(text):
        if match.group(1) == "python":
            shown = EXPECTED.match(text, match.end())
            out[match.group(2)] = shown.group(1) if shown else None
    return out


def matches(printed: str, expected: str) -> bool:
    """Line by line: ``...`` stands for anything (timings), integers are exact, decimals within 5% (a CPU's
    rounding), the rest verbatim."""
    lines, wanted = printed.strip().splitlines(), expected.strip().splitlines()
    if len(lines) != len(wanted):
        return False
    for line, want in zip(lines, wanted):
        pattern = "".join(".*" if part == "..." else re.escape(part) if not NUMBER.fullmatch(part) else
                          f"(?P<n{i}>-?\\d+(?:\\.\\d+)?)" for i, part in
                          enumerate(re.split(r"(\.\.\.|-?\d+(?:\.\d+)?)", want)) if part)
        found = re.fullmatch(pattern, line)
        if found is None:
            return False
        for key, value in found.groupdict().items():
            target = re.split(r"(\.\.\.|-?\d+(?:\.\d+)?)", want)[int(key[1:])]
            if "." in target and abs(float(value) - float(target)) > 0.05 * abs(float(target)):
                return False
            if "." not in target and value != target:
                return False
    return True


BLOCKS = page_blocks()
RUN = [(page, lang, code) for page, lang, code, reason in BLOCKS if reason is None]


def block_id(block: tuple[str, str, str]) -> str:
    page, lang, code = block
    first = next(line for line in code.splitlines() if line.strip() and not line.startswith("#"))
    return f"{page}:{lang}:{first[:40]}"


def test_the_blocks_that_do_not_run_are_the_expected_ones():
    skipped = sorted((page, reason) for page, _, _, reason in BLOCKS if reason is not None)
    assert skipped == sorted([("README.md", "needs the real Cosmos3-Edge weights"),
                              ("README.md", "downloads the real Cosmos3-Edge weights"),
                              ("README.md", "make: installs the venv and runs the suite that runs this test"),
                              ("docs/lerobot.md", "LeRobot's own venv: tests/test_lerobot_eval.py runs it")])
    assert sum(page == "README.md" for page, _, _ in RUN) >= 5  # three ways, serving, watch it live
    cli = [code for _, lang, code in RUN if lang == "bash"]
    assert all(any(key in code for key in LEAVES) for code in cli)  # every CLI block says what it leaves


def test_every_readme_snippet_that_prints_shows_its_output():
    shown = expected_outputs()
    assert [code.splitlines()[0] for code, out in shown.items() if "print(" in code and out is None] == []
    assert matches("(4, 64, 64, 3) 0 37 1.53 s\n", "(4, 64, 64, 3) 0 37 ... s")
    assert not matches("(4, 64, 64, 3) 0 38 1.53 s", "(4, 64, 64, 3) 0 37 ... s")  # a page count is exact
    assert matches("[23.525, 22.0107] False False", "[23.53, 22.01] False False")
    assert not matches("[19.1, 22.0] False False", "[23.53, 22.01] False False")
    assert not matches("0.0 0.0", "1.0 1.0")  # the snippet that printed 0.0 0.0 by design


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("readme_cache")


@pytest.mark.parametrize("block", RUN, ids=block_id)
def test_block_runs_as_written(block, tmp_path, cache):
    _, lang, code = block
    env = {**os.environ, "WORLDSTEP_CACHE": str(cache),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"{code}\n--- stderr ---\n{proc.stderr[-4000:]}"
    shown = expected_outputs(block[0]).get(code) if lang == "python" else None
    if shown is not None:
        assert matches(proc.stdout, shown), f"printed:\n{proc.stdout}\nthe page shows:\n{shown}"
    if lang == "bash":
        leaves = [name for key, names in LEAVES.items() if key in code for name in names]
        assert leaves and all((tmp_path / name).is_file() for name in leaves), leaves
