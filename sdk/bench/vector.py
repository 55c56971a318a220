"""`worldstep bench vector`: aggregate env steps per second of N sessions stepped through ONE batched
engine call (`model.step(sessions, actions)`, and the `WorldModelVectorEnv` built on it) against the same N
sessions stepped one after another, for both decode modes side by side: each session through its own decoder
calls (`decoder.batch_sessions: false`, the exact per-session path) and the group's sessions stacked into one
set of calls (`batch_sessions: true`). The phase split of one call (denoise / commit / decode / other, the sum
of its windows' `PhaseTimings` shares, which adds up to the call's wall time) says where batching pays; `other`
is the call's time outside denoise, commit and decode (Python overhead).

Latent mode (`observation="latents"`: sessions opened with `decode=False`, what a latent env's step runs) has rows
of its own in the same interleaved rounds: its N sessions batched vs one by one, and, with `--vector-env`, the
latent vector env."""

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

# Issue 23's targets at N = 8 (batched / one by one, the better decode mode), and Python overhead per round.
TARGET_SPEEDUP_AT_8 = {"pusher": 2.5, "tiny": 2.0}
# Issue 47's target for latent mode at N = 8 (batched / one by one), on the pusher.
TARGET_LATENT_SPEEDUP_AT_8 = {"pusher": 2.5}
TARGET_OVERHEAD_AT_8 = 0.10
MODES = {"per_stream": False, "stacked": True}  # decode mode -> DecoderOptions.batch_sessions
PHASES = ("denoise", "commit", "decode", "other")


def _phases(results) -> dict[str, float]:
    """Seconds per phase of one `model.step` call: the sum of its windows' shares (`PhaseTimings` is a window's
    share of its group's call), so the phases add up to the call's wall time."""
    return {f"{k}_s": sum(getattr(r.timings, f"{k}_s") for r in results) for k in PHASES}


def _alternatives(models: dict[str, Any], arch: BenchArch, n: int, knobs, settings: VectorSettings,
                  image: np.ndarray, phases: dict[str, list[dict[str, float]]]
                  ) -> tuple[dict[str, Callable[[], None]], list]:
    steps = settings.warmup + settings.rounds
    chunks = [action_chunks(steps, arch, seed=1 + i) for i in range(n)]

    def open_sessions(model) -> list:
        return [open_session(model, arch, knobs, seed=i, image=image) for i in range(n)]

    def batched(mode: str) -> Callable[[], None]:
        model, sessions = models[mode], open_sessions(models[mode])

        def step() -> None:
            w = sessions[0].window_index
            phases[f"batched_{mode}"].append(_phases(model.step(sessions, [c[w] for c in chunks])))
        return step

    model, separate = models["per_stream"], open_sessions(models["per_stream"])

    def step_separate() -> None:  # one stream per call: both decode modes issue the same calls
        w = separate[0].window_index
        parts = [_phases(model.step([s], [c[w]])) for s, c in zip(separate, chunks)]
        phases["separate"].append({k: sum(p[k] for p in parts) for k in parts[0]})

    alternatives = {"separate": step_separate, **{f"batched_{mode}": batched(mode) for mode in MODES},
                    **_latent_alternatives(models["per_stream"], arch, n, knobs, image, chunks, phases)}
    closers = [m.close_all for m in models.values()]
    if settings.vector_env:
        from worldstep.envs import WorldModelVectorEnv

        shipped = models["stacked" if arch.decoder.get("batch_sessions") else "per_stream"]
        env = WorldModelVectorEnv(shipped, n, knobs, max_windows=steps + 1, prompt=PROMPT, domain_id=arch.domain_id,
                                  image=image, action_width=arch.action_width)
        closers.insert(0, env.close)
        env.reset(seed=0)
        env_chunks = [np.stack([c[w] for c in chunks]) for w in range(steps)]
        taken = [0]

        def step_env() -> None:
            env.step(env_chunks[taken[0]])
            taken[0] += 1

        alternatives["vector_env"] = step_env
        latent_env = WorldModelVectorEnv(shipped, n, knobs, max_windows=steps + 1, prompt=PROMPT,
                                         domain_id=arch.domain_id, image=image, action_width=arch.action_width,
                                         observation="latents")
        closers.insert(0, latent_env.close)
        latent_env.reset(seed=0)
        latent_taken = [0]

        def step_latent_env() -> None:
            latent_env.step(env_chunks[latent_taken[0]])
            latent_taken[0] += 1

        alternatives["latent_vector_env"] = step_latent_env
    return alternatives, closers


