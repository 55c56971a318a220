"""`worldstep bench decode`: the warm streaming decode against the stateless context re-decode.

One random-weight Wan 2.2-family VAE, one latent stream. A warm stream and a stateless stream
decode the same windows in lockstep (alternating which goes first), so both see the same machine
load; the speedup is the ratio of their median ms per window, measured side by side. Windows are
timed only once the stream is past `context_latents`, where the stateless path pays its full
re-decode. Both are checked against one `vae.decode` of the whole stream: the warm path agrees within
float32 rounding (`WHOLE_STREAM_DECODE_ATOL`), the stateless path is an approximation (PSNR).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
from diffusers import AutoencoderKLWan
from tqdm.auto import tqdm
from worldstep.engine.vae import (
    WHOLE_STREAM_DECODE_ATOL,
    DecoderOptions,
    LatentNorm,
    StreamPath,
    WarmWanDecoder,
    frames_from_pixels,
)
from worldstep.fidelity.metrics import psnr


def build_bench_vae(
    base_dim: int = 32, z_dim: int = 16, dim_mult: Sequence[int] = (1, 2, 4, 4), num_res_blocks: int = 1, seed: int = 0
) -> AutoencoderKLWan:
    """A Wan 2.2-family VAE (residual, patch 2, 16x spatial, 4x temporal) with random weights."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    return AutoencoderKLWan(
        base_dim=base_dim, decoder_base_dim=base_dim, z_dim=z_dim, dim_mult=list(dim_mult),
        num_res_blocks=num_res_blocks, temperal_downsample=[False, True, True], is_residual=True,
        in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=(torch.randn(z_dim, generator=g) * 0.5).tolist(),
        latents_std=(torch.rand(z_dim, generator=g) + 0.5).tolist(),
    ).eval()


def _window_plan(window_latents: Sequence[int], timed_windows: int, context_latents: int) -> list[tuple[int, bool]]:
    """(latents, timed) per window: latent 0 alone, a `context_latents` window, then the timed ones."""
    plan = [(1, False), (context_latents, False)]
    for w in window_latents:
        plan += [(w, True)] * timed_windows
    return plan


def _lockstep(vae, z: torch.Tensor, plan, context_latents: int, progress: bool) -> tuple[dict, list, int]:
    """Decode `z` window by window on a warm stream; past the untimed prefix, also on a stateless
    twin in lockstep, timing both.

    The twin is a fork of the warm stream taken with the decoder's one warm slot in use, so it is
    stateless from the first timed window on and retains the same context a stateless stream
    would have there; the prefix is decoded once instead of twice.
    """
    dec = WarmWanDecoder(vae, DecoderOptions(context_latents=context_latents, max_warm_streams=1))
    warm, cold = dec.open_stream(), None
    times: dict[int, dict[str, list[float]]] = {}
    outs: list[tuple[int, bool, torch.Tensor, torch.Tensor | None]] = []
    start = 0
    for i, (w, timed) in enumerate(tqdm(plan, desc="decode bench windows", disable=not progress)):
        window = z[:, :, start : start + w]
        if timed and cold is None:
            cold = dec.fork_stream(warm)
            assert cold.path is StreamPath.STATELESS
        got: dict[str, torch.Tensor] = {}
        order = [("warm", warm), ("stateless", cold)] if timed else [("warm", warm)]
        for name, stream in order if i % 2 == 0 else order[::-1]:  # alternate who goes first
            t0, c0 = time.perf_counter(), time.process_time()
            got[name] = dec.decode_pixels(stream, window)
            if timed:
                entry = times.setdefault(w, {"warm": [], "stateless": [], "warm_cpu": [], "stateless_cpu": []})
                entry[name].append(time.perf_counter() - t0)
                entry[f"{name}_cpu"].append(time.process_time() - c0)
        outs.append((w, timed, got["warm"], got.get("stateless")))
        start += w
    cache_bytes = dec.cache_bytes(warm)
    for stream in (warm, cold):
        if stream is not None:
            dec.close_stream(stream)
    return times, outs, cache_bytes


