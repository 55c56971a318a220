"""The Cosmos3 math of a window, on the diffusers modules' own weights.

Two pathways share each layer. The understanding pathway runs once per prompt (`prefill_text`):
its per-layer K (after `k_norm_und_for_gen` and RoPE) and V are what generation queries attend to,
and they never depend on generation tokens, so caching them is exact. The generation pathway
(`gen_forward`) runs for every denoise step and once more for the commit pass; its queries attend
through the paged attention backend to `[text | retained committed windows | this window]`.
No I/O and no cache allocation happen here: the KV view arrives as a `PagedAttentionBatch`.
Training runs the same layers (`gen_layers`, differentiable) with a dense attention over a batch of
clips whose tokens may only see the text and parts of their own clip (`masked_attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from ...attention import AttentionForward, PagedAttentionBatch, paged_attention, prime
from .fused import gen_weights
from .layout import text_positions


@dataclass
class GenOutput:
    """Final generation hidden states and, for a commit pass, the per-layer K/V of every token."""

    hidden: torch.Tensor  # [N, hidden]
    keys: torch.Tensor | None = None  # [layers, N, kv_heads, head_dim]
    values: torch.Tensor | None = None  # [layers, N, kv_heads, head_dim]


def rotary(transformer, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin `[N, head_dim]` for `[3, N]` mRoPE positions, via the model's own rotary module."""
    device = next(transformer.parameters()).device
    cos, sin = transformer.rotary_emb(positions.to(device).unsqueeze(1), device=device, dtype=dtype)  # [1, N, D]
    return cos.squeeze(0), sin.squeeze(0)


def apply_rotary(cos: torch.Tensor, sin: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each x `[..., N, heads, D]` rotated by cos/sin `[N, D]` (x cos + rotate_half(x) sin), in one call: a layer
    rotates its q and k together."""
    cos, sin, half = cos.unsqueeze(1), sin.unsqueeze(1), cos.shape[-1] // 2
    rotated = []
    for x in xs:  # a loop, not a generator: no frame per tensor
        rotated.append(x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)
    return tuple(rotated)


def text_kv(transformer, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the understanding pathway over a prompt; return the K/V generation queries see.

    Differentiable, so training uses the same code as the rollout.

    Args:
        input_ids: `[L]` token ids.
    Returns:
        keys, values: `[layers, L, kv_heads, head_dim]` (keys normed for generation and rotated).
    """
    hidden = transformer.embed_tokens(input_ids)  # [L, hidden]
    cos, sin = rotary(transformer, text_positions(input_ids.shape[0]), hidden.dtype)
    keys, values = [], []
    for layer in transformer.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        q = attn.norm_q(attn.to_q(x).view(-1, attn.num_attention_heads, attn.head_dim))  # [L, H, D]
        k = attn.norm_k(attn.to_k(x).view(-1, attn.num_key_value_heads, attn.head_dim))  # [L, Hkv, D]
        v = attn.to_v(x).view(-1, attn.num_key_value_heads, attn.head_dim)  # [L, Hkv, D]
        k_for_gen = attn.k_norm_und_for_gen(k) if attn.k_norm_und_for_gen is not None else k
        q, k, k_for_gen = apply_rotary(cos, sin, q, k, k_for_gen)
        keys.append(k_for_gen)
        values.append(v)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )  # [H, L, D]
        hidden = hidden + attn.to_out(out.transpose(0, 1).flatten(-2))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return torch.stack(keys), torch.stack(values)


