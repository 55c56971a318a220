"""A generation layer launches at most 24 torch ops outside attention (issue 47: a launch-bound GPU forward pays
about one kernel launch per op). Counted on the CPU between attention calls by tests/perf/layer_ops.py; the
unfused layer (the diffusers modules called one by one, as the tree before the fused layer did) counts 44 and
fails the bound. The fused weights are functions of the diffusers modules' own and stay in step with them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "perf"))
from layer_calls import transformer_at  # noqa: E402
from layer_ops import layer_ops  # noqa: E402

LAYER_OPS_BOUND = 24


def unfused_gen_layers(transformer, hidden, cos, sin, attend, collect_kv=False):
    """The generation layers through the diffusers modules one by one (the layer before issue 47)."""
    from worldstep.engine.models.cosmos3.layers import GenOutput, apply_rotary

    keys, values = [], []
    for index, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        x = layer.input_layernorm_moe_gen(hidden)
        q = attn.norm_added_q(attn.add_q_proj(x).unflatten(-1, (attn.num_attention_heads, attn.head_dim)))
        k = attn.norm_added_k(attn.add_k_proj(x).unflatten(-1, (attn.num_key_value_heads, attn.head_dim)))
        v = attn.add_v_proj(x).unflatten(-1, (attn.num_key_value_heads, attn.head_dim))
        q, k = apply_rotary(cos, sin, q, k)
        keys.append(k)
        values.append(v)
        out = attend(q, k, v, layer=index)
        hidden = hidden + attn.to_add_out(out.flatten(-2))
        hidden = hidden + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(hidden))
    hidden = transformer.norm_moe_gen(hidden)
    return GenOutput(hidden, torch.stack(keys), torch.stack(values)) if collect_kv else GenOutput(hidden)


@pytest.mark.parametrize("config", ["tiny", "edge"])
def test_a_layer_launches_at_most_24_torch_ops(config):
    figures = layer_ops(config)
    assert figures["launching"] <= LAYER_OPS_BOUND, figures["names"]
    assert {"linear", "rms_norm", "addmm"} <= {name for name in figures["names"]}  # the fused path ran


def test_the_count_fails_the_unfused_layer(monkeypatch):
    from worldstep.engine.models.cosmos3 import layers

    monkeypatch.setattr(layers, "gen_layers", unfused_gen_layers)
    assert layer_ops("tiny")["launching"] > LAYER_OPS_BOUND


def _attend(transformer, n: int):
    """Dense attention over the fresh tokens alone (no text, no committed context): enough to compare two paths."""
    from worldstep.engine.models.cosmos3.layers import masked_attention

    cfg = transformer.config
    none = torch.zeros(cfg.num_hidden_layers, 0, cfg.num_key_value_heads, cfg.head_dim)
    return masked_attention(none, none, torch.ones(n, n, dtype=torch.bool))


def _inputs(transformer, n: int = 20, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    cfg = transformer.config
    angle = torch.rand(n, cfg.head_dim, generator=gen)
    return torch.randn(n, cfg.hidden_size, generator=gen), angle.cos(), angle.sin()


def test_the_fused_layer_equals_the_diffusers_modules_and_follows_their_weights():
    from worldstep.engine.models.cosmos3.layers import gen_layers

    transformer = transformer_at("tiny", 2)
    hidden, cos, sin = _inputs(transformer)
    attend = _attend(transformer, hidden.shape[0])
    with torch.no_grad():
        fused = gen_layers(transformer, hidden, cos, sin, attend, collect_kv=True)
        reference = unfused_gen_layers(transformer, hidden, cos, sin, attend, collect_kv=True)
        for a, b in ((fused.hidden, reference.hidden), (fused.keys, reference.keys), (fused.values, reference.values)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        # a weight changed in place (a loaded checkpoint, an optimizer step): the next forward sees it
        transformer.layers[1].self_attn.add_k_proj.weight.mul_(-0.5)
        transformer.layers[0].mlp_moe_gen.down_proj.weight.add_(0.01)
        changed = gen_layers(transformer, hidden, cos, sin, attend)
        reference = unfused_gen_layers(transformer, hidden, cos, sin, attend)
    assert not torch.allclose(changed.hidden, fused.hidden, atol=1e-3)
    torch.testing.assert_close(changed.hidden, reference.hidden, atol=1e-5, rtol=1e-5)


def test_the_gradient_reaches_the_diffusers_parameters():
    """Training runs the same layer: with autograd on, the fused weights are stacked from the parameters."""
    from worldstep.engine.models.cosmos3.layers import gen_layers

    transformer = transformer_at("tiny", 2).train()
    hidden, cos, sin = _inputs(transformer)
    attend = _attend(transformer, hidden.shape[0])
    gen_layers(transformer, hidden, cos, sin, attend).hidden.square().sum().backward()
    fused = {n: p.grad.clone() for n, p in transformer.layers.named_parameters() if p.grad is not None}
    transformer.zero_grad()
    unfused_gen_layers(transformer, hidden, cos, sin, attend).hidden.square().sum().backward()
    for name in ("0.self_attn.add_q_proj.weight", "1.self_attn.add_v_proj.weight", "0.self_attn.norm_added_k.weight",
                 "1.mlp_moe_gen.up_proj.weight", "0.post_attention_layernorm_moe_gen.weight"):
        torch.testing.assert_close(fused[name], transformer.layers.get_parameter(name).grad, atol=1e-4, rtol=1e-4)
