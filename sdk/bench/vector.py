"""`worldstep bench vector`: aggregate env steps per second of N sessions stepped through ONE batched
engine call (`model.step(sessions, actions)`, and the `WorldModelVectorEnv` built on it) against the same N
sessions stepped one after another. The phase split (denoise / commit / decode, summed over the
separate steps) says where batching pays and where it cannot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .archs import (
    PROMPT,
    BenchArch,
    action_chunks,
    bench_arch,
    first_frame,
    load_model,
    open_session,
    rollout_knobs,
)
from .machine import describe_machine
from .measure import interleave, median, ratio
from .progress import Progress
from .results import BenchResult, Table
from .settings import VectorSettings

TARGET_SPEEDUP_AT_8 = 3.0


def _phases(results) -> dict[str, float]:
    """Seconds per phase of one call: its sessions share one denoise and one commit, and each decodes its own
    stream (docs/exactness.md: a stream's frames must not depend on which streams share a call)."""
    t = results[0].timings
    return {"denoise_s": t.denoise_s, "commit_s": t.commit_s, "decode_s": sum(r.timings.decode_s for r in results)}


def _alternatives(model, arch: BenchArch, n: int, knobs, settings: VectorSettings, image: np.ndarray,
                  phases: dict[str, list[dict[str, float]]]) -> tuple[dict[str, Callable[[], None]], list]:
    def open_sessions() -> list:
        return [open_session(model, arch, knobs, seed=i, image=image) for i in range(n)]

    batched, separate = open_sessions(), open_sessions()
    steps = settings.warmup + settings.rounds
    chunks = [action_chunks(steps, arch, seed=1 + i) for i in range(n)]

    def step_batched() -> None:
        w = batched[0].window_index
        phases["batched"].append(_phases(model.step(batched, [c[w] for c in chunks])))

    def step_separate() -> None:
        w = separate[0].window_index
        parts = [_phases(model.step([s], [c[w]])) for s, c in zip(separate, chunks)]
        phases["separate"].append({k: sum(p[k] for p in parts) for k in parts[0]})

    alternatives = {"batched": step_batched, "separate": step_separate}
    closers = [model.close_all]
    if settings.vector_env:
        from worldstep.envs import WorldModelVectorEnv

        env = WorldModelVectorEnv(model, n, knobs, max_windows=steps + 1, prompt=PROMPT, domain_id=arch.domain_id,
                                  image=image, action_width=arch.action_width)
        closers.insert(0, env.close)
        env.reset(seed=0)
        env_chunks = [np.stack([c[w] for c in chunks]) for w in range(steps)]
        taken = [0]

        def step_env() -> None:
            env.step(env_chunks[taken[0]])
            taken[0] += 1

        alternatives["vector_env"] = step_env
    return alternatives, closers


def run_vector(settings: VectorSettings, progress: Progress) -> BenchResult:
    arch = bench_arch(settings.arch)
    result = BenchResult("vector", describe_machine(), settings=vars(settings).copy())
    max_n = max(settings.sizes)
    model = load_model(arch, num_pages=max(512, 3 * max_n * 64), cache_dir=settings.cache_dir)
    knobs = rollout_knobs(arch, settings.num_steps, settings.context_frames)
    image = first_frame(arch.height, arch.width)
    rows = []
    for n in settings.sizes:
        progress(f"N={n}: {settings.warmup} warm-up + {settings.rounds} measured steps per alternative")
        phases: dict[str, list[dict[str, float]]] = {"batched": [], "separate": []}
        alternatives, closers = _alternatives(model, arch, n, knobs, settings, image, phases)
        try:
            samples = interleave(alternatives, rounds=settings.rounds, warmup=settings.warmup)
        finally:
            for close in closers:
                close()
        rows.append(_row(n, samples, phases, settings.warmup))
    result.results = {"arch": settings.arch, "chunk_size": arch.chunk_size, "height": arch.height,
                      "width": arch.width, "by_n": rows, "target_speedup_at_8": TARGET_SPEEDUP_AT_8}
    result.tables += [_table(settings, arch, rows), _phase_table(rows)]
    _note_target(result, rows)
    return result


def _row(n: int, samples, phases, warmup: int) -> dict[str, Any]:
    steps_per_s = {name: ratio(n, s.median_s) for name, s in samples.items()}
    split = {name: {k[:-2] + "_ms": 1e3 * median([p[k] for p in ps[warmup:]]) for k in ps[0]}
             for name, ps in phases.items()}
    return {
        "n": n, "steps_per_s": steps_per_s, "ms_per_call": {name: s.median_ms for name, s in samples.items()},
        "cpu_ms_per_call": {name: s.median_cpu_ms for name, s in samples.items()},
        "speedup": ratio(steps_per_s["batched"], steps_per_s["separate"]),
        "cpu_speedup": ratio(samples["separate"].median_cpu_ms, samples["batched"].median_cpu_ms),
        "speedup_vector_env": ratio(steps_per_s.get("vector_env", float("nan")), steps_per_s["separate"]),
        "phases_ms": split,
    }


def _table(settings: VectorSettings, arch, rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title=(f"Aggregate env steps/s, {settings.arch} model {arch.height}x{arch.width}, {arch.chunk_size} "
               f"actions/window, {settings.num_steps} denoise steps"),
        columns=["N", "separate steps/s", "batched steps/s", "vector env steps/s", "batched / separate",
                 "vector env / separate", "batched / separate, CPU time"],
        note=("Medians of interleaved rounds; one round = one env step of each of the N sessions. The last column "
              "compares process CPU time per round (with --threads 1, about the wall time on an idle core)."),
    )
    for r in rows:
        s = r["steps_per_s"]
        table.add(r["n"], s["separate"], s["batched"], s.get("vector_env"), r["speedup"], r["speedup_vector_env"],
                  r["cpu_speedup"])
    return table


def _phase_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title="Where a round's time goes: ms per phase, N sessions one by one (summed) vs one batched call",
        columns=["N", "denoise sep", "denoise batch", "commit sep", "commit batch", "decode sep", "decode batch"],
    )
    for r in rows:
        sep, bat = r["phases_ms"]["separate"], r["phases_ms"]["batched"]
        table.add(r["n"], sep["denoise_ms"], bat["denoise_ms"], sep["commit_ms"], bat["commit_ms"],
                  sep["decode_ms"], bat["decode_ms"])
    return table


def _note_target(result: BenchResult, rows: list[dict[str, Any]]) -> None:
    at8 = next((r for r in rows if r["n"] == 8), None)
    if at8 is None or at8["speedup"] >= TARGET_SPEEDUP_AT_8:
        return
    sep, bat = at8["phases_ms"]["separate"], at8["phases_ms"]["batched"]
    gains = {k: ratio(sep[k], bat[k]) for k in sep}
    result.notes.append(
        f"N=8 speedup {at8['speedup']:.2f} misses the >= 3 target: batching speeds denoise up "
        f"{gains['denoise_ms']:.1f}x and commit {gains['commit_ms']:.1f}x but decode only {gains['decode_ms']:.1f}x, "
        f"and decode is {bat['decode_ms']:.0f} of {sum(bat.values()):.0f} ms of the batched call.")
