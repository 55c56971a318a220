"""The long soak of issue #7, run on demand: `pytest -m slow tests/test_soak.py` (about 10 minutes on 2 cores)."""

from __future__ import annotations

import json

import pytest
from worldstep.bench import main


@pytest.mark.slow
def test_500_windows_keep_pages_flat_and_rss_growth_under_5_percent(tmp_path):
    out = tmp_path / "soak.json"
    assert main(["soak", "--windows", "500", "--threads", "1", "--quiet", "--json", str(out),
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    result = json.loads(out.read_text())["results"]
    assert result["pages_flat"] is True
    assert result["pool_pages_after_close"] == 0
    assert result["rss_growth_pct"] < 5.0