def _latent_alternatives(model, arch: BenchArch, n: int, knobs, image: np.ndarray, chunks: list,
                         phases: dict[str, list[dict[str, float]]]) -> dict[str, Callable[[], None]]:
    """Latent mode's two rows: N sessions that decode nothing (``decode=False``, a latent env's engine session)
    batched in one call, and the same stepped one after another."""
    latent_knobs = knobs.model_copy(update={"decode": False})
    batched = [open_session(model, arch, latent_knobs, seed=i, image=image) for i in range(n)]
    separate = [open_session(model, arch, latent_knobs, seed=i, image=image) for i in range(n)]

    def step_batched() -> None:
        w = batched[0].window_index
        phases["latent_batched"].append(_phases(model.step(batched, [c[w] for c in chunks])))

    def step_separate() -> None:
        w = separate[0].window_index
        parts = [_phases(model.step([s], [c[w]])) for s, c in zip(separate, chunks)]
        phases["latent_separate"].append({k: sum(p[k] for p in parts) for k in parts[0]})

    return {"latent_separate": step_separate, "latent_batched": step_batched}


def run_vector(settings: VectorSettings, progress: Progress) -> BenchResult:
    arch = bench_arch(settings.arch)
    result = BenchResult("vector", describe_machine(), settings=vars(settings).copy())
    max_n = max(settings.sizes)
    models = {mode: load_model(arch, num_pages=max(512, 5 * max_n * 64), cache_dir=settings.cache_dir,
                               decoder={"batch_sessions": on}) for mode, on in MODES.items()}
    knobs = rollout_knobs(arch, settings.num_steps, settings.context_frames)
    image = first_frame(arch.height, arch.width)
    rows = []
    for n in settings.sizes:
        progress(f"N={n}: {settings.warmup} warm-up + {settings.rounds} measured steps per alternative")
        phases: dict[str, list[dict[str, float]]] = {"separate": [], **{f"batched_{m}": [] for m in MODES},
                                                     "latent_separate": [], "latent_batched": []}
        alternatives, closers = _alternatives(models, arch, n, knobs, settings, image, phases)
        try:
            samples = interleave(alternatives, rounds=settings.rounds, warmup=settings.warmup)
        finally:
            for close in closers:
                close()
        rows.append(_row(n, samples, phases, settings.warmup))
    result.results = {"arch": settings.arch, "chunk_size": arch.chunk_size, "height": arch.height,
                      "width": arch.width, "by_n": rows,
                      "shipped_batch_streams": bool(arch.decoder.get("batch_sessions")),
                      "target_speedup_at_8": TARGET_SPEEDUP_AT_8.get(settings.arch),
                      "target_overhead_at_8": TARGET_OVERHEAD_AT_8,
                      "target_latent_speedup_at_8": TARGET_LATENT_SPEEDUP_AT_8.get(settings.arch)}
    result.tables += [_table(settings, arch, rows), _phase_table(rows), _latent_table(settings, arch, rows)]
    _note_targets(result, settings.arch, rows)
    return result


def _row(n: int, samples, phases, warmup: int) -> dict[str, Any]:
    steps_per_s = {name: ratio(n, s.median_s) for name, s in samples.items()}
    split = {name: {f"{k[:-2]}_ms": 1e3 * median([p[k] for p in ps[warmup:]]) for k in ps[0]}
             for name, ps in phases.items()}
    speedup = {m: ratio(steps_per_s[f"batched_{m}"], steps_per_s["separate"]) for m in MODES}
    cpu = {m: ratio(samples["separate"].median_cpu_ms, samples[f"batched_{m}"].median_cpu_ms) for m in MODES}
    best = max(MODES, key=lambda m: speedup[m])
    return {
        "n": n, "steps_per_s": steps_per_s, "ms_per_call": {name: s.median_ms for name, s in samples.items()},
        "cpu_ms_per_call": {name: s.median_cpu_ms for name, s in samples.items()},
        "speedup_by_mode": speedup, "cpu_speedup_by_mode": cpu, "best_mode": best,
        "speedup": speedup[best], "cpu_speedup": cpu[best],
        "speedup_vector_env": ratio(steps_per_s.get("vector_env", float("nan")), steps_per_s["separate"]),
        "phases_ms": split,
        "overhead_fraction": {name: ratio(p["other_ms"], sum(p.values())) for name, p in split.items()},
        "latent_speedup": ratio(steps_per_s["latent_batched"], steps_per_s["latent_separate"]),
        "latent_cpu_speedup": ratio(samples["latent_separate"].median_cpu_ms, samples["latent_batched"].median_cpu_ms),
        "latent_speedup_vector_env": ratio(steps_per_s.get("latent_vector_env", float("nan")),
                                           steps_per_s["latent_separate"]),
        "latent_over_frames": ratio(steps_per_s["latent_batched"], steps_per_s[f"batched_{best}"]),
    }


