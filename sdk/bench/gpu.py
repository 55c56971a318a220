"""`worldstep bench gpu`: Cosmos3-Edge at full size on one CUDA device, random bf16 weights.

One 16-action window at the 480p tier per setting: ms per denoise step, per commit and per decode;
achieved TFLOP/s of the generation forward (analytic FLOPs, `flops.py`) and MFU against the device
peak; real-time factor (video seconds produced per wall second) at each step count, with and
without CFG. On a machine without CUDA it prints why and exits 0 (`--allow-cpu` runs the same code
on the CPU, for tests with `--arch tiny`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from .archs import BenchArch, action_chunks, bench_arch, checkpoint_for, open_session, rollout_knobs
from .flops import GenShape, forward_flops, peak_tflops
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
    params = {name: sum(p.numel() for p in module.parameters())
              for name, module in (("transformer", model.transformer), ("vae", model.vae))}
    peak = settings.peak_tflops or (peak_tflops(result.machine.get("gpu", "")) if device.type == "cuda" else None)
    runs = []
    for steps in settings.steps:
        for guidance in settings.guidance:
            progress(f"{steps} steps, guidance {guidance:g}: 1 warm-up + {settings.windows} windows")
            runs.append(_measure(model, arch, settings, steps, guidance, peak))
    result.results = {
        "skipped": False, "arch": arch.name, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
        "attention_backend": model.window.backend.value, "height": model.spec.height, "width": model.spec.width,
        "chunk_size": arch.chunk_size, "fps": model.spec.fps, "peak_tflops": peak,
        "transformer_params": params["transformer"], "vae_params": params["vae"],
        "runs": runs,
    }
    result.tables.append(_table(result.results))
    return result


@torch.no_grad()
def _randomize_(module: torch.nn.Module, seed: int, std: float) -> None:
    """Small random weights (norm scales near 1), drawn on the module's own device."""
    for index, (name, param) in enumerate(module.named_parameters()):
        generator = torch.Generator(device=param.device).manual_seed(seed + index)
        noise = torch.randn(param.shape, generator=generator, device=param.device, dtype=torch.float32)
        param.copy_(1.0 + 0.1 * noise if name.endswith("weight") and "norm" in name else std * noise)


def _cast(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`dtype` everywhere except the modules the class keeps in float32, as `from_pretrained(torch_dtype=...)`."""
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(torch.float32 if keep.intersection(name.split(".")) else dtype)
    return module


def _build_model(arch: BenchArch, settings: GpuSettings, device: torch.device, dtype: torch.dtype):
    """`arch` with random weights built directly on `device`: Edge at full size is ~4 B parameters, and building
    it on the CPU in fp32 and writing safetensors would take longer than the whole bench."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer, UniPCMultistepScheduler
    from worldstep.engine.models.cosmos3 import Cosmos3Components, Cosmos3WorldModel
    from worldstep.engine.models.cosmos3.checkpoint import build_tokenizer
    from worldstep.engine.vae import DecoderOptions

    transformer_arch, vae_arch = dict(arch.architecture["transformer"]), dict(arch.architecture["vae"])
    z_dim = int(vae_arch["z_dim"])
    vae_arch.setdefault("latents_mean", [0.0] * z_dim)
    vae_arch.setdefault("latents_std", [1.0] * z_dim)
    with torch.device(device):
        transformer = _cast(Cosmos3OmniTransformer(**transformer_arch), dtype)
        vae = _cast(AutoencoderKLWan(**vae_arch), dtype)
    _randomize_(transformer, 0, std=0.02)
    _randomize_(vae, 1, std=0.05)
    # the scheduler every checkpoint of the engine's builder ships (read from the embedded tiny one)
    scheduler = Path(checkpoint_for(bench_arch("tiny"), settings.cache_dir)) / "scheduler"
    components = Cosmos3Components(
        path=Path(f"<in-memory {arch.name}>"), transformer=transformer.eval().requires_grad_(False),
        vae=vae.eval().requires_grad_(False), scheduler_config=dict(UniPCMultistepScheduler.load_config(scheduler)),
        tokenizer=build_tokenizer(int(transformer_arch["vocab_size"])),
        media={k: arch.architecture[k] for k in ("height", "width", "fps") if k in arch.architecture})
    return Cosmos3WorldModel(components, device=device, num_pages=512, page_size=arch.page_size,
                             height=settings.height or arch.height, width=settings.width or arch.width,
                             name=f"bench-{arch.name}", decoder_options=DecoderOptions(**arch.decoder))


def _rows(model, session) -> list[tuple[int, int]]:
    """(fresh tokens, attended tokens) per row (CFG stream) of the session's next window."""
    q = session.plan.units * model.spec.tokens_per_frame + session.knobs.chunk_size
    return [(q, model.kv.page_table(key).seq_len + q) for key in session.stream_keys()]


def _measure(model, arch, settings: GpuSettings, steps: int, guidance: float, peak: float | None) -> dict[str, Any]:
    knobs = rollout_knobs(arch, steps, 8, guidance_scale=guidance)
    shape = GenShape.from_config(model.transformer.config)
    session = open_session(model, arch, knobs)
    chunks = action_chunks(settings.windows + 1, arch)
    windows = []
    try:
        for w, actions in enumerate(chunks):
            flops = forward_flops(shape, _rows(model, session)).total
            start = time.perf_counter()
            r = model.step([session], [actions])[0]
            wall = time.perf_counter() - start
            if w > 0:  # window 0 warms kernels, allocators and the decoder cache
                windows.append({"wall_s": wall, "denoise_s": r.timings.denoise_s, "commit_s": r.timings.commit_s,
                                "decode_s": r.timings.decode_s, "forward_flops": flops})
    finally:
        model.close(session)
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
