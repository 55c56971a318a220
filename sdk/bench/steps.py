"""Per env step, side by side: worldstep kv mode, worldstep chained mode, and the official recipe.

All three run on the same checkpoint, frame size, prompt, actions, denoise steps and guidance; the
official recipe must run at a pipeline canvas size (256x256) so it does no padding work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .archs import DOMAIN_NAME, PROMPT, action_chunks, bench_arch, checkpoint_for, first_frame, load_model
from .measure import interleave, median, ratio
from .official import OfficialRecipe
from .progress import Progress
from .results import Table
from .settings import RolloutSettings


def _worldstep_step(session, chunks: list, phases: list[dict[str, float]]) -> Callable[[], None]:
    def step() -> None:
        result = session.step(chunks[session.window_index])
        t = result.timings
        phases.append({"generate_s": t.denoise_s + t.commit_s, "denoise_s": t.denoise_s, "commit_s": t.commit_s,
                       "decode_s": t.decode_s, "encode_s": 0.0, "pages": result.kv.pages_in_use})

    return step


def _official_step(recipe: OfficialRecipe, chunks: list, phases: list[dict[str, float]]) -> Callable[[], None]:
    calls = [0]

    def step() -> None:
        clock = recipe.clock
        enc, dec = clock.encode_s, clock.decode_s
        start = time.perf_counter()
        recipe.step(chunks[calls[0]])
        total = time.perf_counter() - start
        calls[0] += 1
        encode, decode = clock.encode_s - enc, clock.decode_s - dec
        phases.append({"generate_s": total - encode - decode, "denoise_s": float("nan"), "commit_s": 0.0,
                       "decode_s": decode, "encode_s": encode, "pages": 0})

    return step


def _phase_medians(phases: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Median of each phase over the measured steps; seconds become `*_ms`."""
    kept = phases[warmup:]
    out = {}
    for key in kept[0]:
        values = [p[key] for p in kept]
        if key.endswith("_s"):
            out[key.removesuffix("_s") + "_ms"] = 1e3 * median(values)
        else:
            out[key] = median(values)
    return out


def compare_steps(arch_name: str, settings: RolloutSettings, progress: Progress) -> tuple[dict[str, Any], Table]:
    """(figures, table) of the per-step comparison on one architecture."""
    arch = bench_arch(arch_name)
    if arch.checkpoint is not None:  # trained weights with their own embodiments, no diffusers domain name
        raise ValueError(f"arch={arch_name!r} is invalid for the official-recipe comparison; allowed: 'tiny' or "
                         f"'small' (the recipe drives diffusers' {DOMAIN_NAME!r} domain)")
    size = settings.compare_size
    progress(f"{arch_name}: loading model and pipeline ({size}x{size})")
    model = load_model(arch, height=size, width=size, cache_dir=settings.cache_dir)
    exact = load_model(arch, height=size, width=size, cache_dir=settings.cache_dir, exact_decode=True)
    image = first_frame(size, size)
    from worldstep.engine.models.cosmos3 import RolloutKnobs

    chunks = action_chunks(settings.warmup + settings.rounds, arch)
    phases: dict[str, list[dict[str, float]]] = {"kv": [], "kv_exact": [], "chained": [], "official": []}
    sessions = {}
    for name, mode, owner in (("kv", "kv", model), ("kv_exact", "kv", exact), ("chained", "chained", model)):
        knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=settings.num_steps,
                             context_frames=settings.context_frames, window_mode=mode)
        sessions[name] = owner.open_session(image, PROMPT, arch.domain_id, knobs=knobs,
                                            generator=torch.Generator().manual_seed(0))
    recipe = OfficialRecipe(checkpoint_for(arch, settings.cache_dir), image=image, prompt=PROMPT,
                            chunk_size=arch.chunk_size, num_steps=settings.num_steps)
    progress(f"{arch_name}: {settings.warmup} warm-up + {settings.rounds} measured steps of each alternative")
    samples = interleave({
        "kv": _worldstep_step(sessions["kv"], chunks, phases["kv"]),
        "kv_exact": _worldstep_step(sessions["kv_exact"], chunks, phases["kv_exact"]),
        "chained": _worldstep_step(sessions["chained"], chunks, phases["chained"]),
        "official": _official_step(recipe, chunks, phases["official"]),
    }, rounds=settings.rounds, warmup=settings.warmup)
    for session in sessions.values():
        session.close()

    kv_ms = samples["kv"].median_ms
    figures: dict[str, Any] = {
        "arch": arch_name, "height": size, "width": size, "chunk_size": arch.chunk_size,
        "num_steps": settings.num_steps, "context_frames": settings.context_frames,
        "text_tokens": int(next(iter(sessions["kv"].text_lens.values()))),
        "tokens_per_frame": model.spec.tokens_per_frame,
        "ms_per_step": {name: s.median_ms for name, s in samples.items()},
        "samples_ms": {name: [1e3 * x for x in s.seconds] for name, s in samples.items()},
        "phases": {name: _phase_medians(p, settings.warmup) for name, p in phases.items()},
        "ratio_official_over_kv": ratio(samples["official"].median_ms, kv_ms),
        "ratio_chained_over_kv": ratio(samples["chained"].median_ms, kv_ms),
        "ratio_official_over_kv_exact": ratio(samples["official"].median_ms, samples["kv_exact"].median_ms),
    }
    gen = {name: figures["phases"][name]["generate_ms"] for name in phases}
    figures["ratio_generate_official_over_kv"] = ratio(gen["official"], gen["kv"])
    return figures, _table(figures)


_LABELS = {
    "kv": "(a) worldstep kv",
    "kv_exact": "(a') worldstep kv, bit-exact decode",
    "chained": "(b) worldstep chained",
    "official": "(c) official recipe (diffusers pipeline per chunk)",
}


def _table(f: dict[str, Any]) -> Table:
    table = Table(
        title=(f"Env step, {f['arch']} model, {f['height']}x{f['width']}, {f['chunk_size']} actions/window, "
               f"{f['num_steps']} denoise steps, no CFG"),
        columns=["alternative", "ms / step", "generate ms", "decode ms", "encode ms", "x (a)"],
        note=("Medians of interleaved steps. generate = denoise + commit (worldstep) or the pipeline call minus "
              "its VAE encode and decode (official). (a) and (b) decode as the shipped configs do (3-D convs "
              "through oneDNN on CPU, equal within float32 rounding); (a') on the reference kernels, bit-exact "
              "with vae.decode, as (c) does. "
              f"(c)/(a) = {f['ratio_official_over_kv']:.2f}, (c)/(a') = {f['ratio_official_over_kv_exact']:.2f}, "
              f"(b)/(a) = {f['ratio_chained_over_kv']:.2f}; "
              f"generation only (c)/(a) = {f['ratio_generate_official_over_kv']:.2f}."),
    )
    kv = f["ms_per_step"]["kv"]
    for name, label in _LABELS.items():
        p = f["phases"][name]
        table.add(label, f["ms_per_step"][name], p["generate_ms"], p["decode_ms"],
                  p["encode_ms"] if name == "official" else None, ratio(f["ms_per_step"][name], kv))
    return table

