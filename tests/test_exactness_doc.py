"""Every bit-exact comparison in the suite is accounted for in docs/exactness.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
EXACT_CALL = re.compile(r"\b(torch\.equal|np\.array_equal|assert_array_equal)\(")


def test_every_test_file_that_compares_bit_for_bit_is_justified_in_the_exactness_doc():
    doc = (ROOT / "docs" / "exactness.md").read_text()
    exact_files = sorted(
        f"tests/{p.name}" for p in (ROOT / "tests").glob("*.py")
        if p.name != Path(__file__).name and EXACT_CALL.search(p.read_text())
    )
    assert exact_files, "the pattern finds nothing: it is broken"
    missing = [f for f in exact_files if f not in doc]
    assert not missing, f"bit-exact comparisons without a justification in docs/exactness.md: {missing}"


def test_no_test_asserts_a_duration():
    timed = re.compile(r"assert[^\n]*(perf_counter|monotonic|time\.time)\(\)")
    offenders = [p.name for p in (ROOT / "tests").glob("*.py") if timed.search(p.read_text())]
    assert not offenders, f"timing asserts depend on load: {offenders}"
