"""Paged attention: sdpa against an explicit dense reference; gather reuse; staleness caught at the next forward's
`prime`; backend resolution."""

import math
import subprocess
import sys

import pytest
import torch
from worldstep.engine.attention import (
    AttentionBackendName,
    PagedAttentionBatch,
    paged_attention,
    prime,
    resolve_backend,
)
from worldstep.engine.kv import PagedKVCache, StaleStreamError, StreamKey, StreamLabel

L, H, HKV, D, PS = 2, 4, 2, 8, 4


def make_cache(dtype=torch.float64) -> PagedKVCache:
    return PagedKVCache(num_layers=L, num_pages=64, page_size=PS, num_kv_heads=HKV, head_dim=D, dtype=dtype)


def add_stream(cache, key, committed: int, gen: torch.Generator) -> None:
    cache.create_stream(key)
    k = torch.randn(L, committed, HKV, D, generator=gen, dtype=cache.kv.dtype)
    v = torch.randn(L, committed, HKV, D, generator=gen, dtype=cache.kv.dtype)
    cache.append(key, k, v)


def dense_reference(q, k, v):
    """softmax(q k^T / sqrt(D)) v with GQA by repeat_interleave; q [n, H, D], k/v [S, Hkv, D]."""
    k = k.repeat_interleave(H // HKV, dim=1)  # [S, H, D]
    v = v.repeat_interleave(H // HKV, dim=1)
    scores = torch.einsum("nhd,shd->hns", q, k) / math.sqrt(q.shape[-1])  # [H, n, S]
    return torch.einsum("hns,shd->nhd", scores.softmax(-1), v)  # [n, H, D]


def random_inputs(q_lens, gen, dtype=torch.float64):
    n = sum(q_lens)
    return (
        torch.randn(n, H, D, generator=gen, dtype=dtype),
        torch.randn(n, HKV, D, generator=gen, dtype=dtype),
        torch.randn(n, HKV, D, generator=gen, dtype=dtype),
    )


def forward_attention(q, k_new, v_new, batch, layer):
    """One layer of a forward that starts here: the batch primed (what `gen_forward` does once per forward), then
    the layer's call."""
    return paged_attention(q, k_new, v_new, prime(batch, q.shape[1]), layer)


def reference_for(cache, keys, q_lens, q, k_new, v_new, layer):
    out, start = [], 0
    for key, n in zip(keys, q_lens):
        k_ctx, v_ctx = cache.gather(key, layer)
        sl = slice(start, start + n)
        out.append(dense_reference(q[sl], torch.cat([k_ctx, k_new[sl]]), torch.cat([v_ctx, v_new[sl]])))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sdpa_matches_dense_reference_on_ragged_streams(dtype):
    gen = torch.Generator().manual_seed(0)
    cache = make_cache(dtype)
    committed = [13, 0, 4, 9]  # ragged, one stream with nothing committed, one page-aligned
    keys = [StreamKey(f"s{i}", StreamLabel.MAIN) for i in range(len(committed))]
    for key, n in zip(keys, committed):
        add_stream(cache, key, n, gen)
    q_lens = [3, 5, 1, 4]
    batch = PagedAttentionBatch(cache, [cache.page_table(k) for k in keys], q_lens, "sdpa")
    assert batch.backend is AttentionBackendName.SDPA
    q, k_new, v_new = random_inputs(q_lens, gen, dtype)
    for layer in range(L):
        out = forward_attention(q, k_new, v_new, batch, layer)
        expected = reference_for(cache, keys, q_lens, q, k_new, v_new, layer)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("committed", [[13, 0, 4], [0, 0]])
def test_flashinfer_path_with_rows_without_context_matches_the_reference(monkeypatch, committed):
    """flashinfer (CPU emulation, tests/flashinfer_emulation.py) on a batch made outside a model: rows with and
    without committed tokens (the paged kernel runs on the rows with context only, merged into the fresh part),
    and a batch with no context at all (the fresh part alone); `prime` and the first call make the kernels."""
    import flashinfer_emulation
    flashinfer_emulation.install(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    cache = make_cache(torch.float32)
    keys = [StreamKey(f"s{i}", StreamLabel.MAIN) for i in range(len(committed))]
    for key, n in zip(keys, committed):
        add_stream(cache, key, n, gen)
    q_lens = [3, 5, 2][: len(committed)]
    q, k_new, v_new = random_inputs(q_lens, gen, torch.float32)
    primed = PagedAttentionBatch(cache, [cache.page_table(k) for k in keys], q_lens, AttentionBackendName.FLASHINFER)
    forward = prime(primed, H)
    assert primed.kernels is not None and primed.kernels.plans == 1
    # another batch of the model over the same layout: the kernels' plan is kept, and identity is what a layer checks
    twin = PagedAttentionBatch(cache, [cache.page_table(k) for k in keys], q_lens, AttentionBackendName.FLASHINFER,
                               primed.kernels)
    assert prime(twin, H).layout is forward.layout and primed.kernels.plans == 1
    for batch in (primed, PagedAttentionBatch(cache, [cache.page_table(k) for k in keys], q_lens,
                                              AttentionBackendName.FLASHINFER)):
        for layer in range(L):
            expected = reference_for(cache, keys, q_lens, q, k_new, v_new, layer)
            torch.testing.assert_close(forward_attention(q, k_new, v_new, batch, layer), expected, atol=1e-5, rtol=0)
        assert batch.kernels is not None and batch.kernels.has_context == any(committed)


def test_stream_with_nothing_committed_attends_to_fresh_only():
    gen = torch.Generator().manual_seed(1)
    cache = make_cache()
    cache.create_stream(StreamKey("s", StreamLabel.MAIN))
    q, k_new, v_new = random_inputs([6], gen)
    batch = PagedAttentionBatch(cache, [cache.page_table(StreamKey("s", StreamLabel.MAIN))], [6], "sdpa")
    torch.testing.assert_close(forward_attention(q, k_new, v_new, batch, 0), dense_reference(q, k_new, v_new))


@pytest.mark.exactness
def test_batched_equals_one_by_one_bit_for_bit():
    """Each stream gets its own SDPA call with the shapes it has alone: equal by construction."""
    gen = torch.Generator().manual_seed(2)
    cache = make_cache(torch.float32)
    keys = [StreamKey("a", StreamLabel.MAIN), StreamKey("b", StreamLabel.MAIN), StreamKey("c", StreamLabel.MAIN)]
    q_lens = [4, 2, 7]
    for key, n in zip(keys, [10, 3, 0]):
        add_stream(cache, key, n, gen)
    q, k_new, v_new = random_inputs(q_lens, gen, torch.float32)
    batch = PagedAttentionBatch(cache, [cache.page_table(k) for k in keys], q_lens, "sdpa")
    together = forward_attention(q, k_new, v_new, batch, 1)
    start = 0
    for key, n in zip(keys, q_lens):
        alone = PagedAttentionBatch(cache, [cache.page_table(key)], [n], "sdpa")
        sl = slice(start, start + n)
        assert torch.equal(forward_attention(q[sl], k_new[sl], v_new[sl], alone, 1), together[sl])
        start += n


def test_gather_is_reused_across_steps_and_redone_after_epoch_change(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    cache = make_cache()
    keys, q_lens = [StreamKey("a", StreamLabel.MAIN), StreamKey("b", StreamLabel.MAIN)], [3, 2]
    for key in keys:
        add_stream(cache, key, 6, gen)
    calls = []
    original = cache.gather_table

    def counting(table, layer, **kw):
        calls.append((table.key, layer))
        return original(table, layer, **kw)

    monkeypatch.setattr(cache, "gather_table", counting)
    batch = PagedAttentionBatch(cache, [cache.page_table(k) for k in keys], q_lens, "sdpa")
    for _step in range(4):  # denoise steps: same committed context, fresh K/V change every step
        q, k_new, v_new = random_inputs(q_lens, gen)
        for layer in range(L):
            out = forward_attention(q, k_new, v_new, batch, layer)
            torch.testing.assert_close(out, reference_for(cache, keys, q_lens, q, k_new, v_new, layer))
    assert sorted(calls) == sorted((k, layer) for k in keys for layer in range(L))  # once each

    # commit to stream "a": its old table is now stale and must be refused
    cache.append(keys[0], torch.randn(L, 5, HKV, D, dtype=torch.float64),
                 torch.randn(L, 5, HKV, D, dtype=torch.float64))
    q, k_new, v_new = random_inputs(q_lens, gen)
    with pytest.raises(StaleStreamError):
        forward_attention(q, k_new, v_new, batch, 0)

    # fresh table: "a" is re-gathered on every layer by the next forward's prime (its buffer grows), "b" is not
    calls.clear()
    batch.tables[0] = cache.page_table(keys[0])
    out = forward_attention(q, k_new, v_new, batch, 0)
    torch.testing.assert_close(out, reference_for(cache, keys, q_lens, q, k_new, v_new, 0))
    assert calls == [(keys[0], layer) for layer in range(L)]


def test_stale_after_release_and_offload_is_refused():
    gen = torch.Generator().manual_seed(4)
    cache = PagedKVCache(num_layers=L, num_pages=16, page_size=PS, num_kv_heads=HKV, head_dim=D,
                                   dtype=torch.float64, cpu_offload_pages=16)
    add_stream(cache, StreamKey("a", StreamLabel.MAIN), 12, gen)
    batch = PagedAttentionBatch(cache, [cache.page_table(StreamKey("a", StreamLabel.MAIN))], [2], "sdpa")
    q, k_new, v_new = random_inputs([2], gen)
    forward_attention(q, k_new, v_new, batch, 0)
    assert cache.offload_session("a")
    with pytest.raises(StaleStreamError, match="offloaded"):
        forward_attention(q, k_new, v_new, batch, 0)
    cache.reload_session("a")
    with pytest.raises(StaleStreamError):
        forward_attention(q, k_new, v_new, batch, 0)
    batch.tables[0] = cache.page_table(StreamKey("a", StreamLabel.MAIN))
    cache.release_oldest(StreamKey("a", StreamLabel.MAIN), 4)
    with pytest.raises(StaleStreamError, match="compacted"):
        forward_attention(q, k_new, v_new, batch, 1)


def test_gradients_flow_through_fresh_kv():
    gen = torch.Generator().manual_seed(5)
    cache = make_cache()
    add_stream(cache, StreamKey("a", StreamLabel.MAIN), 5, gen)
    batch = PagedAttentionBatch(cache, [cache.page_table(StreamKey("a", StreamLabel.MAIN))], [3], "sdpa")
    q, k_new, v_new = (t.requires_grad_() for t in random_inputs([3], gen))
    forward_attention(q, k_new, v_new, batch, 0).sum().backward()
    forward_attention(q, k_new, v_new, batch, 0).sum().backward()  # second graph over the same buffers
    assert k_new.grad is not None and torch.isfinite(v_new.grad).all()


def test_input_validation_names_the_argument():
    """`prime` checks a forward's input once (its tokens against the batch and the cache, the heads against the
    cache's kv heads); the batch checks its own fields."""
    cache = make_cache()
    cache.create_stream(StreamKey("a", StreamLabel.MAIN))
    batch = PagedAttentionBatch(cache, [cache.page_table(StreamKey("a", StreamLabel.MAIN))], [2], "sdpa")
    tokens = torch.zeros(2, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"tokens must be \[N=2, ...\].*got \(1, 16\)"):
        prime(batch, H, tokens[:1])
    with pytest.raises(ValueError, match="tokens must be torch.float64 on cpu like the KV cache, got torch.float32"):
        prime(batch, H, tokens.float())
    with pytest.raises(ValueError, match=r"q heads \(3\) must be a multiple of kv heads \(2\)"):
        prime(batch, 3, tokens)
    assert prime(batch, H, tokens).spans == ((0, 2, 0),)  # usable after the refusals
    with pytest.raises(ValueError, match="q_lens"):
        PagedAttentionBatch(cache, [cache.page_table(StreamKey("a", StreamLabel.MAIN))], [0], "sdpa")
    with pytest.raises(ValueError, match="equal length"):
        PagedAttentionBatch(cache, [cache.page_table(StreamKey("a", StreamLabel.MAIN))], [1, 2], "sdpa")


def test_prime_is_kept_while_the_tables_are_current_and_redone_after_a_commit():
    """Each forward primes its batch: while no table changed, the same `AttentionForward` (no gather, no plan);
    a commit behind the batch fails loudly at the next forward; fresh tables give a new one."""
    gen = torch.Generator().manual_seed(6)
    cache = make_cache()
    key = StreamKey("a", StreamLabel.MAIN)
    add_stream(cache, key, 5, gen)
    batch = PagedAttentionBatch(cache, [cache.page_table(key)], [3], "sdpa")
    first = prime(batch, H)
    assert prime(batch, H) is first and first.spans == ((0, 3, 5),)
    cache.append(key, torch.randn(L, 2, HKV, D, dtype=torch.float64), torch.randn(L, 2, HKV, D, dtype=torch.float64))
    with pytest.raises(StaleStreamError, match="changed"):
        prime(batch, H)
    batch.tables[0] = cache.page_table(key)
    again = prime(batch, H)
    assert again is not first and again.spans == ((0, 3, 7),)


def test_resolve_backend_on_cpu(monkeypatch):
    assert resolve_backend("auto", "cpu") is AttentionBackendName.SDPA
    assert resolve_backend(AttentionBackendName.SDPA, torch.device("cpu")) is AttentionBackendName.SDPA
    with pytest.raises(ValueError, match="attention_backend='flashinfer'.*CUDA"):
        resolve_backend("flashinfer", "cpu")
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        resolve_backend("flash", "cpu")
    if not torch.cuda.is_available():  # a device this machine lacks is refused, not mapped to sdpa
        with pytest.raises(ValueError, match="device='cuda': CUDA is not available"):
            resolve_backend("auto", "cuda")
    # auto never picks kernels that cannot take the cache's dtype or head_dim (a CUDA device, emulated)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_backend("auto", "cuda", dtype=torch.float32) is AttentionBackendName.SDPA
    assert resolve_backend("auto", "cuda", dtype=torch.bfloat16, head_dim=16) is AttentionBackendName.SDPA


def test_auto_takes_flashinfer_only_where_its_kernels_load(monkeypatch):
    """A CUDA machine whose flashinfer imports, emulated: ``auto`` asks `load_problem`, and a package whose modules
    do not load (a kit without them, JIT disabled) gives sdpa; an explicit ``flashinfer`` says why it cannot run."""
    from worldstep.engine import attention

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(attention, "flashinfer_available", lambda: True)
    asked = []
    monkeypatch.setattr(attention, "load_problem", lambda *a: asked.append(a) or None)
    assert resolve_backend("auto", "cuda", dtype=torch.bfloat16, head_dim=128) is AttentionBackendName.FLASHINFER
    assert asked == [(torch.device("cuda:0"), torch.bfloat16, 128)]
    reason = "its kernels do not load here (RuntimeError: no prebuilt module and FLASHINFER_DISABLE_JIT=1)"
    monkeypatch.setattr(attention, "load_problem", lambda *a: reason)
    assert resolve_backend("auto", "cuda", dtype=torch.bfloat16, head_dim=128) is AttentionBackendName.SDPA
    with pytest.raises(ValueError, match=r"attention_backend='flashinfer' cannot run here: its kernels do not load"):
        resolve_backend("flashinfer", "cuda", dtype=torch.bfloat16, head_dim=128)


def test_load_problem_runs_the_kernels_once_and_names_what_failed(monkeypatch):
    """`load_problem` over the CPU emulation of flashinfer: the probe batch plans both wrappers and merges (None),
    once per (device, dtype, head_dim); a module that fails to load is the reason, in one line."""
    import flashinfer_emulation
    from worldstep.engine.flashinfer_kernels import load_problem

    flashinfer_emulation.install(monkeypatch)
    load_problem.cache_clear()
    try:
        assert load_problem(torch.device("cpu"), torch.float32, 16) is None
        assert flashinfer_emulation.COUNTS == {"wrappers": 2, "plans": 2, "runs": 2}
        assert load_problem(torch.device("cpu"), torch.float32, 16) is None and flashinfer_emulation.COUNTS["runs"] == 2

        def missing(*args, **kwargs):
            raise RuntimeError("cascade module not found\nsecond line")

        monkeypatch.setattr(flashinfer_emulation, "merge_state", missing)
        assert load_problem(torch.device("cpu"), torch.float32, 32) == (
            "its kernels do not load here (RuntimeError: cascade module not found)")
    finally:
        load_problem.cache_clear()


def test_flashinfer_is_never_imported_on_cpu():
    code = (
        "import sys, torch\n"
        "from worldstep.engine.attention import PagedAttentionBatch, paged_attention, prime\n"
        "from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel\n"
        "c = PagedKVCache(num_layers=1, num_pages=4, page_size=4, num_kv_heads=1, head_dim=4)\n"
        "key = StreamKey('a', StreamLabel.MAIN)\n"
        "c.create_stream(key)\n"
        "b = PagedAttentionBatch(c, [c.page_table(key)], [2], 'auto')\n"
        "paged_attention(torch.zeros(2, 1, 4), torch.zeros(2, 1, 4), torch.zeros(2, 1, 4), prime(b, 1), 0)\n"
        "assert 'flashinfer' not in sys.modules, 'flashinfer imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
