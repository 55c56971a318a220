"""A generation layer's weights in the shapes that launch few kernels, derived from the diffusers modules.

A denoise step on a GPU is launch-bound (issue 47: 86 torch calls a layer, about 2,500 kernels a forward), so the
generation layer runs on fused views of the diffusers weights: one QKV projection (the three projections' weights
stacked), one gate+up projection for a SwiGLU MLP, the q and k norms' weights side by side, and the output
projections applied with the residual add folded in (``addmm``). The diffusers modules stay the only owners of the
weights: a fused tensor is a function of theirs. At inference it is cached and rebuilt when any source tensor
changes (moved, cast, loaded or updated in place: its storage or its version counter moves); with autograd on it is
stacked afresh at every call, so the gradient reaches the diffusers parameters (training runs the same layer).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RMSNormWeights:
    """``F.rms_norm``'s arguments for one of the layer's norms (Nemotron's or diffusers' RMSNorm; weight may be
    None)."""

    weight: torch.Tensor | None  # [dim]
    eps: float


@dataclass(frozen=True)
class GenLayerWeights:
    """What one generation layer computes with, in fused shapes.

    Attributes:
        qkv: ``[(H + 2 Hkv) * D, hidden]`` the q, k and v projections stacked (bias ``qkv_bias`` or None).
        qk_norm: ``[H + Hkv, D]`` per head the weight of its RMS norm (q heads then k heads); None: no weights.
        qk_eps: the q/k norms' epsilon.
        out: ``[hidden, H * D]`` the attention output projection (bias ``out_bias`` or None).
        up: ``[I, hidden]`` (relu2) or ``[2 I, hidden]`` (SwiGLU: gate then up).
        down: ``[hidden, I]``.
    """

    input_norm: RMSNormWeights
    post_norm: RMSNormWeights
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    qk_norm: torch.Tensor | None
    qk_eps: float
    out: torch.Tensor
    out_bias: torch.Tensor | None
    up: torch.Tensor
    down: torch.Tensor
    swiglu: bool


_CACHE: weakref.WeakKeyDictionary[nn.Module, tuple[list, list[GenLayerWeights]]] = weakref.WeakKeyDictionary()


def gen_weights(transformer: nn.Module) -> list[GenLayerWeights]:
    """Every generation layer's weights in fused shapes, in step with the diffusers modules (see the module doc).

    Called once per forward; while the modules' tensors are unchanged it returns the same list object (a captured
    CUDA graph compares it to know its weights are current)."""
    sources = list(transformer.layers.parameters())
    if torch.is_grad_enabled() and any(t.requires_grad for t in sources):
        return [_fuse(layer) for layer in transformer.layers]  # stacked afresh: the gradient reaches the modules
    stamp = [(t.data_ptr(), t._version) for t in sources]  # a move or a cast changes the storage
    cached = _CACHE.get(transformer)
    if cached is None or cached[0] != stamp:
        cached = _CACHE[transformer] = (stamp, [_fuse(layer) for layer in transformer.layers])
    return cached[1]


def _norm(module: nn.Module) -> RMSNormWeights:
    return RMSNormWeights(getattr(module, "weight", None), float(module.eps))


def _fuse(layer: nn.Module) -> GenLayerWeights:
    attn, mlp = layer.self_attn, layer.mlp_moe_gen
    projections = (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
    biases = [p.bias for p in projections]
    q_norm, k_norm = attn.norm_added_q, attn.norm_added_k
    if q_norm.eps != k_norm.eps:
        raise ValueError(f"norm_added_q.eps={q_norm.eps} and norm_added_k.eps={k_norm.eps} differ; the fused layer "
                         "normalises q and k in one call and needs one epsilon")
    if q_norm.weight is None:
        qk_norm = None
    else:
        qk_norm = torch.cat([q_norm.weight.expand(attn.num_attention_heads, -1),
                             k_norm.weight.expand(attn.num_key_value_heads, -1)])  # [H + Hkv, D]
    swiglu = mlp.hidden_act != "relu2"
    up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]) if swiglu else mlp.up_proj.weight  # [(2) I, hidden]
    return GenLayerWeights(
        input_norm=_norm(layer.input_layernorm_moe_gen),
        post_norm=_norm(layer.post_attention_layernorm_moe_gen),
        qkv=torch.cat([p.weight for p in projections]),  # [(H + 2 Hkv) * D, hidden]
        qkv_bias=None if biases[0] is None else torch.cat(biases),
        qk_norm=qk_norm,
        qk_eps=float(q_norm.eps),
        out=attn.to_add_out.weight,
        out_bias=attn.to_add_out.bias,
        up=up,
        down=mlp.down_proj.weight,
        swiglu=swiglu,
    )
