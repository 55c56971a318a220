"""Open-loop rollouts: `model.rollout(..., pipelined=True)` (window k decodes on a worker thread
while window k+1 denoises) against the sequential loop, same seed and actions, frames compared."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from .archs import PROMPT, action_chunks, bench_arch, first_frame, load_model
from .measure import interleave_timed, ratio
from .progress import Progress
from .results import Table
from .settings import RolloutSettings


def compare_pipelined(settings: RolloutSettings, progress: Progress) -> dict[str, Any]:
    """Figures of pipelined vs sequential rollouts of `pipeline_windows` windows (session opening excluded)."""
    from worldstep.engine.models.cosmos3 import RolloutKnobs

    arch = bench_arch(settings.scan_arch)
    model = load_model(arch, cache_dir=settings.cache_dir)
    image = first_frame(arch.height, arch.width)
    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=settings.num_steps,
                         context_frames=settings.context_frames)
    chunks = action_chunks(settings.pipeline_windows, arch)
    frames: dict[str, list[np.ndarray]] = {}

    def rollout(pipelined: bool):
        def run() -> float:
            session = model.open_session(image, PROMPT, arch.domain_id, knobs=knobs,
                                         generator=torch.Generator().manual_seed(0))
            start = time.perf_counter()
            out = [r.frames for r in model.rollout(session, chunks, pipelined=pipelined)]
            elapsed = time.perf_counter() - start
            session.close()
            frames["pipelined" if pipelined else "sequential"] = out
            return elapsed

        return run

    progress(f"pipelined vs sequential: {settings.pipeline_rounds} rollouts of {settings.pipeline_windows} "
             f"windows each ({settings.scan_arch})")
    samples = interleave_timed({"sequential": rollout(False), "pipelined": rollout(True)},
                               rounds=settings.pipeline_rounds, warmup=1)
    seq, pipe = samples["sequential"].median_ms, samples["pipelined"].median_ms
    return {
        "arch": settings.scan_arch, "windows": settings.pipeline_windows, "chunk_size": arch.chunk_size,
        "sequential_ms": seq, "pipelined_ms": pipe, "speedup": ratio(seq, pipe),
        "sequential_ms_per_window": seq / settings.pipeline_windows,
        "pipelined_ms_per_window": pipe / settings.pipeline_windows,
        "frames_equal": frames_equal(frames["sequential"], frames["pipelined"]),
        "samples_ms": {name: [1e3 * x for x in s.seconds] for name, s in samples.items()},
    }


def frames_equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Bit-for-bit equal frames, window by window."""
    return len(a) == len(b) and all(x is not None and np.array_equal(x, y) for x, y in zip(a, b))


def pipelined_table(f: dict[str, Any]) -> Table:
    table = Table(
        title=f"Open-loop rollout of {f['windows']} windows, {f['arch']} model: pipelined decode vs sequential",
        columns=["mode", "ms / rollout", "ms / window", "speedup"],
        note=f"Frames of the two modes bit-for-bit equal: {'yes' if f['frames_equal'] else 'NO'}.",
    )
    table.add("sequential (step loop)", f["sequential_ms"], f["sequential_ms_per_window"], 1.0)
    table.add("pipelined (rollout(pipelined=True))", f["pipelined_ms"], f["pipelined_ms_per_window"], f["speedup"])
    return table
