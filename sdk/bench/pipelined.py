"""Open-loop rollouts with the decode pipelined behind the denoise (`bench rollout --pipeline-windows N`):
`pipelined_rollout` decodes window k on a worker thread while window k+1 denoises, against the step loop,
same seed and actions, frames compared."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from .archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
from .measure import Stopwatch, interleave_timed, ratio
from .progress import Progress
from .results import Table
from .settings import RolloutSettings


def pipelined_rollout(model, session, chunks: Iterable[np.ndarray]) -> Iterator:
    """`WindowResult`s of an open-loop rollout, in order, each window decoded on a worker thread while the
    next one denoises (`model.step(..., decode=False)`, then `model.decode`).

    The frames are the step loop's bit for bit: the same calls, only the decode runs on another thread.
    A failure closes the session (its windows cannot continue); leaving the loop early waits for the
    decode in flight, so the session stays consistent.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldstep-decode") as pool:
        pending: Future | None = None
        try:
            for actions in chunks:
                result = model.step([session], [actions], decode=False)[0]
                previous, pending = pending, pool.submit(model.decode, session, result)
                if previous is not None:
                    yield previous.result()
            if pending is not None:
                last, pending = pending, None
                yield last.result()
        except GeneratorExit:
            if pending is not None:
                wait([pending])
            raise
        except BaseException:
            if pending is not None:
                wait([pending])
            model.close(session)
            raise


def compare_pipelined(settings: RolloutSettings, progress: Progress) -> dict[str, Any]:
    """Figures of pipelined vs sequential rollouts of `pipeline_windows` windows (session opening excluded)."""
    arch = bench_arch(settings.scan_arch)
    model = load_model(arch, cache_dir=settings.cache_dir)
    knobs = rollout_knobs(arch, settings.num_steps, settings.context_frames)
    chunks = action_chunks(settings.pipeline_windows, arch)
    frames: dict[str, list[np.ndarray]] = {}

    def rollout(mode: str):
        def run() -> tuple[float, float]:
            session = open_session(model, arch, knobs)
            try:
                watch = Stopwatch()
                if mode == "pipelined":
                    out = [r.frames for r in pipelined_rollout(model, session, chunks)]
                else:
                    out = [model.step([session], [a])[0].frames for a in chunks]
                elapsed = watch.elapsed()
            finally:
                model.close(session)
            frames[mode] = out
            return elapsed

        return run

    progress(f"pipelined vs sequential: {settings.pipeline_rounds} rollouts of {settings.pipeline_windows} "
             f"windows each ({settings.scan_arch})")
    samples = interleave_timed({"sequential": rollout("sequential"), "pipelined": rollout("pipelined")},
                               rounds=settings.pipeline_rounds, warmup=1)
    seq, pipe = samples["sequential"].median_ms, samples["pipelined"].median_ms
    n = settings.pipeline_windows
    return {
        "arch": settings.scan_arch, "windows": n, "chunk_size": arch.chunk_size,
        "sequential_ms": seq, "pipelined_ms": pipe, "speedup": ratio(seq, pipe),
        "sequential_ms_per_window": seq / n, "pipelined_ms_per_window": pipe / n,
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
    table.add("pipelined (decode on a worker thread)", f["pipelined_ms"], f["pipelined_ms_per_window"], f["speedup"])
    return table
