"""The GPU run's `summary.json`, rewritten after every step: a run cut short still returns what finished.

    python tests/gpu/summary.py OUT DEVICE SECONDS STATUS [--final]

The headline figures come first, gathered from the JSON the steps have written so far (absent until their
step ran): flashinfer vs sdpa at Edge geometry (`attention.json`); per-window ms at full context, MFU and
real-time factor, N = 1/4/8 sessions (one forward of N) with their throughput and memory, and the official
diffusers recipe side by side (`bench_gpu_headline.json`); then each step's exit code, seconds and limit
(`steps.jsonl`). Runs on the image's own python (stdlib only): the venv may be what failed.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

HEADLINE_BENCH = "bench_gpu_headline.json"


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


def summarize(out: Path, device: str, seconds: int, status: int, final: bool) -> dict:
    steps_file = out / "steps.jsonl"
    steps = [json.loads(line) for line in steps_file.read_text().splitlines()] if steps_file.exists() else []
    return _finite({"ok": final and status == 0, "finished": final, "device": device, "seconds": seconds,
                    "headline": {"parity": parity(out), "bench": bench(out)}, "steps": steps})


def write(out: Path, doc: dict) -> Path:
    """Atomic: a reader (or a timeout) never sees half a file."""
    path, tmp = out / "summary.json", out / "summary.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def print_summary(doc: dict) -> None:
    head = doc["headline"]
    print(f"headline parity (flashinfer vs sdpa, Edge geometry): {head['parity']}")
    for part in ("windows", "sessions"):
        for row in (head["bench"] or {}).get(part, []):
            print(f"headline {part}: {row}")
    print(f"headline official recipe: {(head['bench'] or {}).get('official')}")
    for s in doc["steps"]:
        state = ("skipped" if s.get("skipped") else "TIMEOUT" if s["timed_out"] else "ok" if s["rc"] == 0
                 else f"rc {s['rc']}")
        print(f"{s['step']:>17}: {state:8s} {s.get('seconds', 0):6.1f}s / {s.get('limit_s', 0)}s")
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
