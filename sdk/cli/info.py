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
    json: bool = flag("print JSON", default=False)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_info(args: argparse.Namespace) -> int:
    import torch
    from worldstep.engine.models.cosmos3 import CheckpointNotFoundError

    from ..memory import plan, plan_for_world, weights_from_architecture, weights_of_world
    from ..world import load

    model, config = prepare(args)
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
        out.update(loaded=True, device=str(world.model.device), dtype=str(world.model.dtype).removeprefix("torch."),
                   frame=f"{spec.height}x{spec.width} @ {spec.fps:g} fps", action_dim=spec.action_dim,
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
