"""`bench gpu` section `ab`: today's path against the new defaults in the same call, round by round.

Both paths (`gpu_variants.py`) run over the same in-memory modules, each on its own model (its own KV pool and
decoder). At each N of ``--ab-sessions``, in frames mode (each window decoded) and in latent mode
(``rollout.decode: false``: the window's latents, no VAE call), each path steps its N sessions one window per
round, the path that goes first rotating (`measure.interleave_timed`); ``--ab-warmup`` rounds fill the context
and warm graphs and kernels, then ``--ab-rounds`` are kept. Every window is timed between two device
synchronizes. Each gain is today's median over the new one's, with a 95% bootstrap interval over the paired
rounds of this one run.
"""

from __future__ import annotations

from typing import Any

from .archs import action_chunks
from .flops import GenShape, forward_flops
from .gpu_model import edge_model, open_sessions, rows
from .gpu_variants import PATHS, Variant, build
from .measure import SyncedStopwatch, device_sync, interleave_timed, median, ratio, ratio_estimate
from .progress import Progress
from .results import Table
from .settings import GpuSettings

MODES = ("frames", "latents")
# issue 47's targets on the H200 (Edge 480p, 4 steps, full context, no CFG), judged on the new path
TARGETS = {
    "window_ms_n1_max": 320.0, "decode_ms_n1_max": 220.0, "denoise_step_ms_n1_max": 15.0,
    "frames_env_steps_per_s_n8_min": 3.5, "latents_env_steps_per_s_n8_min": 10.0,
}


def path_models(components, model, arch, progress: Progress) -> dict[str, tuple[Any, Variant]]:
    """A model per path over ``model``'s modules, device, backend and frame size."""
    device = model.device

    def make(backend: str, **knobs):
        return edge_model(components, arch, device, backend, height=model.spec.height, width=model.spec.width,
                          **knobs)

    out = {}
    for name, knobs in PATHS.items():
        out[name] = build(name, knobs, make, model.backend.value, device, tolerate=device.type != "cuda")
        if out[name][1].refused:
            progress(f"path {name}: refused here {sorted(out[name][1].refused)}")
    return out


def measure_ab(components, model, arch, settings: GpuSettings, peak: float | None,
               progress: Progress) -> dict[str, Any]:
    built = path_models(components, model, arch, progress)
    models = {name: m for name, (m, _) in built.items()}
    out: dict[str, Any] = {
        "paths": {name: v.to_dict() for name, (_, v) in built.items()}, "rounds": settings.ab_rounds,
        "warmup": settings.ab_warmup, "num_steps": settings.session_steps, "context_frames": settings.context_frames,
        "speedup_is": "today's median ms per step / the new path's", "rows": [],
    }
    for mode in MODES:
        for count in settings.ab_sessions:
            progress(f"A/B {mode}, {count} session(s): {settings.ab_warmup} warm-up + {settings.ab_rounds} rounds")
            out["rows"].append(compare(models, arch, settings, mode, count, peak))
    out["targets"] = judge(out["rows"], model.device.type == "cuda" and arch.name == "edge")
    return out


def compare(models: dict[str, Any], arch, settings: GpuSettings, mode: str, count: int,
            peak: float | None) -> dict[str, Any]:
    """One row: the paths interleaved at ``count`` sessions in ``mode``."""
    from worldstep.engine.config import RolloutKnobs

    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=settings.session_steps,
                         context_frames=settings.context_frames, decode=mode == "frames")
    chunks = action_chunks(settings.ab_warmup + settings.ab_rounds, arch)
    sessions = {}
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    try:
        for name, m in models.items():
            sessions[name] = open_sessions(m, arch, knobs, count, seed=400)
        samples = interleave_timed({name: _stepper(m, sessions[name], chunks, phases[name])
                                    for name, m in models.items()}, settings.ab_rounds, settings.ab_warmup)
        shape = GenShape.from_config(next(iter(models.values())).transformer.config)
        flops = {name: forward_flops(shape, rows(m, sessions[name])).total for name, m in models.items()}
    finally:
        for name, opened in sessions.items():
            for s in opened:
                models[name].close(s)
    video_s = arch.chunk_size / next(iter(models.values())).spec.fps
    row: dict[str, Any] = {"mode": mode, "sessions": count, "paths": {}}
    for name, s in samples.items():
        kept = phases[name][settings.ab_warmup:]
        step_s = median([p["denoise_s"] for p in kept]) / knobs.num_steps
        achieved = flops[name] / step_s / 1e12 if step_s > 0 else float("nan")
        row["paths"][name] = {
            "ms_per_step": s.median_ms, "samples_ms": [round(1e3 * x, 3) for x in s.seconds],
            "env_steps_per_s": ratio(count, s.median_s), "video_s_per_s": ratio(count * video_s, s.median_s),
            "ms_per_denoise_step": 1e3 * step_s, "ms_per_commit": 1e3 * median([p["commit_s"] for p in kept]),
            "ms_per_decode": 1e3 * median([p["decode_s"] for p in kept]) if knobs.decode else None,
            "achieved_tflops": achieved,
            "mfu": ratio(achieved, peak) if peak else None,
        }
    row["speedup"] = ratio_estimate(samples["today"].seconds, samples["new"].seconds).to_dict()
    return row


