"""`make gpu-kit-dryrun` end to end: the GPU run's script over a stand-in of the GPU image, on this CPU.

Slow (run with `-m slow`). Measured on the shared 2-core dev box: 8 min 16 s with the kit and the
stand-in image venv in place (load ~14); 24 min 51 s when it also built the image venv (load ~10). A
missing kit is built first: ~7 minutes once `build/gpukit-work` holds the prebuilt modules, over an hour
the first time it prebuilds them (`--aot off` kits take ~5 minutes). It needs nvcc, which the kit's
header set comes from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("bench_gpu_ab", "bench_gpu_headline", "bench_gpu_more")
FIGURES = ("smoke", "kit", "flashinfer_ready", "attention", "cosmos3_backends", "parity_diffusers", *BENCHES)
STEPS = ["setup", "smoke", "kit", "flashinfer_ready", "attention", "bench_ab", "bench_headline",
         "parity_diffusers", "gpu_tests", "cosmos3_backends", "bench_more"]


@pytest.mark.slow
def test_gpu_kit_dry_run():
    kit = Path(os.environ.get("GPU_KIT", ROOT / "gpukit"))
    if not (kit / "MANIFEST.json").exists():
        if not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
            pytest.skip("building the GPU kit needs nvcc (its header set is nvcc's own preprocessing)")
        subprocess.run([sys.executable, "tests/gpu/build_kit.py", "--out", str(kit)], cwd=ROOT, check=True)
    dry = ROOT / "build" / "gpukit-dryrun"
    shutil.rmtree(dry / "out", ignore_errors=True)
    run = subprocess.run(["tests/gpu/dryrun.sh"], cwd=ROOT, env={**os.environ, "GPU_KIT": str(kit)},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads((dry / "out" / "summary.json").read_text())
    assert summary["ok"] and summary["finished"] and [s["step"] for s in summary["steps"]] == STEPS
    docs = {name: json.loads((dry / "out" / f"{name}.json").read_text()) for name in FIGURES}
    assert all(docs[n]["ok"] for n in ("smoke", "kit", "flashinfer_ready", "attention", "cosmos3_backends",
                                       "parity_diffusers"))
    assert not docs["kit"]["missing"] and docs["kit"]["versions"]["flashinfer-python"] == "0.7.4"
    assert set(docs["kit"]["kit_prebuilt"]) <= set(docs["kit"]["prebuilt_found"])
    prebuilt = docs["kit"]["prebuilt"]  # the MANIFEST matches what is asked; each module loaded, ldd -r clean
    assert prebuilt["problems"] == [] and prebuilt["stub_libcuda"] is True
    assert {load["name"] for load in prebuilt["loads"]} == set(docs["kit"]["kit_prebuilt"])
    assert all(load["ok"] and load["ldd_problems"] == [] for load in prebuilt["loads"])
    assert docs["flashinfer_ready"]["sources"]["checked"] is True  # nvcc found every header in the trimmed tree
    for bench in BENCHES:
        assert docs[bench]["results"]["skipped"] is False and docs[bench]["results"]["section_s"]
        assert not docs[bench]["results"].get("errors")
    assert docs["bench_gpu_headline"]["results"]["official"]["skipped"] is False  # 256x256: a pipeline canvas
    head = summary["headline"]
    assert head["parity"]["ok"] is True and head["bench"]["sections_done"] == ["windows", "official"]
    assert all(w["timed_windows"] == 2 for w in head["bench"]["windows"])
    ab = docs["bench_gpu_ab"]["results"]  # the A/B, the profiler table and the decoder alone, in the dry run too
    assert list(ab["section_s"]) == ["ab", "profile", "decoder"]
    assert [(r["mode"], r["sessions"]) for r in head["ab"]["rows"]] == [
        ("frames", 1), ("frames", 2), ("latents", 1), ("latents", 2)]
    assert all(r["speedup"]["value"] > 0 and len(r["speedup"]["ci95"]) == 2 for r in head["ab"]["rows"])
    assert all(p["top"] and p["markdown"].startswith("| event |") for p in ab["profile"]["paths"].values())
    assert all(p["tflop_per_window"] > 0 for p in ab["decoder"]["paths"].values())
    assert list(docs["bench_gpu_more"]["results"]["section_s"]) == ["backends", "cadence", "overlap"]
    assert head["cadence"]["timed_windows"] >= 16 and head["smoke"]["ok"] is True
    assert head["parity_diffusers"]["ok"] is True and summary["device_name"] == "cpu"
