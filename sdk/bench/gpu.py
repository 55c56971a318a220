"""`worldstep bench gpu`: Cosmos3-Edge at full size on one CUDA device, random bf16 transformer.

The modules are built once, in memory (never saved), with the VAE in the dtype users get (`--vae-dtype`,
float32 as `load()` builds it today), and run at 832x480 with 16-action windows. `--sections`, in order:

- ``windows``: one session; ms per denoise step / commit / decode, gen-forward TFLOP/s and MFU
  (analytic FLOPs, `flops.py`), real-time factor (video seconds per wall second) at each step count,
  with and without CFG. Warm-up windows first fill the context (`--context-frames`), so every timed
  window (`--windows`, default 5) attends to the full context: one context length, up to a page.
- ``sessions``: N sessions through ONE batched forward per step (decode overlap off; the forwards are
  counted): aggregate env steps/s and video s/s,
  peak KV pages and peak device memory next to `worldstep info`'s memory plan for the same config.
- ``official``: NVIDIA's diffusers recipe (`official.py`) on the same modules and GPU, next to
  worldstep's env step at the same steps.
- ``backends``: ms per denoise step with sdpa and with flashinfer on the same modules (decode off).
- ``overlap``: N decoding sessions as one forward of N vs two halves with one half's decode overlapped
  (`gpu_overlap.py`): whether the engine's decode overlap pays on this GPU.
- ``cadence``: time to first frames, inter-window p50/p95 at full context, real-time factor at N = 1 and
  aggregate at N = 8, MFU (`gpu_cadence.py`).
- ``ab``: today's path (fp32 decode, eager, decode after the commit) against the new defaults, interleaved in
  one call at each N of ``--ab-sessions``, frames and latent mode: each gain a ratio with its interval
  (`gpu_ab.py`, `gpu_variants.py`).
- ``profile``: one window at N = 1 of each path under the torch profiler: the top kernels (`gpu_profile.py`).
- ``decoder``: the warm decoder alone, ms and TFLOP/s per window, each path's decoder options (`gpu_decoder.py`).

Every wall time is taken between two synchronizes of the device (`measure.SyncedStopwatch`).

Each section runs on its own: before it starts, its memory plan (`gpu_memory.py`) is checked against the
device's free memory, and one that cannot fit is skipped with the reason (``skipped_sections``); one that
fails has its error recorded (``errors``, exit status 1) and the next section still runs. Figures of each
finished section go to `--partial-json` at once, so a run cut short keeps them. Every figure names its device
(``device``, ``device_name``). Without CUDA it prints why and exits 0 (`--allow-cpu` runs the same code on the
CPU, for tests with `--arch tiny`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from worldstep.engine.devices import canonical_device

from .archs import action_chunks, bench_arch
from .flops import GenShape, forward_flops, peak_tflops
from .gpu_memory import fit_problem, measured_extra, section_plan, start_measuring
from .gpu_model import MAX_WARM_UP, edge_model, fill_context, open_sessions, rows
from .inmemory import build_components, parameter_count
from .machine import describe_machine
from .measure import SyncedStopwatch, device_sync, median, ratio
from .progress import Progress
from .results import BenchResult, Table
from .settings import GpuSettings

SECTIONS = ("windows", "sessions", "official", "backends", "overlap", "cadence", "ab", "profile", "decoder")
VAE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_gpu(settings: GpuSettings, progress: Progress) -> BenchResult:
    _check(settings)
    result = BenchResult("gpu", describe_machine(), settings=vars(settings).copy())
    if not torch.cuda.is_available() and not settings.allow_cpu:
        reason = "no CUDA device on this machine; bench gpu measured nothing (run it on a GPU machine)"
        result.results = {"skipped": True, "reason": reason}
        result.notes.append(reason)
        return result
    device = canonical_device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    arch = bench_arch(settings.arch)
    progress(f"building {arch.name} with random {_name(dtype)} weights on {device} (VAE {settings.vae_dtype})")
    components = build_components(arch, device, dtype, vae_dtype=VAE_DTYPES[settings.vae_dtype])
    model = edge_model(components, arch, device, settings.attention_backend, height=settings.height,
                       width=settings.width)
    peak = settings.peak_tflops or (peak_tflops(result.machine.get("gpu", "")) if device.type == "cuda" else None)
    result.results = {
        "skipped": False, "arch": arch.name, "device": str(device), "device_name": _device_name(device),
        "dtype": _name(dtype),
        "vae_dtype": settings.vae_dtype, "attention_backend": model.backend.value, "height": model.spec.height,
        "width": model.spec.width, "chunk_size": arch.chunk_size, "fps": model.spec.fps,
        "tokens_per_frame": model.spec.tokens_per_frame, "peak_tflops": peak,
        "transformer_params": parameter_count(model.transformer), "vae_params": parameter_count(model.vae),
    }

    def checkpoint() -> None:
        if settings.partial_json:
            result.write_json(settings.partial_json)

    for section in settings.sections:
        progress(f"section {section}")
        start = time.perf_counter()
        plan = result.results.setdefault("memory", {})[section] = section_plan(section, model, settings)
        problem = fit_problem(plan, device)
        if problem is not None:
            result.results.setdefault("skipped_sections", {})[section] = problem
            result.notes.append(f"section {section} {problem}")
            checkpoint()
            continue
        before = start_measuring(device)
        try:
            _run_section(section, result, components, model, arch, settings, device, peak, progress, checkpoint)
        except Exception as err:  # noqa: BLE001 - a failed section is recorded and the next one still runs
            message = f"{type(err).__name__}: {err}"[:2000]
            result.results.setdefault("errors", {})[section] = message
            result.notes.append(f"section {section} failed: {message.splitlines()[0]}")
            progress(f"section {section} failed: {message.splitlines()[0]}")
            if device.type == "cuda":
                torch.cuda.empty_cache()  # what the failed section held goes back before the next one
        plan["measured_extra_bytes"] = measured_extra(device, before)
        result.results.setdefault("section_s", {})[section] = round(time.perf_counter() - start, 1)
        checkpoint()
    return result


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _run_section(section: str, result: BenchResult, components, model, arch, settings: GpuSettings,
                 device: torch.device, peak: float | None, progress: Progress, checkpoint) -> None:
    """One section's figures into ``result`` (a table too)."""
    if section == "windows":
        result.results["runs"] = []
        for steps in settings.steps:
            for guidance in settings.guidance:
                result.results["runs"].append(_measure(model, arch, settings, steps, guidance, peak, progress))
                checkpoint()
        result.tables.append(_table(result.results))
    elif section == "sessions":
        from .gpu_sessions import measure_sessions, sessions_table

        result.results["sessions"] = measure_sessions(model, arch, settings, progress)
        result.tables.append(sessions_table(result.results))
    elif section == "official":
        from .gpu_official import measure_official, official_table

        result.results["official"] = measure_official(components, model, arch, settings, progress)
        result.tables.append(official_table(result.results))
    elif section == "overlap":
        from .gpu_overlap import measure_overlap, overlap_table

        result.results["overlap"] = measure_overlap(components, model, arch, settings, progress)
        result.tables.append(overlap_table(result.results))
    elif section == "cadence":
        from .gpu_cadence import cadence_table, measure_cadence

        result.results["cadence"] = measure_cadence(model, arch, settings, peak, progress)
        result.tables.append(cadence_table(result.results))
    elif section == "ab":
        from .gpu_ab import ab_table, measure_ab

        result.results["ab"] = measure_ab(components, model, arch, settings, peak, progress)
        result.tables.append(ab_table(result.results))
    elif section == "profile":
        from .gpu_profile import measure_profile, profile_table

        result.results["profile"] = measure_profile(components, model, arch, settings, progress)
        result.tables.append(profile_table(result.results))
    elif section == "decoder":
        from .gpu_decoder import decoder_table, measure_decoder

        result.results["decoder"] = measure_decoder(model, settings, progress)
        result.tables.append(decoder_table(result.results))
    else:
        result.results["backends"] = _measure_backends(components, arch, settings, device, progress)
        result.tables.append(_backends_table(result.results))


