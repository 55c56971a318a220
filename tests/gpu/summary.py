"""The GPU run's `summary.json`, rewritten after every step: a run cut short still returns what finished.

    python tests/gpu/summary.py OUT DEVICE SECONDS STATUS [--final]

The headline figures come first, gathered from the JSON the steps have written so far (absent until their
step ran): the tiny smoke per backend (`smoke.json`); flashinfer vs sdpa at Edge geometry (`attention.json`);
today's path against the new defaults at N = 1 and 8, frames and latents, each speedup with its interval, and
issue 47's targets judged on the new path (`bench_gpu_ab.json`); per-window ms at full context, MFU and
real-time factor, and the official diffusers recipe side by side (`bench_gpu_headline.json`); then the
cadence (`bench_gpu_more.json`) and the bf16 parity with diffusers (`parity_diffusers.json`); then each
step's exit code, seconds, limit and, for a failed step, its error (the last error line of its log, and the
errors a bench recorded per section) (`steps.jsonl`, `logs/`). `device_name` names the device the figures
came from. Runs on the image's own python (stdlib only): the venv may be what failed.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

HEADLINE_BENCH = "bench_gpu_headline.json"
AB_BENCH = "bench_gpu_ab.json"
MORE_BENCH = "bench_gpu_more.json"  # backends, cadence, overlap
STEP_FILES = {"smoke": "smoke.json", "kit": "kit.json", "flashinfer_ready": "flashinfer_ready.json",
              "attention": "attention.json", "bench_ab": AB_BENCH, "bench_headline": HEADLINE_BENCH,
              "parity_diffusers": "parity_diffusers.json", "gpu_tests": "gpu_tests.xml",
              "cosmos3_backends": "cosmos3_backends.json", "bench_more": MORE_BENCH}
_ERROR = re.compile(r"(Error|Exception|Traceback|FAILED|error:|Killed)")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or cut mid-write by a timeout
        return None


def _finite(value: Any) -> Any:
    """NaN and inf become None (strict JSON), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def parity(out: Path) -> dict | None:
    doc = _read(out / "attention.json")
    if doc is None:
        return None
    return {"ok": doc.get("ok"), "partial": doc.get("partial", False), "worst": doc.get("worst"),
            "bound": doc.get("bound"), "flashinfer": doc.get("flashinfer")}


def bench(out: Path) -> dict | None:
    doc = _read(out / HEADLINE_BENCH)
    if doc is None:
        return None
    r = doc.get("results", {})
    windows = [{k: run.get(k) for k in ("num_steps", "cfg", "context_tokens", "timed_windows", "ms_per_window",
                                         "ms_per_denoise_step", "mfu", "achieved_tflops", "real_time_factor")}
               for run in r.get("runs", [])]
    sessions = [{k: row.get(k) for k in ("sessions", "forwards_per_window", "one_forward_of_n", "ms_per_batched_step",
                                         "env_steps_per_s", "video_s_per_s", "peak_device_bytes")}
                for row in r.get("sessions", [])]
    return {"attention_backend": r.get("attention_backend"), "sections_done": list(r.get("section_s", {})),
            "windows": windows, "sessions": sessions, "official": r.get("official")}


def smoke(out: Path) -> dict | None:
    doc = _read(out / "smoke.json")
    if doc is None:
        return None
    return {"ok": doc.get("ok"), "backends": {name: {k: r.get(k) for k in ("ok", "reason", "error", "seconds")}
                                              for name, r in doc.get("backends", {}).items()}}


def ab(out: Path) -> dict | None:
    """Each A/B row's speedup with its interval and the new path's figures; the targets judged on them."""
    a = _results(_read(out / AB_BENCH)).get("ab")
    if a is None:
        return None
    rows = [{"mode": r["mode"], "sessions": r["sessions"], "speedup": r["speedup"],
             **{f"{name}_ms_per_step": p["ms_per_step"] for name, p in r["paths"].items()},
             "new_env_steps_per_s": r["paths"]["new"]["env_steps_per_s"]} for r in a.get("rows", [])]
    refused = {name: sorted(p.get("refused", {})) for name, p in a.get("paths", {}).items() if p.get("refused")}
    return {"rows": rows, "targets": a.get("targets"), "refused": refused}


def cadence(out: Path) -> dict | None:
    c = _results(_read(out / MORE_BENCH)).get("cadence")
    if c is None:
        return None
    return {k: c.get(k) for k in ("num_steps", "time_to_first_frames_s", "timed_windows", "inter_window_p50_ms",
                                  "inter_window_p95_ms", "real_time_factor_n1", "mfu")} | {
        "aggregate_real_time_factor_n8": c.get("aggregate", {}).get("aggregate_real_time_factor")}


