"""Measure the warm streaming decode in bfloat16 against float32 over a long run (docs/exactness.md).

Both decoders stream the same latents window by window from a warm cache; the causal cache carries each
window's rounding into the next, so the figures are per window, first to last, to show whether the error
builds up. Two VAEs:

- ``pusher``: the trained pusher VAE (configs/models/pusher), on the latents of a PushSim episode (its frames
  encoded whole by the same VAE), 1 latent per window as the pusher model makes them.
- ``edge``: a VAE of Edge's proportions (configs/cosmos3_edge.yaml's ``vae`` block: decoder base 256, 48
  latent channels, ...) with diffusers' default random initialisation, on Gaussian latents at a reduced latent
  grid (CPU time), 4 latents per window as Edge makes them.

Usage: ``python tools/decode_dtype_bound.py [--vae pusher|edge] [--latents 32] [--grid 2] [--fused]
[--device cuda]``; prints one JSON object. On a CPU bf16 convs run through oneDNN, accumulating in float32 as
cuDNN's do; on CUDA the float32 side's convs run in TF32 unless `torch.backends.cudnn.allow_tf32` is off.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent


def pusher_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan.from_pretrained(ROOT / "configs" / "models" / "pusher" / "vae").eval()


def edge_vae(seed: int = 0):
    """Edge's VAE architecture with diffusers' default initialisation and fixed random latent statistics."""
    from diffusers import AutoencoderKLWan

    arch = yaml.safe_load((ROOT / "configs" / "cosmos3_edge.yaml").read_text())["model"]["architecture"]["vae"]
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    z_dim = int(arch["z_dim"])
    return AutoencoderKLWan(**arch, latents_mean=(torch.randn(z_dim, generator=g) * 0.1).tolist(),
                            latents_std=(torch.rand(z_dim, generator=g) * 0.5 + 0.75).tolist()).eval()


def pusher_latents(vae, num_latents: int, seed: int = 0) -> torch.Tensor:
    """Normalised latents `[1, C, num_latents, 4, 4]` of a PushSim episode under random actions, encoded whole."""
    from worldstep.engine.vae.latents import LatentNorm
    from worldstep.envs.push_sim import PushSimEnv

    env = PushSimEnv()
    obs, _ = env.reset(seed=seed)
    frames = [obs["frames"][:1]]
    while sum(len(f) for f in frames) < 1 + 4 * (num_latents - 1):
        obs, *_ = env.step(env.np_random.uniform(-1, 1, env.action_space.shape).astype(np.float32))
        frames.append(obs["frames"])
    video = np.concatenate(frames)[: 1 + 4 * (num_latents - 1)]  # [T,H,W,3] uint8
    pixels = torch.from_numpy(video).permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0  # [1,3,T,H,W]
    with torch.no_grad():
        mu = vae.encode(pixels).latent_dist.mode()
    return LatentNorm.from_vae(vae, torch.device("cpu"), torch.float32).normalize(mu)


def compare_dtypes(vae, z: torch.Tensor, latents_per_window: int, low: str = "bfloat16", **options) -> list[dict]:
    """Per window: the `low`-dtype warm decode against the float32 one, same latents, same window pattern.

    Args:
        z: normalised latents `[1, C, t, h, w]`. options: further `DecoderOptions` for both decoders.
    Returns:
        one dict per window: max |diff| in [-1, 1] pixels, PSNR (dB, peak-to-peak 2) and the worst uint8 level.
    """
    from worldstep.engine.vae import DecoderOptions
    from worldstep.engine.vae.decoder import WarmWanDecoder

    decoders = [WarmWanDecoder(vae, DecoderOptions(dtype=d, **options)) for d in ("float32", low)]
    sessions = [d.open_session() for d in decoders]
    rows = []
    for start in range(0, z.shape[2], latents_per_window):
        window = z[:, :, start : start + latents_per_window]
        ref, low_px = (d.decode_pixels(s, window).float() for d, s in zip(decoders, sessions))
        diff = (low_px - ref).abs()
        mse = float(diff.square().mean())
        levels = (_u8(low_px).astype(np.int16) - _u8(ref).astype(np.int16)).__abs__().max()
        rows.append({"latents": [start, start + window.shape[2]], "max_abs": float(diff.max()),
                     "psnr_db": math.inf if mse == 0 else 10 * math.log10(4.0 / mse), "max_uint8": int(levels),
                     "clamped": float((ref.abs() >= 1.0).float().mean())})
    return rows


def _u8(pixels: torch.Tensor) -> np.ndarray:
    from worldstep.engine.vae.frames import frames_from_pixels

    return frames_from_pixels(pixels)


def summary(rows: list[dict]) -> dict:
    half = len(rows) // 2
    return {"windows": len(rows), "worst_max_abs": max(r["max_abs"] for r in rows),
            "worst_psnr_db": min(r["psnr_db"] for r in rows), "worst_uint8": max(r["max_uint8"] for r in rows),
            "first_half_worst_max_abs": max(r["max_abs"] for r in rows[:half]) if half else None,
            "second_half_worst_max_abs": max(r["max_abs"] for r in rows[half:]),
            "clamped_fraction": sum(r["clamped"] for r in rows) / len(rows)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vae", choices=["pusher", "edge"], default="pusher")
    parser.add_argument("--latents", type=int, default=32)
    parser.add_argument("--grid", type=int, default=2, help="edge: the latent grid's side (480x832 is 30x52)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fused", action="store_true", help="both decoders on the fused path (engine/vae/fused.py)")
    parser.add_argument("--device", default="cpu", help="where the VAE decodes (cuda: cuDNN's bf16 kernels)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    if args.vae == "pusher":
        vae = pusher_vae()
        z, per_window = pusher_latents(vae, args.latents, args.seed), 1
    else:
        vae = edge_vae(args.seed)
        g = torch.Generator().manual_seed(args.seed)
        z, per_window = torch.randn(1, vae.config.z_dim, args.latents, args.grid, args.grid, generator=g), 4
    rows = compare_dtypes(vae.to(args.device), z.to(args.device), per_window, fused=args.fused)
    out = {"vae": args.vae, "latents": args.latents, "grid": list(z.shape[3:]), "seed": args.seed,
           "fused": args.fused, "device": args.device, "torch": torch.__version__, **summary(rows),
           "per_window": rows}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
