"""A layer forward does only its maths (issue 36): the checks, the staleness check and the gathers or the plan
happen once per forward, in `prime`, and a layer makes at most three worldstep calls (its rotary, the attention
dispatch and the backend's maths), at Tiny's and at Edge's layer shapes (tests/perf/layer_calls.py counts them
with ``sys.setprofile``). On the tree before the per-forward context (24fc7b5) the count was 19 at both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from worldstep.engine.kv import StaleStreamError

sys.path.insert(0, str(Path(__file__).parent / "perf"))
import layer_calls  # noqa: E402
from layer_calls import calls_per_layer  # noqa: E402

LAYER_CALLS_BOUND = 3


@pytest.mark.parametrize("config", ["tiny", "edge"])
def test_a_layer_makes_at_most_three_worldstep_calls(config):
    figures = calls_per_layer(config)
    assert figures["per_layer"] <= LAYER_CALLS_BOUND, figures
    assert figures["per_layer"] == int(figures["per_layer"])  # the same work on every layer


def test_the_count_catches_a_check_put_back_on_every_layer(monkeypatch):
    """The old per-layer staleness check, injected in front of each layer's attention: the count sees it."""
    from worldstep.engine.models.cosmos3 import layers

    real = layers.paged_attention

    def checking(q, k_new, v_new, forward, layer):
        for key, _ in forward.epochs:
            checking.cache.check_live(key)
        return real(q, k_new, v_new, forward, layer)

    real_prime = layers.prime

    def keep_cache(batch, *args):
        checking.cache = batch.cache
        return real_prime(batch, *args)

    monkeypatch.setattr(layers, "paged_attention", checking)
    monkeypatch.setattr(layers, "prime", keep_cache)
    assert calls_per_layer("tiny")["per_layer"] > LAYER_CALLS_BOUND


def test_a_table_changed_behind_the_batch_fails_at_the_next_forward():
    """A commit behind a primed batch (what no session allows while `model.step` holds it): the next forward's
    `prime` raises `StaleStreamError` before any layer runs, and a fresh table serves again."""
    from worldstep.engine.attention import PagedAttentionBatch
    from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel
    from worldstep.engine.models.cosmos3.layers import gen_forward

    transformer = layer_calls.transformer_at("tiny", 2)
    cfg = transformer.config
    cache = PagedKVCache(num_layers=2, num_pages=8, page_size=16, num_kv_heads=cfg.num_key_value_heads,
                         head_dim=cfg.head_dim, dtype=torch.float32)
    key = StreamKey("s", StreamLabel.MAIN)
    cache.create_stream(key)
    kv = torch.randn(2, 10, cfg.num_key_value_heads, cfg.head_dim)
    cache.append(key, kv, kv)
    batch = PagedAttentionBatch(cache, [cache.page_table(key)], [6], "sdpa")
    hidden, cos, sin = torch.randn(6, cfg.hidden_size), torch.ones(6, cfg.head_dim), torch.zeros(6, cfg.head_dim)
    with torch.no_grad():
        before = gen_forward(transformer, hidden, cos, sin, batch).hidden
        cache.append(key, kv[:, :3], kv[:, :3])
        with pytest.raises(StaleStreamError, match="changed"):
            gen_forward(transformer, hidden, cos, sin, batch)
        batch.tables[0] = cache.page_table(key)
        after = gen_forward(transformer, hidden, cos, sin, batch).hidden
    assert not torch.allclose(before, after)  # the three new tokens are attended to
    with pytest.raises(ValueError, match=r"tokens must be \[N=6"):
        gen_forward(transformer, hidden[:5], cos[:5], sin[:5], batch)
