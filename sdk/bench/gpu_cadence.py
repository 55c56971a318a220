"""`bench gpu` section `cadence`: what a user stepping an env feels, after the headline's medians.

- time to first frames: a reset (prompt prefill, first-frame encode and decode) plus the first step, from a
  cold session on a warm model;
- inter-window time: the wall time between consecutive windows' frames of one session stepped back to back,
  p50 and p95 over ``--cadence-windows`` (>= 16) windows, all at full context (warm-up windows fill it);
- real-time factor: video seconds per wall second at N = 1 (from the p50), and in aggregate at N = 8 sessions
  stepped together (one forward of N: the bench's model keeps decode overlap off, gpu_model.py);
- MFU of those windows: analytic generation-forward FLOPs (flops.py) over the measured denoise time.

Frames come back to the host inside each step, so every wall time includes the device's work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .archs import action_chunks
from .flops import GenShape, forward_flops
from .gpu_model import MAX_WARM_UP, fill_context, open_sessions, rows
from .measure import SyncedStopwatch, device_sync, median, ratio
from .progress import Progress
from .results import Table

AGGREGATE_SESSIONS = 8
MIN_WINDOWS = 16


def measure_cadence(model, arch, settings, peak: float | None, progress: Progress) -> dict[str, Any]:
    from worldstep.engine.config import RolloutKnobs

    windows = max(MIN_WINDOWS, settings.cadence_windows)
    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=settings.session_steps,
                         context_frames=settings.context_frames)
    video_s = arch.chunk_size / model.spec.fps
    chunks = iter(action_chunks(1 + MAX_WARM_UP + windows, arch))
    progress(f"cadence: first frames, then {windows} windows at full context ({knobs.num_steps} steps)")
    sync = device_sync(model.device)
    start = SyncedStopwatch(sync)
    session = open_sessions(model, arch, knobs, 1, seed=200)[0]
    try:
        reset_s = start.elapsed()[0]
        model.step([session], [next(chunks)])
        first_frames_s = start.elapsed()[0]
        warm_up = fill_context(model, session, chunks)
        shape, walls, step_s, flops = GenShape.from_config(model.transformer.config), [], [], []
        for _ in range(windows):
            flops.append(forward_flops(shape, rows(model, [session])).total)
            watch = SyncedStopwatch(sync)
            result = model.step([session], [next(chunks)])[0]
            walls.append(watch.elapsed()[0])
            step_s.append(result.timings.denoise_s / knobs.num_steps)
    finally:
        model.close(session)
    achieved = median(flops) / median(step_s) / 1e12
    p50, p95 = (float(np.percentile(walls, q)) for q in (50, 95))
    return {
        "num_steps": knobs.num_steps, "context_frames": knobs.context_frames, "full_context": warm_up["full"],
        "reset_s": reset_s, "time_to_first_frames_s": first_frames_s, "timed_windows": windows,
        "inter_window_p50_ms": 1e3 * p50, "inter_window_p95_ms": 1e3 * p95, "inter_window_max_ms": 1e3 * max(walls),
        "real_time_factor_n1": ratio(video_s, p50), "achieved_tflops": achieved,
        "mfu": ratio(achieved, peak) if peak else None,
        "aggregate": _aggregate(model, arch, knobs, settings, video_s, progress),
    }


def _aggregate(model, arch, knobs, settings, video_s: float, progress: Progress) -> dict[str, Any]:
    """N sessions stepped together: aggregate video seconds per wall second (one warm-up window, then timed)."""
    count = AGGREGATE_SESSIONS
    progress(f"cadence: {count} sessions together, 1 warm-up + {settings.windows} windows")
    sessions = open_sessions(model, arch, knobs, count, seed=300)
    walls, sync = [], device_sync(model.device)
    try:
        for w, actions in enumerate(action_chunks(settings.windows + 1, arch)):
            watch = SyncedStopwatch(sync)
            model.step(sessions, [actions] * count)
            if w > 0:
                walls.append(watch.elapsed()[0])
    finally:
        for s in sessions:
            model.close(s)
    wall = median(walls)
    return {"sessions": count, "ms_per_batched_step": 1e3 * wall,
            "aggregate_real_time_factor": ratio(count * video_s, wall),
            "per_session_real_time_factor": ratio(video_s, wall)}


def cadence_table(f: dict[str, Any]) -> Table:
    c = f["cadence"]
    table = Table(title=f"cadence, {f['arch']} at {f['height']}x{f['width']} ({f['attention_backend']}), "
                        f"{c['num_steps']} steps",
                  columns=["first frames s", "reset s", "p50 ms", "p95 ms", "windows", "RTF N=1", "RTF N=8 agg",
                           "MFU"],
                  note="Inter-window times of one session stepped back to back at full context; N=8: one forward "
                       "of 8 per step.")
    table.add(c["time_to_first_frames_s"], c["reset_s"], c["inter_window_p50_ms"], c["inter_window_p95_ms"],
              c["timed_windows"], c["real_time_factor_n1"], c["aggregate"]["aggregate_real_time_factor"], c["mfu"])
    return table
