"""The GPU checks' own logic, on the CPU: a NaN or inf never passes, no CUDA is a failure, the rows are built.

The checks (`tests/gpu/check_*.py`) run for real only on a GPU machine (`make gpu-check`); here their CPU
path (`--device cpu --tiny`, the dry run's) runs, and the defects of the earlier checks are pinned: a
NaN passed through `max(worst, nan)`, a NaN sdpa reference passed, and no CUDA exited 0.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import check_attention  # noqa: E402
import check_cosmos3_backends  # noqa: E402
from figures import rel_diff, within  # noqa: E402

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real checks")


def test_rel_diff_is_inf_for_nan_or_inf_and_never_within():
    a = torch.ones(4)
    for bad in (float("nan"), float("inf"), -float("inf")):
        b = a.clone()
        b[2] = bad
        assert rel_diff(b, a) == math.inf and rel_diff(a, b) == math.inf
    assert rel_diff(a * 1.01, a) == pytest.approx(0.01, rel=1e-4)
    assert not within(float("nan"), 1.0) and not within(math.inf, 1.0) and within(0.5, 1.0)


@NO_CUDA
@pytest.mark.parametrize("check", [check_attention, check_cosmos3_backends])
def test_no_cuda_is_a_failure_not_a_pass(check, tmp_path):
    assert check.main(["--out", str(tmp_path)]) == 1
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["ok"] is False and "CUDA" in doc["reason"]


def _attention(tmp_path) -> tuple[int, dict]:
    rc = check_attention.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    return rc, json.loads((tmp_path / "attention.json").read_text())


def test_attention_check_rows_and_bound_on_cpu(tmp_path):
    rc, doc = _attention(tmp_path)
    assert rc == 0 and doc["ok"] is True and doc["dry_run"] is True
    rows = {r["row"]: r for r in doc["rows_before"]}
    assert rows["main"]["released"] > 0 and rows["fork"]["released"] > 0  # pages behind the horizon went back
    assert rows["no_context"]["committed"] == 0 and rows["text_only"]["committed"] < doc["geometry"]["page_size"]
    after = {r["row"]: r for r in doc["rows_after"]}
    assert after["main"]["released"] > rows["main"]["released"]  # the commit between the phases released more
    assert {r["phase"] for r in doc["results"]} == {"steady", "after_release"}
    assert all(0 < r["sdpa_vs_reference"] <= check_attention.BOUND for r in doc["results"])


def test_attention_check_fails_on_nan_from_a_backend(tmp_path, monkeypatch):
    real = check_attention.paged_attention

    def nan_layer_one(q, k_new, v_new, batch, layer):
        out = real(q, k_new, v_new, batch, layer)
        return out.fill_(float("nan")) if layer == 1 else out

    monkeypatch.setattr(check_attention, "paged_attention", nan_layer_one)
    rc, doc = _attention(tmp_path)
    assert rc == 1 and doc["ok"] is False and doc["worst"]["sdpa_vs_reference"] is None  # inf, written as null


def test_attention_check_fails_when_the_reference_is_nan(tmp_path, monkeypatch):
    real = check_attention.reference
    monkeypatch.setattr(check_attention, "reference", lambda *a: real(*a).fill_(float("nan")))
    rc, doc = _attention(tmp_path)
    assert rc == 1 and not any(r["reference_finite"] for r in doc["results"])


def test_cosmos3_comparison_fails_on_nan():
    ref = [torch.ones(2, 3), torch.ones(2, 3)]
    bad = [torch.ones(2, 3), torch.full((2, 3), float("nan"))]
    rows = check_cosmos3_backends.compare(ref, bad, bound=0.5)
    assert [r["ok"] for r in rows] == [True, False] and rows[1]["finite"] is False
