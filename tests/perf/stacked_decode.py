"""Per-session vs stacked decode (`DecoderOptions.batch_sessions`) of N warm sessions, side by side, and a profile.

    python tests/perf/stacked_decode.py --arch pusher [--arch tiny] [--profile]

Two `WarmWanDecoder`s over one bench model's VAE (its shipped decoder options, `batch_sessions` off and on) decode
the same random one-latent windows of N = 1, 2, 4, 8 sessions, interleaved; prints the median process CPU ms per
`decode_batch` call (1 torch thread) and their ratio. ``--profile``: the top torch operators of 4 stacked decodes
of 8 sessions (docs/performance.md, "Batching N sessions").
"""

from __future__ import annotations

import argparse
import time

import torch


def _windows(spec, n: int, generator: torch.Generator) -> list[torch.Tensor]:
    shape = (spec.latent_channels, 1, spec.latent_height, spec.latent_width)
    return [torch.randn(*shape, generator=generator) for _ in range(n)]


def compare(arch_name: str, rounds: int = 6, warmup: int = 2) -> None:
    from worldstep.bench.archs import bench_arch, load_model
    from worldstep.engine.vae import DecoderOptions
    from worldstep.engine.vae.decoder import WarmWanDecoder

    arch = bench_arch(arch_name)
    model = load_model(arch)
    decoders = {on: WarmWanDecoder(model.vae, DecoderOptions(**{**arch.decoder, "batch_sessions": on}))
                for on in (False, True)}
    for n in (1, 2, 4, 8):
        sessions = {on: [d.open_session() for _ in range(n)] for on, d in decoders.items()}
        generator, cpu = torch.Generator().manual_seed(0), {False: [], True: []}
        for _ in range(warmup + rounds):
            windows = _windows(model.spec, n, generator)
            for on, dec in decoders.items():
                start = time.process_time()
                dec.decode_batch(sessions[on], windows)
                cpu[on].append(time.process_time() - start)
        med = {on: 1e3 * sorted(v[warmup:])[rounds // 2] for on, v in cpu.items()}
        print(f"{arch_name} N={n}: per-session {med[False]:.1f} ms, stacked {med[True]:.1f} ms, "
              f"per-session / stacked {med[False] / med[True]:.2f}x", flush=True)


def profile(arch_name: str) -> None:
    from worldstep.bench.archs import bench_arch, load_model
    from worldstep.engine.vae import DecoderOptions
    from worldstep.engine.vae.decoder import WarmWanDecoder

    arch = bench_arch(arch_name)
    model = load_model(arch)
    dec = WarmWanDecoder(model.vae, DecoderOptions(**{**arch.decoder, "batch_sessions": True}))
    sessions, generator = [dec.open_session() for _ in range(8)], torch.Generator().manual_seed(0)
    for _ in range(3):
        dec.decode_batch(sessions, _windows(model.spec, 8, generator))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            dec.decode_batch(sessions, _windows(model.spec, 8, generator))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="tiny, small or pusher (repeatable; default pusher)")
    parser.add_argument("--profile", action="store_true", help="also profile 4 stacked decodes of 8 sessions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.arch or ["pusher"]:
        compare(name)
        if args.profile:
            profile(name)
