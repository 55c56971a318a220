"""`worldstep bench decode`: `run_decode_bench` (warm streaming decode vs the stateless context re-decode,
measured in lockstep), wrapped in the bench's table and JSON format."""

from __future__ import annotations

from typing import Any

from .machine import describe_machine
from .progress import Progress
from .results import BenchResult, Table
from .settings import DecodeSettings

_QUICK: dict[str, Any] = {
    "height": 32, "width": 32, "window_latents": (1, 2), "timed_windows": 1, "context_latents": 2,
    "cache_sizes": ((32, 32), (64, 32)), "base_dim": 8, "z_dim": 4, "dim_mult": (1, 1, 1, 1),
}


def run_decode(settings: DecodeSettings, progress: Progress) -> BenchResult:
    result = BenchResult("decode", describe_machine(), settings=vars(settings).copy())
    from .decode_lockstep import run_decode_bench

    if settings.quick:
        kwargs = dict(_QUICK)
    else:
        kwargs = {"height": settings.height, "width": settings.width, "window_latents": tuple(settings.window_latents),
                  "timed_windows": settings.timed_windows, "base_dim": settings.base_dim}
    progress(f"run_decode_bench({', '.join(f'{k}={v}' for k, v in kwargs.items())})")
    figures = run_decode_bench(verbose=False, **kwargs)
    result.results = figures
    result.tables.append(_table(figures))
    return result


def _table(f: dict[str, Any]) -> Table:
    c = f["config"]
    table = Table(
        title=(f"Warm streaming decode vs stateless re-decode, Wan 2.2-family VAE base_dim {c['base_dim']}, "
               f"{c['height']}x{c['width']}, context {c['context_latents']} latents"),
        columns=["latents / window", "frames", "warm ms", "stateless ms", "speedup", "stateless PSNR dB"],
        note=(f"Warm windows vs one whole-stream vae.decode: max |diff| {f['warm_max_abs_diff']:.1e} "
              f"({'within' if f['warm_within_bound'] else 'OUTSIDE'} the stated float32 rounding bound). "
              "PSNR of the uint8 frames (60 dB = identical)."),
    )
    for r in f["windows"]:
        table.add(r["latents_per_window"], r["frames_per_window"], r["warm_ms"], r["stateless_ms"], r["speedup"],
                  r["stateless_psnr_db"])
    return table