@torch.no_grad()
def prefill_text(transformer, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`text_kv` for inference (no autograd graph): a session's prompt prefill."""
    return text_kv(transformer, input_ids)


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
"""`attend(q, k, v, layer=i) -> out`: q `[..., N, H, D]`, k/v `[..., N, Hkv, D]` (fresh tokens) -> `[..., N, H, D]`."""


def gen_layers(
    transformer,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attend: Attend,
    collect_kv: bool = False,
) -> GenOutput:
    """Every generation layer over `[..., N, hidden]` tokens; differentiable (training calls it directly).

    A layer runs on fused views of the diffusers weights (`fused.gen_weights`) and launches 13 torch ops outside
    attention (relu2; tests/test_layer_ops.py keeps it at most 24, and counted 44 on the unfused layer): the input
    norm, one QKV projection, the q and k norms together (one norm, one weight), rotary on q and k together
    (three ops), the output projection with the residual add folded in, the post norm, the MLP (relu and square
    apart) and its down projection with the residual folded in.

    Args:
        hidden: `[N, hidden]` packed window tokens, or `[B, N, hidden]` clips of one layout.
        cos, sin: `[N, head_dim]` rotary tables of those tokens.
        attend: what the queries see besides the fresh tokens (paged committed context, or a masked text+clip).
        collect_kv: keep each layer's K/V (the commit pass appends them to the cache).
    """
    config = transformer.config
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    cos, signed_sin = rotary_tables(cos, sin)
    keys, values = [], []
    for index, w in enumerate(gen_weights(transformer)):
        x = F.rms_norm(hidden, hidden.shape[-1:], w.input_norm.weight, w.input_norm.eps)
        qkv = F.linear(x, w.qkv, w.qkv_bias).unflatten(-1, (heads + 2 * kv_heads, dim))  # [.., N, H + 2Hkv, D]
        qk = F.rms_norm(qkv[..., : heads + kv_heads, :], (dim,), None, w.qk_eps)  # [.., N, H + Hkv, D]
        if w.qk_norm is not None:
            qk = qk * w.qk_norm
        # rotary: x cos + rotate_half(x) sin, rotate_half(x) being roll(x, D/2) with the sign in signed_sin
        qk = torch.addcmul(qk * cos, qk.roll(dim // 2, dims=-1), signed_sin)
        q, k, v = qk[..., :heads, :], qk[..., heads:, :], qkv[..., heads + kv_heads :, :]  # [.., N, H|Hkv, D]
        if collect_kv:
            keys.append(k)
            values.append(v)
        out = attend(q, k, v, layer=index)  # [.., N, H, D]
        # residual adds folded into the output projections: hidden + out @ W.T
        width = hidden.shape[-1]
        hidden = torch.addmm(hidden.reshape(-1, width), out.flatten(-2).reshape(-1, w.out.shape[1]),
                             w.out.t()).view(hidden.shape)  # [.., N, hidden]
        if w.out_bias is not None:
            hidden = hidden + w.out_bias
        x = F.linear(F.rms_norm(hidden, (width,), w.post_norm.weight, w.post_norm.eps), w.up)  # [.., N, (2) I]
        if w.swiglu:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        else:
            x = torch.relu(x).square()  # relu2
        hidden = torch.addmm(hidden.reshape(-1, width), x.reshape(-1, x.shape[-1]),
                             w.down.t()).view(hidden.shape)  # [.., N, hidden]
    hidden = transformer.norm_moe_gen(hidden)
    if not collect_kv:
        return GenOutput(hidden)
    return GenOutput(hidden, torch.stack(keys), torch.stack(values))


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[N, D]` as a layer takes them, `[N, 1, D]`: sin with its first half negated, so rotate_half
    becomes a roll (made once per forward, not per layer)."""
    half = sin.shape[-1] // 2
    return cos.unsqueeze(1), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1)


def gen_forward(
    transformer,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    batch: PagedAttentionBatch,
    collect_kv: bool = False,
    forward: AttentionForward | None = None,
) -> GenOutput:
    """Run every generation layer over packed window tokens of several streams (the rollout's path).

    The batch is primed once per forward at most (checks, staleness, gathers or plan), here unless ``forward``
    is the batch's prime already (a window primes once before its denoise loop and reuses it for every step and
    its commit: nothing commits to its tables in between); each layer's attention then only dispatches and
    computes.

    Args:
        hidden: `[N, hidden]` tokens of all rows, packed in `batch` order.
        cos, sin: `[N, head_dim]` rotary tables of those tokens.
        batch: each row's committed context and its number of fresh tokens.
        collect_kv: keep each layer's K/V (the commit pass appends them to the cache).
        forward: `attention.prime` of ``batch`` for this window (None: primed here).
    """
    if forward is None:
        forward = prime(batch, transformer.config.num_attention_heads, hidden)
    return gen_layers(transformer, hidden, cos, sin, partial(paged_attention, forward=forward), collect_kv)


def masked_attention(text_k: torch.Tensor, text_v: torch.Tensor, mask: torch.Tensor) -> Attend:
    """Dense attention for a batch of clips: each query sees the whole text and the clip tokens `mask` allows.

    What a paged rollout computes window by window, for every window of a clip at once (training).

    Args:
        text_k, text_v: `[layers, L, Hkv, D]` from `text_kv`.
        mask: `[N, N]` bool, may clip token i attend to clip token j.
    """
    full = torch.cat([torch.ones(mask.shape[0], text_k.shape[1], dtype=torch.bool, device=mask.device), mask], 1)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        lead = q.shape[:-3]
        tk = text_k[layer].expand(*lead, *text_k.shape[1:])  # [.., L, Hkv, D]
        tv = text_v[layer].expand(*lead, *text_v.shape[1:])
        keys, vals = torch.cat([tk, k], dim=-3), torch.cat([tv, v], dim=-3)  # [.., L+N, Hkv, D]
        out = F.scaled_dot_product_attention(q.transpose(-3, -2), keys.transpose(-3, -2), vals.transpose(-3, -2),
                                             attn_mask=full, enable_gqa=True)  # [.., H, N, D]
        return out.transpose(-3, -2)

    return attend