def parity_diffusers(out: Path) -> dict | None:
    doc = _read(out / "parity_diffusers.json")
    if doc is None:
        return None
    return {"ok": doc.get("ok"), "bound": doc.get("bound"), "bound_reasoned": doc.get("bound_reasoned"),
            "measured": {name: r.get("measured", r.get("reason")) for name, r in doc.get("backends", {}).items()}}


def _results(doc: Any) -> dict:
    """A bench's ``results`` (a check's own ``results`` may be a list: nothing to read there)."""
    results = doc.get("results") if isinstance(doc, dict) else None
    return results if isinstance(results, dict) else {}


def device_name(out: Path) -> str | None:
    """The device the figures came from, as the checks and benches wrote it."""
    for name in STEP_FILES.values():
        doc = _read(out / name) if name.endswith(".json") else None
        found = (doc.get("device_name") if isinstance(doc, dict) else None) or _results(doc).get("device_name")
        if found:
            return found
    return None


def step_error(out: Path, step: dict) -> str | None:
    """Why a step failed: the errors its bench recorded per section, else the last error line of its log."""
    if step.get("skipped"):
        return step.get("reason")
    errors = _results(_read(out / STEP_FILES.get(step["step"], "-"))).get("errors")
    if errors:
        return "; ".join(f"{section}: {message.splitlines()[0]}" for section, message in errors.items())
    if step.get("rc", 0) == 0:
        return None
    try:
        lines = [line.strip() for line in (out / "logs" / f"{step['step']}.log").read_text().splitlines()]
    except OSError:
        return f"exit {step.get('rc')}, no log"
    picked = [line for line in lines if _ERROR.search(line)] or [line for line in lines if line]
    return (picked[-1][:500] if picked else f"exit {step.get('rc')}, empty log") + (
        " (timed out)" if step.get("timed_out") else "")


def summarize(out: Path, device: str, seconds: int, status: int, final: bool) -> dict:
    steps_file = out / "steps.jsonl"
    steps = [json.loads(line) for line in steps_file.read_text().splitlines()] if steps_file.exists() else []
    for s in steps:
        error = step_error(out, s)
        if error is not None:
            s["error"] = error
    return _finite({"ok": final and status == 0, "finished": final, "device": device,
                    "device_name": device_name(out), "seconds": seconds,
                    "headline": {"smoke": smoke(out), "parity": parity(out), "ab": ab(out), "bench": bench(out),
                                 "cadence": cadence(out), "parity_diffusers": parity_diffusers(out)},
                    "steps": steps})


def write(out: Path, doc: dict) -> Path:
    """Atomic: a reader (or a timeout) never sees half a file."""
    path, tmp = out / "summary.json", out / "summary.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def print_summary(doc: dict) -> None:
    head = doc["headline"]
    print(f"headline parity (flashinfer vs sdpa, Edge geometry): {head['parity']}")
    for row in (head["ab"] or {}).get("rows", []):
        print(f"headline A/B (today / new): {row}")
    print(f"targets (new path): {(head['ab'] or {}).get('targets')}")
    for part in ("windows", "sessions"):
        for row in (head["bench"] or {}).get(part, []):
            print(f"headline {part}: {row}")
    print(f"headline official recipe: {(head['bench'] or {}).get('official')}")
    print(f"cadence: {head['cadence']}")
    print(f"parity vs diffusers (bf16): {head['parity_diffusers']}")
    print(f"device: {doc['device_name']}")
    for s in doc["steps"]:
        state = ("skipped" if s.get("skipped") else "TIMEOUT" if s["timed_out"] else "ok" if s["rc"] == 0
                 else f"rc {s['rc']}")
        error = f"  {s['error'][:160]}" if s.get("error") else ""
        print(f"{s['step']:>17}: {state:8s} {s.get('seconds', 0):6.1f}s / {s.get('limit_s', 0)}s{error}")
    print(f"{'all':>17}: {'ok' if doc['ok'] else 'FAILED'} in {doc['seconds']}s")


def main(argv: list[str]) -> int:
    out, device, seconds, status = Path(argv[0]), argv[1], int(argv[2]), int(argv[3])
    final = "--final" in argv[4:]
    doc = summarize(out, device, seconds, status, final)
    write(out, doc)
    if final:
        print_summary(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
