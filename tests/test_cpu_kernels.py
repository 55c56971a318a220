"""The exactness subset again, under the other CPU kernel selections this machine can run.

torch dispatches many kernels by the CPU's instruction set (`ATEN_CPU_CAPABILITY`) and oneDNN by its own
(`ONEDNN_MAX_CPU_ISA`); an Intel Xeon and an AMD EPYC may pick differently, and so may the next CI machine.
Rerunning the tests marked `exactness` with the choice forced lower proves that every claim they check
(bit-exact by construction, or within its stated bound: docs/exactness.md) holds whatever the CPU selects,
not only on the machine that ran the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
SELECTIONS = {
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
}


@pytest.mark.parametrize("selection", sorted(SELECTIONS))
def test_exactness_claims_hold_under_other_kernel_selections(selection, tmp_path):
    env = {**os.environ, **SELECTIONS[selection], "WORLDSTEP_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "exactness", str(TESTS)]
    done = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=900)
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, f"{selection}: exactness subset failed\n{tail}"
    assert " passed" in done.stdout and " failed" not in done.stdout, tail


def test_the_exactness_subset_is_not_empty():
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "-m", "exactness", str(TESTS)]
    done = subprocess.run(cmd, cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    files = {line.split("::")[0] for line in collected}
    # the decoder, the attention backend, batched engine steps and the vector env are all covered
    assert {"tests/test_vae_decoder_exact.py", "tests/test_attention.py", "tests/test_cosmos3_session.py",
            "tests/test_env_vector.py"} <= files, sorted(files)
