"""`worldstep bench decode`: the warm streaming decode against the two ways to decode a window without it.

One random-weight Wan 2.2-family VAE (z_dim 16, dim_mult 1,2,4,4) on the reference kernels `vae.decode` runs.
Each row decodes windows of `w` latents of one session three ways, in lockstep (the first of the three
rotating, so all see the same machine load):

- warm: `WarmWanDecoder` keeps the session's causal-conv cache and decodes only the window's latents;
- stateless: re-decodes the last `context_latents` latents from an empty cache ahead of each window, an
  approximation (PSNR below) doing `(K + w) / w` times the work by construction;
- whole clip: `vae.decode` of every latent so far, keeping the window's frames: exact, what a user without a
  streaming decoder does, and `clip / w` times the work, growing with the clip.

Timed windows start after latent 0 and a `context_latents` prefix (decoded warm, untimed), where the stateless
path pays its full re-decode. Every warm frame of a row is checked against its last whole-clip decode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from statistics import median
from typing import Any

import torch
from worldstep.engine.devices import canonical_device

from .machine import describe_machine
from .measure import ratio
from .progress import Progress
from .results import BenchResult, Table
from .settings import DecodeSettings

Z_DIM = 16


def build_bench_vae(base_dim: int, seed: int = 0):
    """A Wan 2.2-family VAE (residual, patch 2, 16x spatial, 4x temporal) with random weights."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    return AutoencoderKLWan(
        base_dim=base_dim, decoder_base_dim=base_dim, z_dim=Z_DIM, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
        scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=(torch.randn(Z_DIM, generator=g) * 0.5).tolist(),
        latents_std=(torch.rand(Z_DIM, generator=g) + 0.5).tolist(),
    ).eval()


def _check(s: DecodeSettings) -> None:
    if s.height % 16 or s.width % 16 or min(s.height, s.width) < 16:
        raise ValueError(f"height x width = {s.height}x{s.width} is invalid; allowed: positive multiples of 16")
    if s.timed_windows < 3:
        raise ValueError(f"timed_windows={s.timed_windows} is invalid; allowed: >= 3")
    if s.context_latents < 1 or s.base_dim < 1 or not s.window_latents or min(s.window_latents) < 1:
        raise ValueError(f"context_latents={s.context_latents}, base_dim={s.base_dim}, window_latents="
                         f"{s.window_latents} are invalid; allowed: >= 1 each, at least one window size")


def run_decode(settings: DecodeSettings, progress: Progress) -> BenchResult:
    _check(settings)
    from worldstep.engine.vae import WHOLE_CLIP_DECODE_ATOL
    from worldstep.engine.vae.latents import LatentNorm

    result = BenchResult("decode", describe_machine(), settings=vars(settings).copy())
    vae = build_bench_vae(settings.base_dim)
    norm = LatentNorm.from_vae(vae, canonical_device("cpu"), torch.float32)
    rows = []
    for w in settings.window_latents:
        progress(f"{w} latents/window: {settings.timed_windows} timed windows, warm | stateless | whole clip")
        rows.append(_row(vae, norm, settings, w))
    worst = max(r["warm_max_abs_diff"] for r in rows)
    result.results = {"rows": rows, "warm_max_abs_diff": worst, "bound": WHOLE_CLIP_DECODE_ATOL,
                      "warm_within_bound": worst <= WHOLE_CLIP_DECODE_ATOL, "z_dim": Z_DIM}
    result.tables.append(_table(settings, result.results))
    return result


def _timed(fn: Callable[[], torch.Tensor], wall: list[float], cpu: list[float]) -> torch.Tensor:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    wall.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
    return out


