"""The GPU run survives its own failures, on the CPU: what `run_gpu_checks.sh` and `steps.sh` promise.

- The steps' limits add up to the 520 s budget, and tests/gpu/README.md's table says the same limits.
- A step whose memory plan exceeds the device's free memory is skipped with the reason (a stand-in
  `nvidia-smi` reports the free memory), and the next step still runs.
- A failed step's error is in summary.json: a bench's per-section errors, else the last error line of its log.
- `GPU_CHECK_INJECT` replaces a step by a failure (the dry run's proof), and the later steps still report.
- `GPU_CHECK_SKIP` leaves steps out by name (a rerun of what failed), and `GPU_CHECK_ARCHIVE` packs everything
  under `$OUT` into one file after every step (the device tool returns only a few files).
- Python's output reaches a step's log unbuffered, so a step killed at its limit still says how far it got.
- Every step writes its own file (no two steps share one), the smoke comes first, and the run sets
  `TVM_FFI_DISABLE_TORCH_C_DLPACK=1`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

GPU = Path(__file__).parent / "gpu"
SCRIPT = (GPU / "run_gpu_checks.sh").read_text()
sys.path.insert(0, str(GPU))
import summary  # noqa: E402


def _table(name: str) -> dict[str, int]:
    block = re.search(rf"declare -A {name}=\((.*?)\)\n", SCRIPT, re.S).group(1)
    return {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", block)}


def _run_order() -> list[str]:
    return re.findall(r"^run (\w+) ", SCRIPT, re.M)


def test_the_limits_add_up_to_the_budget_and_the_readme_says_them():
    limits, budget = _table("LIMIT"), int(re.search(r"GPU_CHECK_BUDGET_S:-(\d+)", SCRIPT).group(1))
    assert sum(limits.values()) == budget == 520
    assert _run_order() == list(limits), "every step runs once, in the table's order"
    readme = (GPU / "README.md").read_text()
    rows = dict(re.findall(r"^\| (\w+) \| (\d+) s \|", readme, re.M))
    assert {k: int(v) for k, v in rows.items()} == limits
    assert re.search(rf"\| \*\*total\*\* \| \*\*{budget} s\*\* \|", readme)
    assert "H100 80 GB" in readme and "H200 141 GB" in readme


def test_every_step_writes_its_own_file_and_the_smoke_comes_first():
    order = _run_order()
    assert order[:2] == ["setup", "smoke"]
    assert set(order) - {"setup"} == set(summary.STEP_FILES)
    outputs = re.findall(r'--json "\$OUT/(\S+?)"', SCRIPT)
    assert len(outputs) == len(set(outputs)) == 3
    assert len(set(summary.STEP_FILES.values())) == len(summary.STEP_FILES)
    assert "tests/test_attention.py" not in SCRIPT  # it re-ran check_attention.py and overwrote attention.json
    assert "export TVM_FFI_DISABLE_TORCH_C_DLPACK=1" in SCRIPT
    assert "export PYTHONUNBUFFERED=1" in SCRIPT
    assert set(_table("PLAN_GIB")) <= set(_table("LIMIT"))


def _steps(tmp_path, script: str, free_mib: int | str | None = None, env: dict | None = None):
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    path = os.environ["PATH"]
    if free_mib is not None:  # a stand-in nvidia-smi that reports the free memory
        bin_ = tmp_path / "bin"
        bin_.mkdir()
        (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\necho {free_mib}\n")
        (bin_ / "nvidia-smi").chmod(0o755)
        path = f"{bin_}:{path}"
    else:
        path = ":".join(p for p in path.split(":") if not (Path(p) / "nvidia-smi").exists())
    full = {**os.environ, "PATH": path, "OUT": str(out), "BUDGET": "100", "T0": str(int(time.time())),
            "BASE_PY": sys.executable, "DEVICE": "cpu", **(env or {})}
    run = subprocess.run(["bash", "-c", f"set -uo pipefail; declare -A LIMIT=([a]=20 [b]=20 [c]=20); {script}"],
                         env=full, capture_output=True, text=True, timeout=120)
    return run, out


def _run_steps(tmp_path, body: str, plan: str = "", **kwargs):
    script = f"declare -A PLAN_GIB=({plan}); source {GPU / 'steps.sh'}; {body}; summarize --final"
    run, out = _steps(tmp_path, script, **kwargs)
    assert "summary.json could not be written" not in run.stderr, run.stderr
    return run, json.loads((out / "summary.json").read_text())


def test_a_step_whose_plan_does_not_fit_is_skipped_with_the_reason_and_the_next_runs(tmp_path):
    run, doc = _run_steps(tmp_path, "run a true; run b true", plan="[a]=60 [b]=4", free_mib=10 * 1024)
    a, b = doc["steps"]
    assert a["skipped"] is True and a["error"] == "its memory plan is 60 GiB and the device has 10 GiB free"
    assert b["step"] == "b" and b["rc"] == 0 and "error" not in b
    assert doc["ok"] is False and "its memory plan is 60 GiB" in run.stdout


def test_without_nvidia_smi_nothing_is_checked(tmp_path):
    _, doc = _run_steps(tmp_path, "run a true", plan="[a]=10000")
    assert doc["steps"][0]["rc"] == 0 and doc["ok"] is True


def test_a_free_memory_nvidia_smi_cannot_tell_checks_nothing(tmp_path):
    """A MIG slice reports "[N/A]": no figure, so no step is skipped for want of memory."""
    _, doc = _run_steps(tmp_path, "run a true", plan="[a]=60", free_mib="[N/A]")
    assert doc["steps"][0]["rc"] == 0 and doc["ok"] is True


def test_an_injected_failure_is_reported_and_the_later_steps_still_run(tmp_path):
    _, doc = _run_steps(tmp_path, "run a true; run b true; run c true", env={"GPU_CHECK_INJECT": "b"})
    assert [(s["step"], s["rc"]) for s in doc["steps"]] == [("a", 0), ("b", 1), ("c", 0)]
    assert doc["steps"][1]["error"] == "RuntimeError: injected failure of b (GPU_CHECK_INJECT)"
    assert doc["ok"] is False and doc["finished"] is True


def test_a_failed_steps_error_is_the_last_error_line_of_its_log(tmp_path):
    body = ("run a bash -c 'echo loading; echo \"ValueError: q must be torch.bfloat16 on cuda:0\" >&2; "
            "echo done; exit 3'")
    _, doc = _run_steps(tmp_path, body)
    assert doc["steps"][0]["error"] == "ValueError: q must be torch.bfloat16 on cuda:0"


def test_a_bench_sections_errors_are_named_in_the_summary(tmp_path):
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    bench = {"results": {"device_name": "NVIDIA H100 80GB HBM3", "section_s": {"backends": 1.0},
                         "errors": {"backends": "RuntimeError: flashinfer modules missing\nmore"}}}
    (out / "bench_gpu_more.json").write_text(json.dumps(bench))
    (out / "steps.jsonl").write_text(json.dumps({"step": "bench_more", "rc": 1, "timed_out": False}) + "\n")
    doc = summary.summarize(out, "cuda", 5, 1, final=True)
    assert doc["steps"][0]["error"] == "backends: RuntimeError: flashinfer modules missing"
    assert doc["device_name"] == "NVIDIA H100 80GB HBM3"


def test_the_summary_reads_a_check_whose_results_are_a_list(tmp_path):
    """attention.json's ``results`` is a list of rows (the dry run once failed to write summary.json on it)."""
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "attention.json").write_text(json.dumps({"device_name": "cpu", "ok": False, "results": [{"ok": False}]}))
    (out / "logs" / "attention.log").write_text("FAIL steady step 0 layer 1\nattention: FAILED\n")
    (out / "steps.jsonl").write_text(json.dumps({"step": "attention", "rc": 1, "timed_out": False}) + "\n")
    doc = summary.summarize(out, "cpu", 5, 1, final=True)
    assert doc["steps"][0]["error"] == "attention: FAILED" and doc["device_name"] == "cpu"


