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

    def nan_layer_one(q, k_new, v_new, forward, layer):
        out = real(q, k_new, v_new, forward, layer)
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


def test_smoke_runs_each_backend_and_records_a_failing_one(tmp_path, monkeypatch):
    """The smoke on the CPU with flashinfer emulated (tests/flashinfer_emulation.py): both backends reset, step,
    fork and close with every page back; a backend that raises is recorded and the other still runs."""
    import check_smoke
    import flashinfer_emulation

    monkeypatch.setenv("WORLDSTEP_CACHE", str(tmp_path / "cache"))
    flashinfer_emulation.install(monkeypatch)
    monkeypatch.setattr("worldstep.engine.attention.flashinfer_problems", lambda *a: [])
    assert check_smoke.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert {name: (r["backend"], r["pages_after_close"]) for name, r in doc["backends"].items()} == {
        "sdpa": ("sdpa", 0), "flashinfer": ("flashinfer", 0)}
    assert flashinfer_emulation.COUNTS["runs"] > 0
    real = check_smoke.smoke

    def broken(device, backend):
        if backend == "sdpa":
            raise RuntimeError("injected: CUDA error: an illegal memory access")
        return real(device, backend)

    monkeypatch.setattr(check_smoke, "smoke", broken)
    assert check_smoke.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert doc["backends"]["sdpa"]["error"] == "RuntimeError: injected: CUDA error: an illegal memory access"
    assert doc["backends"]["flashinfer"]["ok"] is True and doc["ok"] is False


def test_smoke_says_why_flashinfer_did_not_run(tmp_path, monkeypatch):
    import check_smoke

    monkeypatch.setenv("WORLDSTEP_CACHE", str(tmp_path / "cache"))
    assert check_smoke.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    flashinfer = json.loads((tmp_path / "smoke.json").read_text())["backends"]["flashinfer"]
    assert flashinfer == {"ran": False, "ok": None, "reason": "not run: it needs a CUDA device, got device='cpu'"}


def test_parity_with_diffusers_on_cpu_and_a_mismatch_fails(tmp_path, monkeypatch):
    """The same modules, inputs and seed: worldstep's window and the pipeline's agree (bf16, tiny) far inside the
    reasoned bound; a worldstep window drawn from other noise (another seed) fails the check."""
    import check_parity_diffusers as check

    assert check.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "parity_diffusers.json").read_text())
    sdpa = doc["backends"]["sdpa"]
    assert sdpa["ran"] and sdpa["measured"] < check.WINDOW_BOUND / 10 and doc["bound_reasoned"] is True
    assert doc["diffusers_abs_max"] > 0.1 and "not run" in doc["backends"]["flashinfer"]["reason"]
    real = check.worldstep_window

    def other_noise(*args):
        with monkeypatch.context() as m:
            m.setattr(check, "SEED", check.SEED + 1)
            return real(*args)

    monkeypatch.setattr(check, "worldstep_window", other_noise)
    assert check.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 1
    assert json.loads((tmp_path / "parity_diffusers.json").read_text())["backends"]["sdpa"]["ok"] is False
