"""Drive one sliding KV stream through the engine: protected prompt + windows, retention applied.

Each window attends to [prompt | retained windows | itself] through `paged_attention`, commits its
K/V, and releases what fell behind the context horizon. Pages in use climb for the first windows
and stay flat once the horizon is reached: a rollout's memory does not grow with its length.

    python examples/engine_demo.py --windows 100
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from dataclasses import dataclass, field

import torch
from worldstep.engine.attention import PagedAttentionBatch, paged_attention
from worldstep.engine.kv import PagedAllocationManager
from worldstep.engine.windowing import WindowSchedule


@dataclass
class Args:
    seed: int = field(default=0, metadata={"help": "seed of the random K/V and queries"})
    windows: int = field(default=100, metadata={"help": "the number of windows to roll out"})
    window_units: int = field(default=2, metadata={"help": "latent frames generated per window"})
    context_units: int = field(default=6, metadata={"help": "latent frames of history kept behind the frontier"})
    tokens_per_unit: int = field(default=16, metadata={"help": "cache tokens per latent frame"})
    prefix_tokens: int = field(default=20, metadata={"help": "protected prompt tokens at the head of the stream"})
    page_size: int = field(default=16, metadata={"help": "tokens per KV page"})
    num_pages: int = field(default=64, metadata={"help": "pages in the pool"})
    num_layers: int = field(default=2, metadata={"help": "transformer layers"})
    num_heads: int = field(default=4, metadata={"help": "query heads"})
    num_kv_heads: int = field(default=2, metadata={"help": "key/value heads (GQA)"})
    head_dim: int = field(default=16, metadata={"help": "channels per head"})


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default, help=f.metadata["help"])
    return Args(**vars(parser.parse_args()))


def random_kv(args: Args, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (args.num_layers, n, args.num_kv_heads, args.head_dim)  # [L, n, Hkv, D]
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


if __name__ == "__main__":
    args = parse_args()

    # seeding
    gen = torch.Generator().manual_seed(args.seed)

    # engine: one page pool, one stream, one schedule
    cache = PagedAllocationManager(
        num_layers=args.num_layers, num_pages=args.num_pages, page_size=args.page_size,
        num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
    )
    key = ("demo", "main")
    schedule = WindowSchedule(None, args.window_units, context_units=args.context_units)
    policy = schedule.retention(args.tokens_per_unit, args.prefix_tokens)

    # prompt: prefilled once, protected for the whole rollout
    cache.create_stream(key)
    cache.append(key, *random_kv(args, args.prefix_tokens, gen))
    cache.protect_prefix(key, args.prefix_tokens)

    # rollout
    for plan in itertools.islice(schedule.windows(), args.windows):
        n = (plan.commit_end - plan.commit_start) * args.tokens_per_unit
        batch = PagedAttentionBatch(cache, [cache.page_table(key)], [n], "sdpa")
        k_new, v_new = random_kv(args, n, gen)
        for layer in range(args.num_layers):
            q = torch.randn(n, args.num_heads, args.head_dim, generator=gen)  # [n, H, D]
            paged_attention(q, k_new[layer], v_new[layer], batch, layer)  # [n, H, D], feeds the next layer in a model
        cache.append(key, k_new, v_new)  # commit
        released = cache.apply_retention(key, policy)
        table = cache.page_table(key)
        print(
            f"window {plan.index:3d}  units [{plan.start:4d}, {plan.end:4d})  seq_len {table.seq_len:4d}  "
            f"released {released:3d} (total {table.released_tokens:5d})  pages_in_use {cache.pages_in_use('demo'):3d}"
        )

    cache.remove_session("demo")
    assert cache.num_used_pages == 0