def _latent_table(settings: VectorSettings, arch, rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title=(f"Latent mode (observation='latents', no decode per step), {settings.arch} model "
               f"{arch.height}x{arch.width}: aggregate env steps/s, in the same interleaved rounds as frames mode"),
        columns=["N", "one by one", "batched", "vector env", "batched / one by one (CPU)",
                 "latent batched / frames batched", "batched call: denoise, commit, decode, other (ms)"],
        note=("Steps/s, medians of interleaved rounds. Frames batched: the better decode mode of the table above. "
              "A latent step calls no decoder (its decode column is the empty decode lane's marks): render() "
              "decodes on demand."),
    )
    for r in rows:
        s, p = r["steps_per_s"], r["phases_ms"]["latent_batched"]
        table.add(r["n"], s["latent_separate"], s["latent_batched"], s.get("latent_vector_env"),
                  f"{r['latent_speedup']:.2f}x ({r['latent_cpu_speedup']:.2f}x)", f"{r['latent_over_frames']:.2f}x",
                  ", ".join(f"{p[k]:.1f}" for k in ("denoise_ms", "commit_ms", "decode_ms", "other_ms")))
    return table


def _table(settings: VectorSettings, arch, rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title=(f"Aggregate env steps/s, {settings.arch} model {arch.height}x{arch.width}, {arch.chunk_size} "
               f"actions/window, {settings.num_steps} denoise steps"),
        columns=["N", "one by one", "batched, per-stream decode", "batched, stacked decode", "vector env",
                 "per-stream / one by one (CPU)", "stacked / one by one (CPU)"],
        note=("Steps/s, medians of interleaved rounds; one round = one env step of each of the N sessions. CPU: the "
              "same ratio in process CPU time per round (with --threads 1, about the wall time on an idle core). "
              "The vector env decodes as the arch's shipped config does."),
    )
    for r in rows:
        s, x, c = r["steps_per_s"], r["speedup_by_mode"], r["cpu_speedup_by_mode"]
        table.add(r["n"], s["separate"], s["batched_per_stream"], s["batched_stacked"], s.get("vector_env"),
                  f"{x['per_stream']:.2f}x ({c['per_stream']:.2f}x)", f"{x['stacked']:.2f}x ({c['stacked']:.2f}x)")
    return table


def _phase_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title=("Where one round's time goes: ms per phase of one batched call (per-stream / stacked decode), and "
               "the N one-by-one calls summed; other = outside denoise, commit and decode"),
        columns=["N", "denoise", "commit", "decode", "other", "call", "other / call", "one by one: decode, call"],
    )
    for r in rows:
        p, sep, frac = r["phases_ms"], r["phases_ms"]["separate"], r["overhead_fraction"]
        a, b = p["batched_per_stream"], p["batched_stacked"]
        pair = [f"{a[k]:.1f} / {b[k]:.1f}" for k in ("denoise_ms", "commit_ms", "decode_ms", "other_ms")]
        table.add(r["n"], *pair,
                  f"{sum(a.values()):.1f} / {sum(b.values()):.1f}",
                  f"{100 * frac['batched_per_stream']:.1f}% / {100 * frac['batched_stacked']:.1f}%",
                  f"{sep['decode_ms']:.1f}, {sum(sep.values()):.1f}")
    return table


def _note_targets(result: BenchResult, arch: str, rows: list[dict[str, Any]]) -> None:
    at8 = next((r for r in rows if r["n"] == 8), None)
    if at8 is None:
        return
    target, best = TARGET_SPEEDUP_AT_8.get(arch), at8["best_mode"]
    p = at8["phases_ms"][f"batched_{best}"]
    share = {k: p[k] / sum(p.values()) for k in p}
    result.notes.append(
        f"N=8, {arch}: batched / one by one {at8['speedup']:.2f}x with {best} decode (target "
        f"{'none' if target is None else f'>= {target}x'}); the batched call is "
        + ", ".join(f"{100 * v:.0f}% {k[:-3]}" for k, v in share.items())
        + f"; Python overhead {100 * at8['overhead_fraction'][f'batched_{best}']:.1f}% (target <= "
        f"{100 * TARGET_OVERHEAD_AT_8:.0f}%).")
    latent = TARGET_LATENT_SPEEDUP_AT_8.get(arch)
    result.notes.append(
        f"N=8, {arch}, latent mode: batched / one by one {at8['latent_speedup']:.2f}x (target "
        f"{'none' if latent is None else f'>= {latent}x'}); latent batched / frames batched "
        f"{at8['latent_over_frames']:.2f}x.")
