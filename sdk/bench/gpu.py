"""`worldstep bench gpu`: Cosmos3-Edge at full size on one CUDA device, random bf16 weights.

One 16-action window at the 480p tier per setting: ms per denoise step, per commit and per decode;
achieved TFLOP/s of the generation forward (analytic FLOPs, `flops.py`) and MFU against the device
peak; real-time factor (video seconds produced per wall second) at each step count, with and
without CFG. On a machine without CUDA it prints why and exits 0 (`--allow-cpu` runs the same code
on the CPU, for tests with `--arch tiny`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .archs import PROMPT, action_chunks, bench_arch, first_frame
from .flops import GenShape, forward_flops, peak_tflops
from .inmemory import build_components, parameter_count
from .machine import describe_machine
from .measure import median, ratio
from .progress import Progress
from .results import BenchResult, Table
from .settings import GpuSettings


def run_gpu(settings: GpuSettings, progress: Progress) -> BenchResult:
    result = BenchResult("gpu", describe_machine(), settings=vars(settings).copy())
    if not torch.cuda.is_available() and not settings.allow_cpu:
        reason = "no CUDA device on this machine; bench gpu measured nothing (run it on a GPU machine)"
        result.results = {"skipped": True, "reason": reason}
        result.notes.append(reason)
        return result
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    arch = bench_arch(settings.arch)
    progress(f"building {arch.name} with random {str(dtype).removeprefix('torch.')} weights on {device}")
    model = _build_model(arch, settings, device, dtype)
    peak = settings.peak_tflops or (peak_tflops(result.machine.get("gpu", "")) if device.type == "cuda" else None)
    runs = []
    for steps in settings.steps:
        for guidance in settings.guidance:
            progress(f"{steps} steps, guidance {guidance:g}: 1 warm-up + {settings.windows} windows")
            runs.append(_measure(model, arch, settings, steps, guidance, peak))
    result.results = {
        "skipped": False, "arch": arch.name, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
        "attention_backend": model.backend.value, "height": model.spec.height, "width": model.spec.width,
        "chunk_size": arch.chunk_size, "fps": model.spec.fps, "peak_tflops": peak,
        "transformer_params": parameter_count(model.transformer), "vae_params": parameter_count(model.vae),
        "runs": runs,
    }
    result.tables.append(_table(result.results))
    return result


def _build_model(arch, settings: GpuSettings, device: torch.device, dtype: torch.dtype):
    from worldstep.engine.models.cosmos3 import Cosmos3WorldModel

    components = build_components(arch, device, dtype)
    return Cosmos3WorldModel(components, device=device, num_pages=512, page_size=arch.page_size,
                             height=settings.height or arch.height, width=settings.width or arch.width,
                             name=f"bench-{arch.name}")


def _rows(model, session) -> list[tuple[int, int]]:
    """(fresh tokens, attended tokens) per row of the session's next window."""
    q = session.knobs.latents_per_window * model.spec.tokens_per_frame + session.knobs.chunk_size
    if session.window_index == 0:
        q += model.spec.tokens_per_frame  # the clean conditioning frame rides in window 0
    return [(q, model.kv.page_table((session.session_id, label)).seq_len + q) for label in session.labels]


def _measure(model, arch, settings: GpuSettings, steps: int, guidance: float, peak: float | None) -> dict[str, Any]:
    from worldstep.engine.models.cosmos3 import RolloutKnobs

    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=steps, guidance_scale=guidance, context_frames=8)
    shape = GenShape.from_config(model.transformer.config)
    session = model.open_session(first_frame(model.spec.height, model.spec.width), PROMPT, arch.domain_id, knobs=knobs,
                                 generator=torch.Generator().manual_seed(0))
    chunks = action_chunks(settings.windows + 1, arch)
    windows = []
    try:
        for w, actions in enumerate(chunks):
            flops = forward_flops(shape, _rows(model, session)).total
            start = time.perf_counter()
            r = session.step(actions)
            wall = time.perf_counter() - start
            if w > 0:  # window 0 warms kernels, allocators and the decoder cache
                windows.append({"wall_s": wall, "denoise_s": r.timings.denoise_s, "commit_s": r.timings.commit_s,
                                "decode_s": r.timings.decode_s, "forward_flops": flops})
    finally:
        session.close()
    step_s = median([w["denoise_s"] / steps for w in windows])
    flops = median([w["forward_flops"] for w in windows])
    achieved = flops / step_s / 1e12 if step_s > 0 else float("nan")
    wall = median([w["wall_s"] for w in windows])
    return {
        "num_steps": steps, "guidance_scale": guidance, "cfg": knobs.uses_cfg,
        "ms_per_denoise_step": 1e3 * step_s, "ms_per_commit": 1e3 * median([w["commit_s"] for w in windows]),
        "ms_per_decode": 1e3 * median([w["decode_s"] for w in windows]), "ms_per_window": 1e3 * wall,
        "forward_tflop": flops / 1e12, "achieved_tflops": achieved,
        "mfu": ratio(achieved, peak) if peak else None,
        "video_s_per_window": arch.chunk_size / model.spec.fps,
        "real_time_factor": ratio(arch.chunk_size / model.spec.fps, wall),
        "windows": windows,
    }


def _table(f: dict[str, Any]) -> Table:
    peak = f"peak {f['peak_tflops']:g} TFLOP/s" if f["peak_tflops"] else "peak unknown (--peak-tflops)"
    table = Table(
        title=(f"{f['arch']} on {f['device']} ({f['dtype']}, {f['attention_backend']}), {f['height']}x{f['width']}, "
               f"{f['chunk_size']} actions/window"),
        columns=["steps", "CFG", "ms / denoise step", "ms / commit", "ms / decode", "ms / window", "TFLOP/s",
                 "MFU", "real-time factor"],
        note=f"Generation forward FLOPs counted analytically (projections, attention over context, MLP); {peak}.",
    )
    for r in f["runs"]:
        table.add(r["num_steps"], r["cfg"], r["ms_per_denoise_step"], r["ms_per_commit"], r["ms_per_decode"],
                  r["ms_per_window"], r["achieved_tflops"], r["mfu"], r["real_time_factor"])
    return table