def _check(settings: GpuSettings) -> None:
    unknown = [s for s in settings.sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"sections={settings.sections} is invalid; allowed: a comma list of {', '.join(SECTIONS)}")
    if min(settings.ab_sessions, default=0) < 1 or settings.ab_rounds < 1 or settings.ab_warmup < 0:
        raise ValueError(f"ab_sessions={settings.ab_sessions}, ab_rounds={settings.ab_rounds}, ab_warmup="
                         f"{settings.ab_warmup} are invalid; allowed: sessions >= 1 (at least one), rounds >= 1, "
                         "warmup >= 0")
    if settings.vae_dtype not in VAE_DTYPES:
        raise ValueError(f"vae_dtype={settings.vae_dtype!r} is invalid; allowed: {', '.join(VAE_DTYPES)}")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _measure(model, arch, settings: GpuSettings, steps: int, guidance: float, peak: float | None,
             progress: Progress) -> dict[str, Any]:
    from worldstep.engine.config import RolloutKnobs

    progress(f"{steps} steps, guidance {guidance:g}: warm-up to full context + {settings.windows} windows")
    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=steps, guidance_scale=guidance,
                         context_frames=settings.context_frames)
    shape = GenShape.from_config(model.transformer.config)
    session = open_sessions(model, arch, knobs, 1)[0]
    chunks = iter(action_chunks(MAX_WARM_UP + settings.windows, arch))
    sync = device_sync(model.device)
    windows = []
    try:
        warm_up = fill_context(model, session, chunks)
        for _ in range(settings.windows):
            row = rows(model, [session])
            flops = forward_flops(shape, row).total
            watch = SyncedStopwatch(sync)
            r = model.step([session], [next(chunks)])[0]
            wall = watch.elapsed()[0]
            windows.append({"wall_s": wall, "denoise_s": r.timings.denoise_s, "commit_s": r.timings.commit_s,
                            "decode_s": r.timings.decode_s, "forward_flops": flops,
                            "context_tokens": row[0][1] - row[0][0], "finite": bool(torch.isfinite(r.latents).all())})
    finally:
        model.close(session)
    step_s = median([w["denoise_s"] / steps for w in windows])
    flops = median([w["forward_flops"] for w in windows])
    achieved = flops / step_s / 1e12 if step_s > 0 else float("nan")
    wall = median([w["wall_s"] for w in windows])
    return {
        "num_steps": steps, "guidance_scale": guidance, "cfg": knobs.uses_cfg,
        "warm_up_windows": warm_up["windows"], "full_context": warm_up["full"], "timed_windows": len(windows),
        "context_tokens": median([w["context_tokens"] for w in windows]),
        "context_tokens_spread": max(w["context_tokens"] for w in windows) - min(w["context_tokens"] for w in windows),
        "ms_per_denoise_step": 1e3 * step_s, "ms_per_commit": 1e3 * median([w["commit_s"] for w in windows]),
        "ms_per_decode": 1e3 * median([w["decode_s"] for w in windows]), "ms_per_window": 1e3 * wall,
        "forward_tflop": flops / 1e12, "achieved_tflops": achieved,
        "mfu": ratio(achieved, peak) if peak else None,
        "video_s_per_window": arch.chunk_size / model.spec.fps,
        "real_time_factor": ratio(arch.chunk_size / model.spec.fps, wall),
        "latents_finite": all(w["finite"] for w in windows),
        "windows": [{k: round(v, 5) if isinstance(v, float) else v for k, v in w.items()} for w in windows],
    }


