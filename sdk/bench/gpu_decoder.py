"""`bench gpu` section `decoder`: the warm VAE decoder alone, one window (4 latents, 16 frames) at a time.

Each path's decoder options (`gpu_variants.py`'s ``decoder.*`` knobs: today's float32, the new defaults) build
a `WarmWanDecoder` over the bench's VAE. One session per path decodes a first window, then warm windows of
random latents at the model's latent grid, interleaved round by round and timed between device synchronizes.
FLOPs per window are counted once, on the plain float32 decoder, with `torch.utils.flop_counter.FlopCounterMode`
(the convolutions and matmuls of a warm window: the same maths on every path), so TFLOP/s = FLOPs / median seconds.
"""

from __future__ import annotations

from typing import Any

import torch

from .gpu_variants import PATHS, build
from .measure import SyncedStopwatch, device_sync, interleave_timed, ratio, ratio_estimate
from .progress import Progress
from .results import Table
from .settings import GpuSettings

LATENTS_PER_WINDOW = 4  # a 16-action window of Edge: 4 latent frames


def measure_decoder(model, settings: GpuSettings, progress: Progress) -> dict[str, Any]:
    from worldstep.engine.vae.decoder import WarmWanDecoder

    def make(_backend: str, decoder, **_):
        return WarmWanDecoder(model.vae, decoder)

    device, spec = model.device, model.spec
    grid = (model.vae.config.z_dim, LATENTS_PER_WINDOW, spec.latent_height, spec.latent_width)
    generator = torch.Generator().manual_seed(600)
    windows = [torch.randn(grid, generator=generator).to(device)
               for _ in range(1 + settings.ab_warmup + settings.ab_rounds)]
    decoders, sessions, out = {}, {}, {"latents_per_window": LATENTS_PER_WINDOW, "paths": {}}
    try:
        for name, knobs in PATHS.items():
            decoder_knobs = {k: v for k, v in knobs.items() if k.startswith("decoder.")}
            decoders[name], variant = build(name, decoder_knobs, make, model.backend.value, device,
                                            tolerate=device.type != "cuda")
            sessions[name] = decoders[name].open_session()
            decoders[name].decode(sessions[name], windows[0])  # a session's first window is shorter: not timed
            out["paths"][name] = {"knobs": variant.knobs, "refused": variant.refused,
                                  "dtype": str(decoders[name].dtype).removeprefix("torch.")}
        progress(f"decoder: {settings.ab_warmup} warm-up + {settings.ab_rounds} windows per path, interleaved")
        samples = interleave_timed({name: _decoding(d, sessions[name], windows[1:]) for name, d in decoders.items()},
                                   settings.ab_rounds, settings.ab_warmup)
        flops = reference_window_flops(model.vae, windows[0])  # the same maths on every path
        for name in decoders:
            s = samples[name]
            out["paths"][name].update({"ms_per_window": s.median_ms, "samples_ms": [1e3 * x for x in s.seconds],
                                       "tflop_per_window": flops / 1e12,
                                       "achieved_tflops": ratio(flops, s.median_s) / 1e12})
    finally:
        for name, d in decoders.items():
            if name in sessions:
                d.close_session(sessions[name])
    out["speedup"] = ratio_estimate(samples["today"].seconds, samples["new"].seconds).to_dict()
    return out


def _decoding(decoder, session, windows: list[torch.Tensor]):
    sync, done = device_sync(decoder.device), [0]

    def run() -> tuple[float, float]:
        latents = windows[done[0]]
        watch = SyncedStopwatch(sync)
        decoder.decode(session, latents)
        done[0] += 1
        return watch.elapsed()

    return run


def reference_window_flops(vae, latents: torch.Tensor) -> float:
    """FLOPs of one warm window of ``latents`` through the plain float32 decoder (diffusers' modules, no private
    copy): every path does this maths, and a fast path's kernels (oneDNN convolutions, compiled norms) are not
    all seen by torch's `FlopCounterMode`, so the count is taken once, here."""
    from torch.utils.flop_counter import FlopCounterMode
    from worldstep.engine.vae import DecoderOptions
    from worldstep.engine.vae.decoder import WarmWanDecoder

    plain = DecoderOptions(dtype=None, channels_last=False, cudnn_benchmark=False, fused=False, onednn_conv=False)
    decoder = WarmWanDecoder(vae, plain)
    session = decoder.open_session()
    try:
        decoder.decode(session, latents)  # a first window: the warm one is counted
        with FlopCounterMode(display=False) as counter:
            decoder.decode(session, latents)
    finally:
        decoder.close_session(session)
    return float(counter.get_total_flops())


def decoder_table(f: dict[str, Any]) -> Table:
    d = f["decoder"]
    s = d["speedup"]
    table = Table(title=f"warm VAE decoder alone, {d['latents_per_window']} latents a window, "
                        f"{f['height']}x{f['width']}",
                  columns=["path", "dtype", "ms / window", "GFLOP / window", "TFLOP/s"],
                  note=f"Interleaved windows timed between device synchronizes; today / new = {s['value']:.2f} "
                       f"[{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]. FLOPs: torch's FlopCounterMode over one warm "
                       "window of the plain float32 decoder.")
    for name, p in d["paths"].items():
        table.add(name, p["dtype"], p["ms_per_window"], 1e3 * p["tflop_per_window"], p["achieved_tflops"])
    return table
