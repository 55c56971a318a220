"""Drive one sliding KV stream through the engine: protected prompt + windows, retention applied.

Each window attends to [prompt | retained windows | itself] through `paged_attention`, commits its
K/V, and releases what fell behind the context horizon. Pages in use climb for the first windows
and stay flat once the horizon is reached: a rollout's memory does not grow with its length.

    python examples/engine_demo.py --windows 100
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from worldstep.engine.attention import PagedAttentionBatch, paged_attention, prime
from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel
from worldstep.engine.windowing import WindowSchedule
from worldstep.flags import parse_flags


@dataclass
class Args:
    """Roll one sliding KV stream through the engine and print its pages in use per window."""

    seed: int = 0
    """seed of the random K/V and queries"""
    windows: int = 100
    """the number of windows to roll out"""
    window_units: int = 2
    """latent frames generated per window"""
    context_units: int = 6
    """latent frames of history kept behind the commit frontier"""
    tokens_per_unit: int = 16
    """cache tokens per latent frame"""
    prefix_tokens: int = 20
    """protected prompt tokens at the head of the stream"""
    page_size: int = 16
    """tokens per KV page"""
    num_pages: int = 64
    """pages in the pool"""
    num_layers: int = 2
    """transformer layers"""
    num_heads: int = 4
    """query heads"""
    num_kv_heads: int = 2
    """key/value heads (GQA)"""
    head_dim: int = 16
    """channels per head"""


def random_kv(args: Args, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (args.num_layers, n, args.num_kv_heads, args.head_dim)  # [L, n, Hkv, D]
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


if __name__ == "__main__":
    args = parse_flags(Args)

    # TRY NOT TO MODIFY: seeding
    gen = torch.Generator().manual_seed(args.seed)

    # engine: one page pool, one stream, one schedule
    cache = PagedKVCache(
        num_layers=args.num_layers, num_pages=args.num_pages, page_size=args.page_size,
        num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
    )
    key = StreamKey("demo", StreamLabel.MAIN)
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
        forward = prime(batch, args.num_heads)  # once per forward: checks, staleness, the gathers
        for layer in range(args.num_layers):
            q = torch.randn(n, args.num_heads, args.head_dim, generator=gen)  # [n, H, D]
            paged_attention(q, k_new[layer], v_new[layer], forward, layer)  # [n, H, D], feeds the next layer in a model
        cache.append(key, k_new, v_new)  # commit
        released = cache.apply_retention(key, policy)
        table = cache.page_table(key)
        print(
            f"window {plan.index:3d}  units [{plan.start:4d}, {plan.end:4d})  seq_len {table.seq_len:4d}  "
            f"released {released:3d} (total {table.released_tokens:5d})  pages_in_use {cache.pages_in_use('demo'):3d}"
        )

    cache.remove_session("demo")
    assert cache.num_used_pages == 0
