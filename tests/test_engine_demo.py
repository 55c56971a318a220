"""examples/engine_demo.py runs, and a sliding stream's pages stay flat past the context horizon."""

import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "examples" / "engine_demo.py"


def test_engine_demo_pages_flat_after_horizon():
    result = subprocess.run(
        [sys.executable, str(DEMO), "--windows", "100", "--window-units", "2", "--context-units", "6"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    pages = [int(m) for m in re.findall(r"pages_in_use\s+(\d+)", result.stdout)]
    assert len(pages) == 100
    horizon = 6 // 2  # windows until the context is full
    assert pages[:horizon] == sorted(pages[:horizon]) and pages[0] < pages[horizon]
    assert set(pages[horizon:]) == {pages[horizon]}  # flat: memory does not grow with the rollout
    assert max(pages) == pages[-1]