def test_a_step_named_in_gpu_check_skip_is_recorded_as_skipped_and_the_rest_run(tmp_path):
    run, doc = _run_steps(tmp_path, "run a true; run b false; run c true", env={"GPU_CHECK_SKIP": "b c"})
    assert [(s["step"], s.get("skipped", False)) for s in doc["steps"]] == [("a", False), ("b", True), ("c", True)]
    assert doc["steps"][1]["error"] == "named in GPU_CHECK_SKIP"
    _, doc = _run_steps(tmp_path / "again", "run a true; run b true", env={"GPU_CHECK_SKIP": "ab bc"})
    assert [s.get("skipped", False) for s in doc["steps"]] == [False, False], "names match whole, not in part"


def test_the_archive_holds_every_file_under_out_after_each_step(tmp_path):
    import tarfile

    archive = tmp_path / "all.tar.gz"
    body = "run a bash -c 'echo {} > $OUT/a.json'; run b bash -c 'echo {} > $OUT/b.json'"
    _run_steps(tmp_path, body, env={"GPU_CHECK_ARCHIVE": str(archive)})
    with tarfile.open(archive) as tar:
        names = {Path(n).as_posix().lstrip("./") for n in tar.getnames()}
    assert {"a.json", "b.json", "summary.json", "steps.jsonl", "logs/a.log", "logs/b.log"} <= names
    assert not (tmp_path / "all.tar.gz.tmp").exists()


def test_the_device_command_returns_the_summary_and_one_archive_of_everything(tmp_path):
    """`device_run.sh`, the one command for a lent GPU: the tool's $OUT gets summary.json and the archive only
    (the H200's first call got back 8 of the run's files); the run's own files stay in the scratch folder."""
    import tarfile

    kit, back, scratch = tmp_path / "kit", tmp_path / "back", tmp_path / "scratch"
    kit.mkdir()
    (kit / "MANIFEST.json").write_text("{}")
    env = {**os.environ, "OUT": str(back), "GPU_KIT": str(kit), "GPU_CHECK_SCRATCH": str(scratch),
           "GPU_CHECK_BUDGET_S": "15", "BASE_PY": sys.executable, "WORK": str(tmp_path / "work")}
    run = subprocess.run([str(GPU / "device_run.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]  # every step skipped: 15 s < 20 s to start
    assert sorted(p.name for p in back.iterdir()) == ["gpu_check.tar.gz", "summary.json"]
    doc = json.loads((back / "summary.json").read_text())
    assert doc["finished"] is True and [s["step"] for s in doc["steps"]] == _run_order()
    assert all(s["skipped"] for s in doc["steps"])
    with tarfile.open(back / "gpu_check.tar.gz") as archive:
        assert {"./summary.json", "./steps.jsonl"} <= set(archive.getnames())
    assert (scratch / "steps.jsonl").exists()
