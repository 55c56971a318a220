"""Every line of the GPU-facing modules that the focused CPU run never executes is accounted for.

`tests/gpu/cuda_lines.py` runs its `SUBSET` under coverage.py and keys each line of the GPU-facing modules it
misses by (file, function, stripped source); `tests/gpu/cuda_only_lines.txt` must name each of them, next to
where it runs instead (a step of the GPU run, or the CPU path outside the subset). A new line the CPU never
runs, and no entry names, fails here; so does an entry whose line the subset now runs (the list stays exact).
The measurement runs the subset once more, in a subprocess (about 55 s on the 2-core box).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

GPU = Path(__file__).parent / "gpu"
sys.path.insert(0, str(GPU))
import cuda_lines  # noqa: E402

STEPS = set(re.findall(r"\[(\w+)\]=\d+", re.search(r"declare -A LIMIT=\((.*?)\)\n",
                                                    (GPU / "run_gpu_checks.sh").read_text(), re.S).group(1)))


def test_every_line_the_cpu_subset_misses_is_listed_next_to_where_it_runs(tmp_path):
    uncovered = cuda_lines.measure(tmp_path / "coverage.data")
    listed = cuda_lines.read_list()
    missing, stale = cuda_lines.unaccounted(uncovered, listed)
    assert not missing, "lines the CPU never runs and cuda_only_lines.txt does not name (add each, with where it " \
                        "runs, or a CPU test that runs it):\n" + "\n".join(cuda_lines.SEP.join(k) for k in missing)
    assert not stale, "entries whose line the CPU subset now runs (remove them):\n" + "\n".join(
        cuda_lines.SEP.join(k) for k in stale)
    for key, wheres in listed.items():
        for where in wheres:
            assert where.startswith(("gpu: ", "cpu: ")), (key, where)
            if where.startswith("gpu: "):
                named = set(re.findall(r"\b([a-z_]+)\b", where.split("(")[0].removeprefix("gpu: ")))
                assert named and named <= STEPS, (key, where)  # a step the GPU run has


def test_the_accounting_fails_on_an_injected_unlisted_line(tmp_path):
    """A synthetic module: the injected uncovered line is reported until the list names it, then the entry is
    stale once the line runs."""
    module = tmp_path / "engine" / "lanes.py"
    module.parent.mkdir()
    module.write_text("import torch\n\n\nclass Lane:\n    def run(self):\n        if torch.cuda.is_available():\n"
                      "            torch.cuda.synchronize()  # injected\n        return 1\n")
    uncovered = cuda_lines.keys_of(module, {7}, tmp_path)
    key = ("engine/lanes.py", "Lane.run", "torch.cuda.synchronize()  # injected")
    assert uncovered == Counter({key: 1})
    assert cuda_lines.unaccounted(uncovered, {}) == ([key], [])
    assert cuda_lines.unaccounted(uncovered, {key: ["gpu: smoke"]}) == ([], [])
    assert cuda_lines.unaccounted(Counter(), {key: ["gpu: smoke"]}) == ([], [key])


def test_a_key_does_not_move_with_its_line_number(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    return 1\n")
    before = cuda_lines.keys_of(path, {2}, tmp_path)
    path.write_text("import os\n\n\ndef f():\n    return 1\n")
    assert cuda_lines.keys_of(path, {5}, tmp_path) == before == Counter({("m.py", "f", "return 1"): 1})


def test_the_list_reads_a_source_holding_the_separator(tmp_path):
    path = tmp_path / "list.txt"
    path.write_text("# comment\nengine/a.py | f | x = a | b | gpu: smoke\nengine/a.py | f | x = a | b | cpu: twice\n")
    assert cuda_lines.read_list(path) == {("engine/a.py", "f", "x = a | b"): ["gpu: smoke", "cpu: twice"]}


@pytest.mark.parametrize("module", ["engine/lanes.py", "engine/attention.py", "sdk/bench/gpu_memory.py"])
def test_the_gpu_facing_modules_are_found(module):
    assert cuda_lines.ROOT / module in cuda_lines.gpu_facing()