def _stepper(model, sessions: list, chunks: list, phases: list[dict[str, float]]):
    """One round of a path: its sessions step one window together, timed between device synchronizes; the
    group's phase seconds are kept (denoise and commit from the engine's device events)."""
    sync = device_sync(model.device)

    def run() -> tuple[float, float]:
        actions = chunks[len(phases)]
        watch = SyncedStopwatch(sync)
        results = model.step(sessions, [actions] * len(sessions))
        elapsed = watch.elapsed()
        t = results[0].timings.of_group()
        phases.append({"denoise_s": t.denoise_s, "commit_s": t.commit_s, "decode_s": t.decode_s})
        return elapsed

    return run


def judge(rows_: list[dict[str, Any]], judged: bool) -> dict[str, Any]:
    """Issue 47's targets against the new path's figures (``judged``: Edge on CUDA; elsewhere only listed)."""
    def new(mode: str, count: int) -> dict[str, Any] | None:
        found = [r["paths"]["new"] for r in rows_ if r["mode"] == mode and r["sessions"] == count]
        return found[0] if found else None

    one, eight, latent = new("frames", 1), new("frames", 8), new("latents", 8)
    values = {
        "window_ms_n1_max": one and one["ms_per_step"], "decode_ms_n1_max": one and one["ms_per_decode"],
        "denoise_step_ms_n1_max": one and one["ms_per_denoise_step"],
        "frames_env_steps_per_s_n8_min": eight and eight["env_steps_per_s"],
        "latents_env_steps_per_s_n8_min": latent and latent["env_steps_per_s"],
    }
    out: dict[str, Any] = {"judged": judged}
    for key, target in TARGETS.items():
        value = values[key]
        met = None if value is None or not judged else (value <= target if key.endswith("_max") else value >= target)
        out[key] = {"target": target, "value": value, "met": met}
    return out


def ab_table(f: dict[str, Any]) -> Table:
    ab = f["ab"]
    refused = {name: sorted(p["refused"]) for name, p in ab["paths"].items() if p["refused"]}
    table = Table(
        title=f"today's path vs the new defaults, {f['arch']} at {f['height']}x{f['width']}, {ab['num_steps']} steps, "
              f"interleaved ({ab['warmup']} warm-up + {ab['rounds']} rounds)",
        columns=["mode", "sessions", "today ms / step", "new ms / step", "speedup [95% CI]", "today env steps/s",
                 "new env steps/s", "new ms / decode", "new ms / denoise step", "new MFU"],
        note="today: " + ", ".join(f"{k}={v}" for k, v in ab["paths"]["today"]["knobs"].items())
             + f" ({ab['paths']['today']['backend']}); new: "
             + ", ".join(f"{k}={v}" for k, v in ab["paths"]["new"]["knobs"].items())
             + f" ({ab['paths']['new']['backend']}). Speedup: today's median over the new one's, bootstrap "
             "interval over the paired rounds." + (f" Refused on this device: {refused}." if refused else ""),
    )
    for r in ab["rows"]:
        today, new = r["paths"]["today"], r["paths"]["new"]
        s = r["speedup"]
        table.add(r["mode"], r["sessions"], today["ms_per_step"], new["ms_per_step"],
                  f"{s['value']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]", today["env_steps_per_s"],
                  new["env_steps_per_s"], new["ms_per_decode"] if r["mode"] == "frames" else None,
                  new["ms_per_denoise_step"], new["mfu"])
    return table
