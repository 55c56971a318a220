"""`worldstep bench view`: what RerunLogger adds to a step, against the step itself.

One episode of the env is stepped with random actions; after each step the wrapper's own work (encoding the
window's frames, logging them, the action series, reward, success, pages and timings into a recording
streamed to an ``.rrd`` file) is timed on its own, on the step's real outputs, in wall time and in process CPU
time (which includes Rerun's own threads, and which other load on the machine does not inflate). The ratio of
medians is the overhead per step a user sees; the file's size per frame is what the recording costs on disk.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from ..view.rerun_log import IMAGE_FORMATS, RolloutLog, rerun_module
from .machine import describe_machine
from .measure import median
from .progress import Progress
from .results import BenchResult, Table, format_cell
from .settings import ViewSettings

TARGET_OVERHEAD_PCT = 5.0


def run_view(settings: ViewSettings, progress: Progress) -> BenchResult:
    if settings.windows < 3:
        raise ValueError(f"--windows {settings.windows} is invalid; allowed: >= 3")
    if settings.warmup < 0:
        raise ValueError(f"--warmup {settings.warmup} is invalid; allowed: >= 0")
    if settings.image_format not in IMAGE_FORMATS:
        raise ValueError(f"--image-format {settings.image_format!r} is invalid; allowed: {', '.join(IMAGE_FORMATS)}")
    rr = rerun_module()
    total = settings.warmup + settings.windows
    env = gym.make(settings.env, max_windows=total)
    rng = np.random.default_rng(settings.seed)
    step_ms: list[float] = []
    log_ms: list[float] = []
    step_cpu_ms: list[float] = []
    log_cpu_ms: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.rrd"
        recording = rr.RecordingStream("worldstep-bench")
        recording.save(path)
        try:
            log = RolloutLog(recording, "env", getattr(env.unwrapped, "embodiment", None), env.action_space.shape[1],
                             settings.image_format, 90)
            obs, info = env.reset(seed=settings.seed)
            log.reset(obs["frames"][0], info.get("kv"))
            frames = 1
            for w in range(total):
                action = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
                start, start_cpu = time.perf_counter(), time.process_time()
                obs, reward, terminated, _, info = env.step(action)
                stepped, stepped_cpu = time.perf_counter(), time.process_time()
                log.window(info["window_index"], info["frame_start"], obs["frames"], action, reward,
                           info["is_success"], info["timings"], info["kv"])
                logged, logged_cpu = time.perf_counter(), time.process_time()
                frames += len(obs["frames"])
                if w >= settings.warmup:
                    step_ms.append(1e3 * (stepped - start))
                    log_ms.append(1e3 * (logged - stepped))
                    step_cpu_ms.append(1e3 * (stepped_cpu - start_cpu))
                    log_cpu_ms.append(1e3 * (logged_cpu - stepped_cpu))
                progress(f"window {w + 1}/{total}: step {1e3 * (stepped - start):.0f} ms, "
                         f"log {1e3 * (logged - stepped):.2f} ms")
                if terminated:
                    obs, info = env.reset(seed=settings.seed + w + 1)
                    log.reset(obs["frames"][0], info.get("kv"))
                    frames += 1
        finally:
            recording.flush()
            recording.disconnect()
            env.close()
        file_bytes = path.stat().st_size
    figures = {
        "step_ms": median(step_ms), "log_ms": median(log_ms),
        "overhead_pct": 100.0 * median(log_ms) / median(step_ms),
        "step_cpu_ms": median(step_cpu_ms), "log_cpu_ms": median(log_cpu_ms),
        "overhead_cpu_pct": 100.0 * median(log_cpu_ms) / median(step_cpu_ms),
        "frame_shape": list(obs["frames"].shape[1:]), "frames": frames,
        "rrd_bytes_per_frame": file_bytes / frames, "raw_bytes_per_frame": int(np.prod(obs["frames"].shape[1:])),
        "step_ms_all": step_ms, "log_ms_all": log_ms, "step_cpu_ms_all": step_cpu_ms, "log_cpu_ms_all": log_cpu_ms,
    }
    result = BenchResult("view", describe_machine(), settings=vars(settings).copy(), results=figures)
    table = Table(f"RerunLogger on {settings.env} ({settings.image_format}, {settings.windows} windows)",
                  ["figure", "measured", "target"])
    table.add("env step, ms (median; in CPU time)", f"{format_cell(figures['step_ms'])} "
              f"({format_cell(figures['step_cpu_ms'])})", None)
    table.add("logging one window, ms (median; in CPU time)", f"{format_cell(figures['log_ms'])} "
              f"({format_cell(figures['log_cpu_ms'])})", None)
    table.add("overhead per step, % (in CPU time)",
              f"{figures['overhead_pct']:.1f} ({figures['overhead_cpu_pct']:.1f})", f"<= {TARGET_OVERHEAD_PCT:g}%")
    table.add("recording bytes per frame / raw frame bytes", figures["rrd_bytes_per_frame"],
              figures["raw_bytes_per_frame"])
    result.tables.append(table)
    if figures["overhead_pct"] > TARGET_OVERHEAD_PCT:
        result.notes.append(f"overhead target missed: {figures['overhead_pct']:.1f}% > {TARGET_OVERHEAD_PCT:g}%.")
    return result