def _steady_cache_bytes(vae, height: int, width: int, z_dim: int) -> int:
    """A warm stream's cache after 2 latents (every slot holds its steady 2 time steps by then)."""
    dec = WarmWanDecoder(vae)
    with dec.stream() as s:
        dec.decode_pixels(s, torch.zeros(1, z_dim, 2, height // 16, width // 16))
        return dec.cache_bytes(s)


def _rows(times, outs, whole: torch.Tensor) -> tuple[list[dict], float]:
    frame0, per_w = 0, {}
    max_diff = 0.0
    for w, timed, warm, cold in outs:
        ref = whole[:, :, frame0 : frame0 + warm.shape[2]]
        frame0 += warm.shape[2]
        max_diff = max(max_diff, float((warm - ref).abs().max()))
        if timed:
            entry = per_w.setdefault(w, {"cold": [], "ref": []})
            entry["cold"].append(cold)
            entry["ref"].append(ref)
    rows = []
    for w, t in times.items():
        ms = {k: 1e3 * statistics.median(v) for k, v in t.items()}
        rows.append({
            "latents_per_window": w,
            "frames_per_window": 4 * w,
            "warm_ms": round(ms["warm"], 2),
            "stateless_ms": round(ms["stateless"], 2),
            "speedup": round(ms["stateless"] / ms["warm"], 3),
            "warm_cpu_ms": round(ms["warm_cpu"], 2),
            "stateless_cpu_ms": round(ms["stateless_cpu"], 2),
            "cpu_speedup": round(ms["stateless_cpu"] / ms["warm_cpu"], 3),
            "stateless_psnr_db": _frames_psnr(torch.cat(per_w[w]["cold"], 2), torch.cat(per_w[w]["ref"], 2)),
        })
    return rows, max_diff


def _frames_psnr(pixels: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean per-frame PSNR of the uint8 frames users get from two `[1, 3, T, H, W]` pixel tensors."""
    return round(float(psnr(frames_from_pixels(pixels), frames_from_pixels(reference)).mean()), 2)


@dataclass(frozen=True)
class DecodeBenchSizes:
    """What `run_decode_bench` measures (see its arguments)."""

    height: int = 256
    width: int = 256
    window_latents: tuple[int, ...] = (1, 4, 8)
    timed_windows: int = 2
    context_latents: int = 8
    cache_sizes: tuple[tuple[int, int], ...] = ((256, 256), (384, 384))
    base_dim: int = 32
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for h, w in [(self.height, self.width), *self.cache_sizes]:
            if h % 16 or w % 16 or h < 16 or w < 16:
                raise ValueError(f"bench sizes must be positive multiples of 16, got {h}x{w}")
        if self.timed_windows < 1 or self.context_latents < 1 or min(self.window_latents, default=0) < 1:
            raise ValueError("timed_windows, context_latents and every window_latents entry must be >= 1")


def run_decode_bench(
    *,
    height: int = 256,
    width: int = 256,
    window_latents: Sequence[int] = (1, 4, 8),
    timed_windows: int = 2,
    context_latents: int = 8,
    cache_sizes: Sequence[tuple[int, int]] = ((256, 256), (384, 384)),
    base_dim: int = 32,
    z_dim: int = 16,
    dim_mult: Sequence[int] = (1, 2, 4, 4),
    num_res_blocks: int = 1,
    seed: int = 0,
    threads: int | None = None,
    verbose: bool = True,
    progress: bool = True,
) -> dict:
    """Time warm vs stateless windows, check them against the whole-stream decode, measure caches.

    Sizes are multiples of 16 (Wan 2.2 family). The defaults decode about 150 latent frames at
    256x256: roughly 1-1.5 minutes on 2 idle CPU cores, far longer on a loaded machine (compare the
    `*_cpu_ms` columns there). Shrink `height`/`width`/`base_dim`/`cache_sizes` for a smoke run.
    `threads` sets torch's intra-op threads for the run (None: unchanged); `verbose` prints the
    table to stdout, `progress` a progress bar to stderr.

    Returns:
        dict with `config`; `windows` (per window size: warm_ms, stateless_ms, speedup, the same as
        process CPU time warm_cpu_ms, stateless_cpu_ms, cpu_speedup, and stateless_psnr_db: the uint8
        frames' PSNR, 60 dB when identical); `warm_max_abs_diff` / `warm_within_bound` (all warm windows vs `vae.decode` of the
        whole stream, against `WHOLE_STREAM_DECODE_ATOL`); `stream_cache_bytes` (the timed warm stream's cache); `cache` (steady warm
        cache bytes per stream at each size); `cache_scaling` (byte ratio / pixel ratio of the last
        vs first size; 1.0 = linear in H*W); `elapsed_s`.
    """
    sizes = DecodeBenchSizes(
        height=height, width=width, window_latents=tuple(window_latents), timed_windows=timed_windows,
        context_latents=context_latents, cache_sizes=tuple(tuple(c) for c in cache_sizes), base_dim=base_dim,
        z_dim=z_dim, dim_mult=tuple(dim_mult), num_res_blocks=num_res_blocks, seed=seed,
    )
    with _torch_threads(threads):
        result = _measure(sizes, progress)
    if verbose:
        print(format_table(result))
    return result


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _measure(b: DecodeBenchSizes, progress: bool) -> dict:
    t_start = time.perf_counter()
    vae = build_bench_vae(b.base_dim, b.z_dim, b.dim_mult, b.num_res_blocks, b.seed)
    plan = _window_plan(b.window_latents, b.timed_windows, b.context_latents)
    g = torch.Generator().manual_seed(b.seed + 2)
    z = torch.randn(1, b.z_dim, sum(w for w, _ in plan), b.height // 16, b.width // 16, generator=g)
    with torch.inference_mode():
        norm = LatentNorm.from_vae(vae, torch.device("cpu"), torch.float32)
        whole = vae.decode(norm.denormalize(z)).sample  # [1,3,T,H,W]
    times, outs, stream_bytes = _lockstep(vae, z, plan, b.context_latents, progress)
    rows, max_diff = _rows(times, outs, whole)
    cache = [
        {"height": h, "width": w, "warm_cache_bytes": _steady_cache_bytes(vae, h, w, b.z_dim)} for h, w in b.cache_sizes
    ]
    first, last = cache[0], cache[-1]
    scaling = (last["warm_cache_bytes"] / first["warm_cache_bytes"]) / (
        (last["height"] * last["width"]) / (first["height"] * first["width"])
    )
    config = {**asdict(b), "family": "wan2.2", "stream_latents": z.shape[2], "dtype": "float32", "device": "cpu",
              "threads": torch.get_num_threads(), "torch": torch.__version__}
    return {
        "config": config,
        "windows": rows,
        "warm_max_abs_diff": max_diff,
        "warm_within_bound": max_diff <= WHOLE_STREAM_DECODE_ATOL,
        "stream_cache_bytes": stream_bytes,
        "cache": cache,
        "cache_scaling": round(scaling, 4),
        "elapsed_s": round(time.perf_counter() - t_start, 1),
    }


def format_table(result: dict) -> str:
    """The bench result as a plain-text table."""
    c = result["config"]
    lines = [
        f"Wan 2.2-family VAE (random), base_dim {c['base_dim']}, z_dim {c['z_dim']}, dim_mult {c['dim_mult']}, "
        f"{c['height']}x{c['width']}, context {c['context_latents']} latents, {c['threads']} threads",
        f"{'latents/window':>14} {'frames':>6} {'warm ms':>9} {'stateless ms':>12} {'speedup':>8} "
        f"{'warm cpu ms':>11} {'stateless cpu ms':>16} {'cpu speedup':>11} {'stateless PSNR':>15}",
    ]
    for r in result["windows"]:
        psnr_db = f"{r['stateless_psnr_db']:.1f} dB"
        lines.append(
            f"{r['latents_per_window']:>14} {r['frames_per_window']:>6} {r['warm_ms']:>9.1f} "
            f"{r['stateless_ms']:>12.1f} {r['speedup']:>7.2f}x {r['warm_cpu_ms']:>11.1f} "
            f"{r['stateless_cpu_ms']:>16.1f} {r['cpu_speedup']:>10.2f}x {psnr_db:>15}"
        )
    lines.append(
        f"warm vs whole-stream vae.decode: max |diff| {result['warm_max_abs_diff']:.2e} "
        f"({'within' if result['warm_within_bound'] else 'OUTSIDE'} the {WHOLE_STREAM_DECODE_ATOL:g} bound)"
    )
    for e in result["cache"]:
        lines.append(f"warm cache per stream at {e['height']}x{e['width']}: {e['warm_cache_bytes'] / 2**20:.2f} MiB")
    lines.append(f"cache bytes / pixels, last vs first size: {result['cache_scaling']:.3f} (1 = linear in H*W)")
    lines.append(f"elapsed {result['elapsed_s']} s")
    return "\n".join(lines)
