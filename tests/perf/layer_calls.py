"""Count the worldstep Python calls one generation layer makes in a rollout forward.

    python tests/perf/layer_calls.py [--json out.json]

Builds the diffusers transformer at a config's layer shapes (random weights; a small vocabulary, which no layer
sees), a paged KV cache holding two streams' committed context, and a `PagedAttentionBatch` over both rows, then
runs `gen_forward` the way a denoise step does (once to warm, once traced). ``sys.setprofile`` counts every
Python frame whose code lives in worldstep's packages (engine, envs, sdk); the layer's own modules (diffusers,
torch) are not counted, nor what they call back. The per-layer figure is the difference between a forward over
``deep`` and one over ``shallow`` layers of the same model, divided by the difference in layers: what the
forward does once cancels out.

Both trees take this script: `gen_forward(transformer, hidden, cos, sin, batch)` has the same signature before and
after the per-forward context (issue 36; its module was ``runner.py`` before), so the before/after figures come
from one script.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.resources import files
from pathlib import Path

import torch
import yaml

CONFIGS = {"tiny": "tiny.yaml", "edge": "cosmos3_edge.yaml"}
ROWS = ((24, 40), (16, 0))  # (fresh tokens, committed tokens) per row: one row with context, one without


def worldstep_folders() -> tuple[str, ...]:
    import worldstep
    import worldstep.engine
    import worldstep.envs

    return tuple(str(Path(m.__file__).parent) + "/" for m in (worldstep, worldstep.engine, worldstep.envs))


def count_calls(fn) -> int:
    """How many worldstep Python frames ``fn()`` enters (generator resumes included)."""
    folders, count = worldstep_folders(), 0

    def profile(frame, event, arg) -> None:
        nonlocal count
        if event == "call" and frame.f_code.co_filename.startswith(folders):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def transformer_at(config: str, layers: int):
    """The diffusers transformer at ``config``'s shapes with ``layers`` layers, random weights."""
    from diffusers import Cosmos3OmniTransformer

    arch = yaml.safe_load(files("worldstep.configs").joinpath(CONFIGS[config]).read_text())["model"]["architecture"]
    torch.manual_seed(0)
    return Cosmos3OmniTransformer(**{**arch["transformer"], "num_hidden_layers": layers, "vocab_size": 256}).eval()


def forward_inputs(transformer, layers: int) -> tuple:
    """``(hidden, cos, sin, batch)`` of a denoise step over ``ROWS``: a paged cache of ``layers`` layers holding
    each row's committed context, and one `PagedAttentionBatch` over both rows (random values, seeded)."""
    from worldstep.engine.attention import PagedAttentionBatch
    from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel

    cfg = transformer.config
    cache = PagedKVCache(num_layers=layers, num_pages=16, page_size=16, num_kv_heads=cfg.num_key_value_heads,
                         head_dim=cfg.head_dim, dtype=torch.float32)
    keys = [StreamKey(f"s{i}", StreamLabel.MAIN) for i in range(len(ROWS))]
    gen = torch.Generator().manual_seed(1)
    for key, (_, committed) in zip(keys, ROWS):
        cache.create_stream(key)
        if committed:
            kv = torch.randn(layers, committed, cfg.num_key_value_heads, cfg.head_dim, generator=gen)
            cache.append(key, kv, kv)
    q_lens = [n for n, _ in ROWS]
    batch = PagedAttentionBatch(cache, [cache.page_table(k) for k in keys], q_lens, "sdpa")
    n = sum(q_lens)
    hidden = torch.randn(n, cfg.hidden_size, generator=gen)
    angle = torch.rand(n, cfg.head_dim, generator=gen)
    return hidden, angle.cos(), angle.sin(), batch


def forward_calls(transformer, layers: int) -> int:
    """Worldstep calls of one steady-state `gen_forward` over the first ``layers`` layers of ``transformer``."""
    try:
        from worldstep.engine.models.cosmos3.layers import gen_forward
    except ImportError:  # the tree before issue 36 named the module runner.py
        from worldstep.engine.models.cosmos3.runner import gen_forward

    all_layers = transformer.layers
    transformer.layers = all_layers[:layers]
    try:
        hidden, cos, sin, batch = forward_inputs(transformer, layers)
        with torch.no_grad():
            gen_forward(transformer, hidden, cos, sin, batch)  # the first forward gathers
            return count_calls(lambda: gen_forward(transformer, hidden, cos, sin, batch))
    finally:
        transformer.layers = all_layers


def calls_per_layer(config: str, shallow: int = 1, deep: int = 3) -> dict:
    transformer = transformer_at(config, deep)
    a, b = forward_calls(transformer, shallow), forward_calls(transformer, deep)
    return {"config": config, "per_layer": (b - a) / (deep - shallow), "per_forward": a - shallow * (b - a) /
            (deep - shallow), f"forward_{shallow}_layers": a, f"forward_{deep}_layers": b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = [calls_per_layer(name) for name in CONFIGS]
    for f in figures:
        print(f"{f['config']}: {f['per_layer']:g} worldstep calls per layer, {f['per_forward']:g} per forward")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
