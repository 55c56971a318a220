"""Check the flashinfer paged-attention backend against sdpa on a GPU; prints the max abs difference.

    python tests/gpu/check_attention.py          # exit 0: agree; 1: disagree or cannot run

Covers bf16 and fp16, head_dim 64 and 128, GQA, ragged streams (one with nothing committed, one
page-aligned), every layer, and repeated steps on one batch (plan and gather reuse).
"""

from __future__ import annotations

import sys

import torch
from worldstep.engine.attention import AttentionBackendName, PagedAttentionBatch, paged_attention
from worldstep.engine.kv import PagedAllocationManager

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def compare(dtype: torch.dtype, head_dim: int, committed: list[int], q_lens: list[int], seed: int = 0) -> float:
    """Max |flashinfer - sdpa| over two layers and three steps of one batch."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layers, heads, kv_heads, page_size = 2, 16, 8, 16
    cache = PagedAllocationManager(num_layers=layers, num_pages=256, page_size=page_size, num_kv_heads=kv_heads,
                                   head_dim=head_dim, dtype=dtype, device="cuda")
    keys = [(f"s{i}", "main") for i in range(len(committed))]
    for key, n in zip(keys, committed):
        cache.create_stream(key)
        kv = torch.randn(2, layers, n, kv_heads, head_dim, generator=gen, device="cuda").to(dtype)
        cache.append(key, kv[0], kv[1])
    tables = [cache.page_table(k) for k in keys]
    fi = PagedAttentionBatch(cache, tables, q_lens, AttentionBackendName.FLASHINFER)
    ref = PagedAttentionBatch(cache, tables, q_lens, AttentionBackendName.SDPA)
    worst = 0.0
    for _step in range(3):
        n = sum(q_lens)
        q = torch.randn(n, heads, head_dim, generator=gen, device="cuda").to(dtype)
        k_new, v_new = torch.randn(2, n, kv_heads, head_dim, generator=gen, device="cuda").to(dtype)
        for layer in range(layers):
            a = paged_attention(q, k_new, v_new, fi, layer).float()
            b = paged_attention(q, k_new, v_new, ref, layer).float()
            if not torch.isfinite(a).all():
                return float("inf")
            worst = max(worst, (a - b).abs().max().item())
    return worst


def main() -> int:
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing checked")
        return 1
    cases = [
        ([37, 0, 16, 200], [5, 3, 1, 64]),  # ragged, one empty, one page-aligned
        ([50, 120], [8, 8]),  # every stream has context
        ([0, 0], [4, 9]),  # nothing committed anywhere
    ]
    failed = False
    for dtype, tol in TOLERANCE.items():
        for head_dim in (64, 128):
            for committed, q_lens in cases:
                diff = compare(dtype, head_dim, committed, q_lens)
                ok = diff <= tol
                failed |= not ok
                print(f"{'ok  ' if ok else 'FAIL'} dtype={str(dtype):15s} head_dim={head_dim:3d} "
                      f"committed={committed} q_lens={q_lens}: max abs diff {diff:.3e} (tol {tol:.0e})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