def _table(f: dict[str, Any]) -> Table:
    peak = f"peak {f['peak_tflops']:g} TFLOP/s" if f["peak_tflops"] else "peak unknown (--peak-tflops)"
    table = Table(
        title=(f"{f['arch']} on {f['device']} ({f['dtype']}, VAE {f['vae_dtype']}, {f['attention_backend']}), "
               f"{f['height']}x{f['width']}, {f['chunk_size']} actions/window"),
        columns=["steps", "CFG", "context tokens", "timed windows", "ms / denoise step", "ms / commit", "ms / decode",
                 "ms / window", "TFLOP/s", "MFU", "real-time factor"],
        note=f"Medians over windows at full context (warm-up windows fill it first). Generation forward FLOPs "
             f"counted analytically (projections, attention over context, MLP); {peak}.",
    )
    for r in f["runs"]:
        table.add(r["num_steps"], r["cfg"], r["context_tokens"], r["timed_windows"], r["ms_per_denoise_step"],
                  r["ms_per_commit"], r["ms_per_decode"], r["ms_per_window"], r["achieved_tflops"], r["mfu"],
                  r["real_time_factor"])
    return table


# --- backends --------------------------------------------------------------------------------------


def _measure_backends(components, arch, settings: GpuSettings, device: torch.device,
                      progress: Progress) -> dict[str, Any]:
    """ms per denoise step, decode off, with each attention backend over the same modules and inputs."""
    from worldstep.engine.attention import AttentionBackendName, flashinfer_problems
    from worldstep.engine.config import RolloutKnobs

    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=settings.session_steps, context_frames=8,
                         decode=False)
    counts = sorted({1, max(settings.sessions)})
    out: dict[str, Any] = {"num_steps": knobs.num_steps, "counts": counts, "ms_per_denoise_step": {}}
    config = components.transformer.config
    dtype = next(components.transformer.parameters()).dtype
    for backend in (AttentionBackendName.SDPA, AttentionBackendName.FLASHINFER):
        problems = flashinfer_problems(device, dtype, config.head_dim) if backend.value == "flashinfer" else []
        if problems:  # flashinfer only where its kernels load; the figures say why not
            out["flashinfer_note"] = f"flashinfer not run: {'; '.join(problems)}"
            continue
        model = edge_model(components, arch, device, backend.value, height=settings.height, width=settings.width)
        per_count = {}
        for count in counts:
            progress(f"backend {backend.value}, {count} session(s): 1 warm-up + {settings.windows} windows")
            sessions = open_sessions(model, arch, knobs, count)
            try:
                seconds = []
                for w, actions in enumerate(action_chunks(settings.windows + 1, arch)):
                    results = model.step(sessions, [actions] * count)
                    if w > 0:
                        # the group's call: a window's timings are its share of it
                        seconds.append(results[0].timings.of_group().denoise_s / knobs.num_steps)
            finally:
                for s in sessions:
                    model.close(s)
            per_count[str(count)] = 1e3 * median(seconds)
        out["ms_per_denoise_step"][backend.value] = per_count
    fi, sd = out["ms_per_denoise_step"].get("flashinfer"), out["ms_per_denoise_step"]["sdpa"]
    out["flashinfer_speedup"] = {c: ratio(sd[c], fi[c]) for c in sd} if fi else None
    return out


def _backends_table(f: dict[str, Any]) -> Table:
    b = f["backends"]
    table = Table(title=f"attention backends, {f['arch']} at {f['height']}x{f['width']}, {b['num_steps']} steps, "
                        "decode off", columns=["sessions", "sdpa ms / step", "flashinfer ms / step", "speedup"],
                  note=b.get("flashinfer_note", "Same modules, same inputs; ms per denoise step (median)."))
    for count in b["ms_per_denoise_step"]["sdpa"]:
        fi = b["ms_per_denoise_step"].get("flashinfer", {}).get(count)
        table.add(int(count), b["ms_per_denoise_step"]["sdpa"][count], fi,
                  (b["flashinfer_speedup"] or {}).get(count))
    return table
