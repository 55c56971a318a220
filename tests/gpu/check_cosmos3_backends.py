"""GPU check: Cosmos3-Edge windows on the flashinfer backend match the sdpa backend, one window and a rollout.

    python tests/gpu/check_cosmos3_backends.py [--out DIR]        # exit 0: agree; 1: differ, NaN/inf, no CUDA
    python tests/gpu/check_cosmos3_backends.py --device cpu --tiny  # dry run: sdpa against sdpa (code path only)

Edge's architecture with random bf16 weights, built once in memory (the VAE in float32, as users get it),
at 832x480 with 16-action windows. Two models share those modules, one per backend, each with its own KV
pool (page size 128), and run the same seeds and actions:

- one window: one session, no CFG, 4 steps: max |flashinfer - sdpa| / max |sdpa| of the latents <= 2e-2;
- a rollout: two sessions batched (domains 8 and 3) with CFG (4 rows per forward), 2 latent frames of
  context (pages released from window 1 on), a fork of the first session after window 1 (shared pages),
  5 windows: every window's latents within 5e-2.

The bounds are for bf16 through 28 layers and 4 steps: the backends differ only in attention rounding
(the attention check bounds that at 1.6e-2 per call), which the denoise loop and the committed K/V carry
forward. A NaN or inf anywhere fails. Every page comes back when the sessions close.
"""

from __future__ import annotations

import sys

import torch
from figures import parse_args, rel_diff, resolve_device, within, write
from worldstep.bench.archs import action_chunks, bench_arch
from worldstep.bench.gpu_model import edge_model, open_sessions
from worldstep.bench.inmemory import build_components
from worldstep.engine.attention import flashinfer_problems

WINDOW_BOUND = 2e-2
ROLLOUT_BOUND = 5e-2


def one_window(model, arch) -> list[torch.Tensor]:
    from worldstep.engine.config import RolloutKnobs

    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=4, decode=False)
    session = open_sessions(model, arch, knobs, 1)[0]
    try:
        return [model.step([session], [action_chunks(1, arch)[0]])[0].latents]
    finally:
        model.close(session)


def rollout(model, arch, windows: int = 5) -> list[torch.Tensor]:
    """Latents of every (window, session) in order: two batched CFG sessions, a fork joining after window 1."""
    from worldstep.engine.config import RolloutKnobs

    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=4, guidance_scale=3.0, context_frames=2, decode=False)
    sessions = open_sessions(model, arch, knobs, 2, seed=7, domains=[arch.domain_id, 3])  # two embodiments
    chunks = action_chunks(windows * 3, arch, seed=5)
    out = []
    try:
        for w in range(windows):
            if w == 2:
                sessions.append(model.fork(sessions[0], generator=torch.Generator().manual_seed(99)))
            results = model.step(sessions, chunks[w * 3: w * 3 + len(sessions)])
            out += [r.latents for r in results]
    finally:
        for s in sessions:
            model.close(s)
    return out


def compare(ref: list[torch.Tensor], other: list[torch.Tensor], bound: float) -> list[dict]:
    return [{"index": i, "rel_diff": rel_diff(b, a), "ok": within(rel_diff(b, a), bound),
             "finite": bool(torch.isfinite(a).all() and torch.isfinite(b).all())}
            for i, (a, b) in enumerate(zip(ref, other))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    device = resolve_device(args)
    if device is None:
        write(args.out, "cosmos3_backends", {"ok": False, "reason": "CUDA is not available"})
        return 1
    arch = bench_arch("tiny" if args.tiny else "edge")
    components = build_components(arch, device, torch.bfloat16, vae_dtype=torch.float32)
    problems = flashinfer_problems(device, torch.bfloat16, components.transformer.config.head_dim)
    candidate = "sdpa" if problems else "flashinfer"  # flashinfer only where its kernels load
    models = {name: edge_model(components, arch, device, backend, num_pages=256)
              for name, backend in (("reference", "sdpa"), ("candidate", candidate))}
    doc = {"dry_run": device.type != "cuda", "arch": arch.name, "reference": "sdpa", "candidate": candidate,
           "flashinfer": f"not run: {'; '.join(problems)}" if problems else "ran",
           "height": models["reference"].spec.height, "width": models["reference"].spec.width,
           "bounds": {"window": WINDOW_BOUND, "rollout": ROLLOUT_BOUND}}
    doc["window"] = compare(one_window(models["reference"], arch), one_window(models["candidate"], arch), WINDOW_BOUND)
    write(args.out, "cosmos3_backends", {**doc, "ok": False, "partial": True})
    doc["rollout"] = compare(rollout(models["reference"], arch), rollout(models["candidate"], arch), ROLLOUT_BOUND)
    doc["pages_after_close"] = {k: m.kv.num_used_pages for k, m in models.items()}
    ok = (all(r["ok"] for r in doc["window"] + doc["rollout"]) and len(doc["rollout"]) == 2 + 2 + 3 * 3
          and not any(doc["pages_after_close"].values()))
    doc["worst"] = {part: max(r["rel_diff"] for r in doc[part]) for part in ("window", "rollout")}
    write(args.out, "cosmos3_backends", {**doc, "ok": ok})
    for part in ("window", "rollout"):
        print(f"{part}: " + " ".join(f"{r['rel_diff']:.2e}" for r in doc[part]))
    print(f"cosmos3 backends ({candidate} vs sdpa): {'ok' if ok else 'FAILED'}; worst {doc['worst']}, "
          f"bounds {doc['bounds']}; pages after close {doc['pages_after_close']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