def _row(vae, norm, s: DecodeSettings, w: int) -> dict[str, Any]:
    """Decode `1 + K + timed_windows * w` latents; time the last `timed_windows` windows three ways."""
    from worldstep.engine.vae import DecoderOptions
    from worldstep.engine.vae.decoder import WarmWanDecoder
    from worldstep.engine.vae.frames import frames_from_pixels
    from worldstep.engine.vae.session import DecodePath
    from worldstep.measures.frames import psnr

    k, n = s.context_latents, s.timed_windows
    z = torch.randn(1, Z_DIM, 1 + k + n * w, s.height // 16, s.width // 16, generator=torch.Generator().manual_seed(w))
    dec = WarmWanDecoder(vae, DecoderOptions(context_latents=k, max_warm_sessions=1))
    warm = dec.open_session()
    warm_px = [dec.decode_pixels(warm, z[:, :, :1]), dec.decode_pixels(warm, z[:, :, 1:1 + k])]
    cold = dec.fork_session(warm)  # the one warm slot is taken: stateless, with the context a stateless session holds
    assert cold.path is DecodePath.STATELESS
    wall: dict[str, list[float]] = {"warm": [], "stateless": [], "whole_clip": []}
    cpu: dict[str, list[float]] = {name: [] for name in wall}
    cold_px, ref_px, clips, whole = [], [], [], None
    for i in range(n):
        start, end = 1 + k + i * w, 1 + k + (i + 1) * w
        window = z[:, :, start:end]
        calls: dict[str, Callable[[], torch.Tensor]] = {
            "warm": lambda window=window: dec.decode_pixels(warm, window),
            "stateless": lambda window=window: dec.decode_pixels(cold, window),
            "whole_clip": lambda end=end: _decode_clip(vae, norm, z[:, :, :end]),
        }
        names = list(calls)[i % 3:] + list(calls)[:i % 3]
        out = {name: _timed(calls[name], wall[name], cpu[name]) for name in names}
        warm_px.append(out["warm"])
        cold_px.append(out["stateless"])
        whole = out["whole_clip"]
        ref_px.append(whole[:, :, -4 * w:])
        clips.append(end)
    cache_bytes = dec.cache_bytes(warm)
    for session in (warm, cold):
        dec.close_session(session)
    ms = {name: 1e3 * median(v) for name, v in wall.items()}
    cpu_ms = {name: 1e3 * median(v) for name, v in cpu.items()}
    return {
        "latents_per_window": w, "frames_per_window": 4 * w, "clip_latents": clips,
        "ms": ms, "cpu_ms": cpu_ms, "samples_ms": {name: [1e3 * x for x in v] for name, v in wall.items()},
        "stateless_over_warm": ratio(ms["stateless"], ms["warm"]),
        "whole_clip_over_warm": ratio(ms["whole_clip"], ms["warm"]),
        "cpu_stateless_over_warm": ratio(cpu_ms["stateless"], cpu_ms["warm"]),
        "cpu_whole_clip_over_warm": ratio(cpu_ms["whole_clip"], cpu_ms["warm"]),
        "work_stateless_over_warm": (k + w) / w, "work_whole_clip_over_warm": sum(clips) / len(clips) / w,
        "stateless_psnr_db": round(float(psnr(frames_from_pixels(torch.cat(cold_px, 2)),
                                              frames_from_pixels(torch.cat(ref_px, 2))).mean()), 2),
        "warm_max_abs_diff": float((torch.cat(warm_px, 2) - whole).abs().max()),
        "warm_cache_bytes": cache_bytes,
    }


@torch.inference_mode()
def _decode_clip(vae, norm, z: torch.Tensor) -> torch.Tensor:
    """`vae.decode` of normalised latents `[1, C, t, h, w]` -> pixels `[1, 3, 1 + 4(t-1), H, W]`."""
    return vae.decode(norm.denormalize(z)).sample


def _table(s: DecodeSettings, f: dict[str, Any]) -> Table:
    table = Table(
        title=(f"Warm streaming decode vs stateless and whole-clip re-decode, Wan 2.2-family VAE base_dim "
               f"{s.base_dim}, {s.height}x{s.width}, stateless context {s.context_latents} latents"),
        columns=["latents / window", "clip latents", "warm ms", "stateless ms", "whole clip ms", "stateless / warm",
                 "whole clip / warm", "stateless / warm, CPU", "whole clip / warm, CPU", "work ratios",
                 "stateless PSNR dB", "warm cache MiB"],
        note=(f"Medians of {s.timed_windows} timed windows per row, decoded in lockstep. CPU: process CPU time (with "
              "--threads 1, about the wall time on an idle core). Work ratios: latents decoded per window relative "
              "to warm, (K + w) / w and mean clip / w: the speedups by construction. "
              f"Warm frames vs the whole-clip vae.decode: max |diff| {f['warm_max_abs_diff']:.1e} "
              f"({'within' if f['warm_within_bound'] else 'OUTSIDE'} the {f['bound']:g} bound). "
              "PSNR of the uint8 frames."),
    )
    for r in f["rows"]:
        clips = r["clip_latents"]
        table.add(r["latents_per_window"], f"{clips[0]}..{clips[-1]}", r["ms"]["warm"], r["ms"]["stateless"],
                  r["ms"]["whole_clip"], r["stateless_over_warm"], r["whole_clip_over_warm"],
                  r["cpu_stateless_over_warm"], r["cpu_whole_clip_over_warm"],
                  f"{r['work_stateless_over_warm']:.1f} / {r['work_whole_clip_over_warm']:.1f}",
                  r["stateless_psnr_db"], r["warm_cache_bytes"] / 2**20)
    return table
