"""``worldstep info``: model, device, weights and the KV memory plan (from the architecture when the weights are
not there)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from ..flags import flag, positive_int
from .common import prepare


@dataclass
class InfoFlags:
    """``worldstep info``."""

    windows: int = flag("episode length for the plan", default=32, type=positive_int)
    context_frames: int | None = flag("committed latent frames kept in context (default: the config's)",
                                      default=None)
    text_tokens: int = flag("prompt tokens assumed when the checkpoint cannot be loaded", default=256,
                            type=positive_int)
    dtype: str | None = flag("weights dtype to plan or load with (default: the loader's: bfloat16 on CUDA, float32 on "
                             "CPU)", default=None, choices=("float32", "bfloat16", "float16"))
    json: bool = flag("print JSON", default=False)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_info(args: argparse.Namespace) -> int:
    import torch
    from worldstep.engine.models.cosmos3.loader import CheckpointNotFoundError
    from worldstep.envs.video import frame_fps

    from ..memory import plan, plan_for_world, weights_from_architecture, weights_of_world
    from ..world import load, make_env

    if (args.device or "").startswith("cuda") and not torch.cuda.is_available():
        return _plan_cuda(args)  # the plan a GPU buyer needs, on the machine they have
    model, config = prepare(args, dtype=args.dtype)
    out: dict[str, Any] = {"model": config.model.name, "checkpoint": config.model.checkpoint}
    try:
        world = load(config)
    except CheckpointNotFoundError as err:
        device = config.model.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        out.update(loaded=False, device=device, note=f"checkpoint not loaded, plan from model.architecture: {err}")
        weights = weights_from_architecture(config)
        memory = plan(config, windows=args.windows, text_tokens=args.text_tokens)
    else:
        spec = world.spec
        env = make_env(world)  # the fps an episode's frames play at is the env's (its embodiment's), not the base's
        fps = frame_fps(env)
        env.close()
        out.update(loaded=True, device=str(world.model.device), dtype=str(world.model.dtype).removeprefix("torch."),
                   frame=f"{spec.height}x{spec.width} @ {fps:g} fps (model base fps {spec.fps:g})",
                   action_dim=spec.action_dim,
                   num_domains=spec.num_domains, chunk_size=config.rollout.chunk_size)
        weights = weights_of_world(world)
        memory = plan_for_world(world, windows=args.windows)
    out["weights"] = None if weights is None else weights.to_dict()
    out["memory"] = memory.to_dict()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for key, value in out.items():
        if key not in ("memory", "weights"):
            print(f"{key:>12}: {value}")
    if weights is not None:
        how = "measured" if weights.measured else "estimated from model.architecture"
        print(f"weights ({weights.dtype}, {how}):")
        print(f"  transformer             {_bytes(weights.transformer_bytes)}")
        print(f"  vae                     {_bytes(weights.vae_bytes)}")
        print(f"  total                   {_bytes(weights.total_bytes)}")
    text = "measured" if memory.text_tokens_measured else "estimated, --text-tokens"
    cfg = "CFG, 2 streams" if memory.streams == 2 else "1 stream"
    context = f"{memory.context_frames} latent frames" if memory.context_frames else "unbounded"
    print("memory plan (KV cache):")
    print(f"  KV bytes per token      {memory.kv_bytes_per_token} ({_bytes(memory.kv_bytes_per_token)})")
    print(f"  page size               {memory.page_size} tokens = {_bytes(memory.page_bytes)}")
    print(f"  pages                   {memory.num_pages} = {_bytes(memory.pool_bytes)}")
    print(f"  prompt tokens           {memory.text_tokens} ({text})")
    print(f"  tokens per window       {memory.tokens_per_window} "
          f"({memory.tokens_per_frame} per latent frame + actions)")
    print(f"  context                 {context}, {cfg}")
    print(f"  pages per episode       {memory.peak_pages_per_episode} at peak over {memory.windows} windows "
          f"({_bytes(memory.peak_pages_per_episode * memory.page_bytes)})")
    print(f"  episodes per pool       {memory.episodes_per_pool}")
    if weights is not None:
        print(f"weights + KV pool         {_bytes(weights.total_bytes + memory.pool_bytes)} on {out['device']}")
    return 0


def _plan_cuda(args: argparse.Namespace) -> int:
    """``info --device cuda`` without CUDA: the memory plan of a CUDA run, beside the measured GPU figures."""
    from ..cuda_plan import cuda_plan, measured_peaks
    from ..world import resolve_config
    from .common import model_and_overrides

    model, overrides = model_and_overrides(args, dtype=args.dtype)
    config = resolve_config(model).with_overrides(**overrides)
    planned, memory = cuda_plan(config, windows=args.windows, text_tokens=args.text_tokens)
    device, settings, peaks = measured_peaks()
    out = {"model": config.model.name, "device": config.model.device, "loaded": False,
           "note": "planned for CUDA on a machine without it (model.architecture, prompt of --text-tokens)",
           "cuda_plan": planned.to_dict(), "memory": memory.to_dict(),
           "measured": {"device": device, "settings": settings, "peaks": [vars(p) for p in peaks]}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    cfg = "CFG, 2 streams" if planned.cfg else "1 stream"
    print(f"CUDA plan for {config.model.name} (not loaded; this machine has no CUDA):")
    print(f"  {f'transformer ({planned.dtype})':<26}{_bytes(planned.transformer_bytes)}")
    print(f"  {'VAE (float32)':<26}{_bytes(planned.vae_bytes)}")
    print(f"  {f'decoder copy ({planned.decoder_dtype})':<26}{_bytes(planned.decoder_copy_bytes)}")
    print(f"  KV pool                   {memory.num_pages} pages of {memory.page_size} tokens = "
          f"{_bytes(planned.pool_bytes)} (holds {planned.max_sessions(memory.num_pages)} sessions of "
          f"{planned.kv_pages_per_session} pages at their peak over {memory.windows} windows, {cfg})")
    print(f"  per session               {_bytes(planned.session_bytes)} (attention gathers, activations, warm "
          "decoder feature maps)")
    for n in planned.sessions:
        print(f"  {f'peak, {n} session(s)':<26}{_bytes(planned.peak_bytes(n))} (x{planned.margin:g} margin)")
    if peaks:
        print(f"measured on {device} (docs/bench/gpu/h200-141gb; transformer {settings['dtype']}, decoder "
              f"{settings['decoder_dtype']}, {settings['pool_pages']} pool pages, {settings['height']}x"
              f"{settings['width']}):")
        for p in peaks:
            speed = f", {p.ms_per_step:,.0f} ms a step at 4 denoise steps" if p.ms_per_step else ""
            label = f"peak, {p.sessions} session(s){' with CFG' if p.cfg else ''}"
            print(f"  {label:<26}{_bytes(p.peak_bytes)}{speed}")
    return 0
