"""PagedKVCache: append/gather, protection and release, forks, offload, staleness."""

import pytest
import torch
from worldstep.engine.kv import (
    KVPoolExhausted,
    PagedKVCache,
    PageTable,
    StaleStreamError,
    StreamKey,
    StreamLabel,
    StreamTable,
    check_invariants,
)
from worldstep.engine.windowing import RetentionPolicy

L, HKV, D, PS = 2, 2, 3, 4
MAIN = StreamKey("s", StreamLabel.MAIN)


def make_cache(num_pages=16, cpu_offload_pages=0, dtype=torch.float32) -> PagedKVCache:
    return PagedKVCache(
        num_layers=L, num_pages=num_pages, page_size=PS, num_kv_heads=HKV, head_dim=D,
        dtype=dtype, cpu_offload_pages=cpu_offload_pages,
    )


def tokens(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V whose every element names its token and layer, so read-back checks are exact."""
    ids = torch.arange(start, start + n, dtype=torch.float32)
    k = ids.view(1, n, 1, 1) + 0.25 * torch.arange(L, dtype=torch.float32).view(L, 1, 1, 1)
    k = k.expand(L, n, HKV, D).clone()
    return k, -k


def token_ids(cache, key, layer=0) -> list[int]:
    k, v = cache.gather(key, layer)
    assert torch.equal(v, -k)
    return (k[:, 0, 0] - 0.25 * layer).round().long().tolist()


def filled(cache, key, n, start=0):
    if key not in cache.stream_keys():
        cache.create_stream(key)
    cache.append(key, *tokens(start, n))


def test_append_gather_round_trip_all_layers():
    cache = make_cache()
    filled(cache, MAIN, 10)
    filled(cache, MAIN, 3, start=10)
    for layer in range(L):
        k, v = cache.gather(MAIN, layer)
        ek, ev = tokens(0, 13)
        assert torch.equal(k, ek[layer]) and torch.equal(v, ev[layer])
    table = cache.page_table(MAIN)
    assert table.seq_len == 13 and len(table.pages) == 4
    assert cache.kv.shape == (L, 16, 2, PS, HKV, D)
    check_invariants(cache)


def test_a_cache_commits_no_token_it_did_not_write():
    """The table's bookkeeping-only append (the memory planner's) is not a way around the cache's K/V: on a cache
    `append` takes the tensors, and the reserve and commit steps are private (they were public once the cache
    became its table, so a reserve committed without a write would have read stale pages as the stream)."""
    cache = make_cache()
    filled(cache, MAIN, 3)
    with pytest.raises(TypeError):
        cache.append(MAIN, 2)
    with pytest.raises(ValueError, match="k.shape=int is invalid"):
        cache.append(MAIN, 2, 2)
    assert cache.page_table(MAIN).seq_len == 3
    assert not [name for name in dir(cache) if "append" in name and not name.startswith("_")
                and name not in ("append", "can_append")]
    table = StreamTable(num_pages=4, page_size=PS)
    table.create_stream(MAIN)
    table.append(MAIN, PS + 1)
    assert table.page_table(MAIN).seq_len == PS + 1 and table.num_used_pages == 2
    check_invariants(cache)


def test_append_converts_dtype_and_rejects_bad_shapes():
    cache = make_cache(dtype=torch.float64)
    cache.create_stream(MAIN)
    k, v = tokens(0, 2)
    cache.append(MAIN, k, v)
    assert cache.gather(MAIN, 0)[0].dtype == torch.float64
    with pytest.raises(ValueError, match="kv_heads"):
        cache.append(MAIN, k[:, :, :1], v[:, :, :1])
    with pytest.raises(ValueError, match="shapes differ"):
        cache.append(MAIN, k, v[:, :1])
    with pytest.raises(ValueError, match="layer"):
        cache.gather(MAIN, L)


def test_epoch_bumps_on_append_and_not_on_empty_append():
    cache = make_cache()
    cache.create_stream(MAIN)
    e0 = cache.page_table(MAIN).prefix_epoch
    cache.append(MAIN, *tokens(0, 0))
    assert cache.page_table(MAIN).prefix_epoch == e0
    cache.append(MAIN, *tokens(0, 1))
    assert cache.page_table(MAIN).prefix_epoch > e0


def test_exhausted_append_is_atomic():
    cache = make_cache(num_pages=3)
    filled(cache, MAIN, 10)  # 3 pages, tail has 2 free slots
    before = (cache.page_table(MAIN), cache.num_free_pages)
    assert cache.can_append(MAIN, 2) and not cache.can_append(MAIN, 3)
    with pytest.raises(KVPoolExhausted) as info:
        cache.append(MAIN, *tokens(10, 3))
    assert info.value.needed == 1 and info.value.free == 0
    assert (cache.page_table(MAIN), cache.num_free_pages) == before
    assert token_ids(cache, MAIN) == list(range(10))
    check_invariants(cache)


def test_protect_prefix_rules():
    cache = make_cache()
    filled(cache, MAIN, 12)
    with pytest.raises(ValueError, match="exceeds"):
        cache.protect_prefix(MAIN, 13)
    cache.protect_prefix(MAIN, 6)
    cache.protect_prefix(MAIN, 6)  # same value: no-op
    with pytest.raises(ValueError, match="already protects 6"):
        cache.protect_prefix(MAIN, 4)
    other = StreamKey("s", StreamLabel.UNCOND)
    filled(cache, other, 12)
    assert cache.release_oldest(other, 4) == 4
    with pytest.raises(ValueError, match="after 4 tokens were released"):
        cache.protect_prefix(other, 2)
    with pytest.raises(ValueError, match="n_tokens"):
        cache.protect_prefix(MAIN, -1)


def test_release_is_page_floored_and_keeps_protected_head_and_tail():
    cache = make_cache()
    filled(cache, MAIN, 23)  # pages: [0-3][4-7][8-11][12-15][16-19][20-22 tail]
    cache.protect_prefix(MAIN, 6)  # page 1 straddles the boundary
    e0 = cache.page_table(MAIN).prefix_epoch
    assert cache.release_oldest(MAIN, 3) == 0  # less than a page
    assert cache.page_table(MAIN).prefix_epoch == e0
    assert cache.release_oldest(MAIN, 5) == 4  # floored to one page: tokens 8-11
    assert token_ids(cache, MAIN) == list(range(8)) + list(range(12, 23))
    assert cache.release_oldest(MAIN, 100) == 8  # 12-19; never the straddle page or the tail
    assert token_ids(cache, MAIN) == list(range(8)) + [20, 21, 22]
    table = cache.page_table(MAIN)
    assert (table.seq_len, table.released_tokens, table.protected_prefix_tokens) == (11, 12, 6)
    assert table.prefix_epoch > e0
    assert cache.release_oldest(MAIN, 100) == 0
    check_invariants(cache)


def test_release_can_free_a_full_last_page():
    cache = make_cache()
    filled(cache, MAIN, 12)
    cache.protect_prefix(MAIN, 4)
    assert cache.release_oldest(MAIN, 100) == 8
    assert token_ids(cache, MAIN) == [0, 1, 2, 3]
    filled(cache, MAIN, 2, start=12)
    assert token_ids(cache, MAIN) == [0, 1, 2, 3, 12, 13]


def test_apply_retention_releases_past_horizon_and_requires_matching_protection():
    cache = make_cache()
    filled(cache, MAIN, 8)
    cache.protect_prefix(MAIN, 8)
    filled(cache, MAIN, 12, start=8)
    policy = RetentionPolicy(protected_tokens=8, context_tokens=4)
    assert cache.apply_retention(MAIN, None) == 0
    assert cache.apply_retention(MAIN, policy) == 8
    assert token_ids(cache, MAIN) == list(range(8)) + [16, 17, 18, 19]
    with pytest.raises(ValueError, match="protected_tokens=0"):
        cache.apply_retention(MAIN, RetentionPolicy(0, 4))


def test_fork_shares_pages_and_copy_on_write_keeps_streams_independent():
    cache = make_cache()
    filled(cache, MAIN, 6)  # tail page half full
    used = cache.num_used_pages
    cache.fork(MAIN, StreamKey("t", StreamLabel.MAIN))
    assert cache.num_used_pages == used  # zero copy
    src, dst = cache.page_table(MAIN), cache.page_table(StreamKey("t", StreamLabel.MAIN))
    assert src.pages == dst.pages and dst.prefix_epoch > src.prefix_epoch
    assert all(cache.allocator.ref_count(p) == 2 for p in src.pages)
    filled(cache, StreamKey("t", StreamLabel.MAIN), 3, start=100)
    filled(cache, MAIN, 1, start=200)
    assert token_ids(cache, MAIN) == [0, 1, 2, 3, 4, 5, 200]
    assert token_ids(cache, StreamKey("t", StreamLabel.MAIN)) == [0, 1, 2, 3, 4, 5, 100, 101, 102]
    assert cache.page_table(MAIN).pages[0] == cache.page_table(StreamKey("t", StreamLabel.MAIN)).pages[0]
    check_invariants(cache)
    assert cache.remove(MAIN) == 1  # only its own COW tail page goes back
    assert token_ids(cache, StreamKey("t", StreamLabel.MAIN))[:6] == list(range(6))
    check_invariants(cache)


def test_fork_copies_protection_and_release_state():
    cache = make_cache()
    filled(cache, MAIN, 16)
    cache.protect_prefix(MAIN, 4)
    cache.release_oldest(MAIN, 4)
    cache.fork_session("s", "t")
    table = cache.page_table(StreamKey("t", StreamLabel.MAIN))
    assert (table.protected_prefix_tokens, table.released_tokens, table.seq_len) == (4, 4, 12)
    cache.release_oldest(StreamKey("t", StreamLabel.MAIN), 4)  # freeing a shared page only drops a reference
    assert token_ids(cache, MAIN) == [0, 1, 2, 3] + list(range(8, 16))
    with pytest.raises(ValueError, match="already has KV streams"):
        cache.fork_session("s", "t")


def test_remove_session_returns_every_page():
    cache = make_cache(cpu_offload_pages=8)
    filled(cache, StreamKey("a", StreamLabel.MAIN), 9)
    filled(cache, StreamKey("a", StreamLabel.UNCOND), 2)
    filled(cache, StreamKey("b", StreamLabel.MAIN), 4)
    assert cache.pages_in_use("a") == 4
    assert cache.remove_session("a") == 4
    assert cache.remove_session("a") == 0  # idempotent
    assert cache.pages_in_use("a") == 0 and StreamKey("a", StreamLabel.MAIN) not in cache.stream_keys()
    assert cache.offload_session("b")
    assert cache.remove_session("b") == 0
    assert cache.num_free_pages == 16 and cache.num_free_cpu_pages == 8
    assert not cache.is_offloaded("b")
    check_invariants(cache)


def test_offload_reload_round_trips_every_field():
    cache = make_cache(cpu_offload_pages=8)
    filled(cache, MAIN, 14)
    cache.protect_prefix(MAIN, 5)
    cache.release_oldest(MAIN, 4)
    filled(cache, StreamKey("s", StreamLabel.UNCOND), 3)
    before = {key: cache.page_table(key) for key in cache.stream_keys("s")}
    assert cache.offload_session("s")
    assert cache.is_offloaded("s") and cache.pages_in_use("s") == 0 and cache.num_free_pages == 16
    with pytest.raises(StaleStreamError, match="offloaded"):
        cache.check_current(before[MAIN])
    with pytest.raises(ValueError, match="offloaded"):
        cache.append(MAIN, *tokens(0, 1))
    with pytest.raises(ValueError, match="already|offloaded"):
        cache.offload_session("s")
    cache.reload_session("s")
    for key, old in before.items():
        new = cache.page_table(key)
        assert (new.seq_len, new.protected_prefix_tokens, new.released_tokens) == (
            old.seq_len, old.protected_prefix_tokens, old.released_tokens,
        )
        assert new.prefix_epoch > old.prefix_epoch
        with pytest.raises(StaleStreamError):
            cache.check_current(old)
    assert token_ids(cache, MAIN) == list(range(8)) + list(range(12, 14))
    assert token_ids(cache, StreamKey("s", StreamLabel.UNCOND), layer=1) == [0, 1, 2]
    assert cache.num_free_cpu_pages == 8
    check_invariants(cache)


def test_offload_that_does_not_fit_returns_false_and_frees_nothing():
    cache = make_cache(cpu_offload_pages=2)
    filled(cache, MAIN, 9)  # 3 pages > 2 CPU pages
    before = (cache.page_table(MAIN), cache.num_free_pages, cache.num_free_cpu_pages)
    assert cache.offload_session("s") is False
    assert (cache.page_table(MAIN), cache.num_free_pages, cache.num_free_cpu_pages) == before
    assert not cache.is_offloaded("s")
    cache.check_current(before[0])
    assert token_ids(cache, MAIN) == list(range(9))
    no_pool = make_cache(cpu_offload_pages=0)
    filled(no_pool, MAIN, 1)
    assert no_pool.offload_session("s") is False and no_pool.pages_in_use("s") == 1


def test_reload_that_does_not_fit_leaves_session_offloaded_intact():
    cache = make_cache(num_pages=4, cpu_offload_pages=4)
    filled(cache, MAIN, 12)
    assert cache.offload_session("s")
    filled(cache, StreamKey("x", StreamLabel.MAIN), 8)  # takes 2 of the 4 device pages
    with pytest.raises(KVPoolExhausted):
        cache.reload_session("s")
    assert cache.is_offloaded("s") and cache.num_free_cpu_pages == 1
    cache.remove_session("x")
    cache.reload_session("s")
    assert token_ids(cache, MAIN) == list(range(12))
    check_invariants(cache)


def test_offload_of_a_forked_session_copies_shared_pages():
    cache = make_cache(cpu_offload_pages=8)
    filled(cache, MAIN, 10)
    cache.fork_session("s", "t")
    uncond, t_main = StreamKey("s", StreamLabel.UNCOND), StreamKey("t", StreamLabel.MAIN)
    cache.fork(MAIN, uncond)  # shared within the session: saved once
    filled(cache, uncond, 2, start=10)  # its copied tail page is its own
    assert cache.offload_session("s")
    assert cache.num_free_cpu_pages == 8 - 3 - 1
    assert cache.pages_in_use("t") == 3 and cache.num_used_pages == 3  # t keeps the shared pages
    assert all(cache.allocator.ref_count(p) == 1 for p in cache.page_table(t_main).pages)
    filled(cache, t_main, 2, start=50)
    cache.reload_session("s")
    assert token_ids(cache, MAIN) == list(range(10))
    assert token_ids(cache, uncond) == list(range(12))
    assert token_ids(cache, t_main) == list(range(10)) + [50, 51]
    s_pages, u_pages = cache.page_table(MAIN).pages, cache.page_table(uncond).pages
    assert s_pages[:2] == u_pages[:2] and s_pages[2] != u_pages[2]  # sharing inside the session survives
    assert set(s_pages).isdisjoint(cache.page_table(t_main).pages)
    check_invariants(cache)


def test_check_current_detects_compaction_change_and_recreation():
    cache = make_cache()
    filled(cache, MAIN, 12)
    table = cache.page_table(MAIN)
    cache.check_current(table)
    cache.release_oldest(MAIN, 4)
    with pytest.raises(StaleStreamError, match="compacted"):
        cache.check_current(table)
    with pytest.raises(StaleStreamError, match="compacted"):
        cache.gather_table(table, 0)
    table = cache.page_table(MAIN)
    filled(cache, MAIN, 1)
    with pytest.raises(StaleStreamError, match="changed"):
        cache.check_current(table)
    table = cache.page_table(MAIN)
    cache.remove(MAIN)
    with pytest.raises(StaleStreamError, match="removed"):
        cache.check_current(table)
    filled(cache, MAIN, 9)
    with pytest.raises(StaleStreamError):  # same key, same length: still not the table's content
        cache.check_current(PageTable(MAIN, table.pages, 9, 0, 0, table.prefix_epoch))


def test_gather_table_fills_caller_buffers():
    cache = make_cache()
    filled(cache, MAIN, 7)
    table = cache.page_table(MAIN)
    out_k, out_v = torch.full((10, HKV, D), 9.0), torch.full((10, HKV, D), 9.0)
    k, v = cache.gather_table(table, 1, out_k=out_k, out_v=out_v)
    assert k.data_ptr() == out_k.data_ptr() and k.shape[0] == 7
    assert torch.equal(k, tokens(0, 7)[0][1]) and torch.equal(v, tokens(0, 7)[1][1])
    assert torch.equal(out_k[7:], torch.full((3, HKV, D), 9.0))


def test_bad_arguments_raise_naming_the_field():
    with pytest.raises(ValueError, match="page_size"):
        PagedKVCache(num_layers=1, num_pages=1, page_size=0, num_kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="cpu_offload_pages"):
        PagedKVCache(num_layers=1, num_pages=1, page_size=1, num_kv_heads=1, head_dim=1, cpu_offload_pages=-1)
    cache = make_cache()
    with pytest.raises(ValueError, match="StreamKey"):
        cache.create_stream(("s",))
    with pytest.raises(ValueError, match="label"):
        StreamKey("s", "main")
    cache.create_stream(MAIN)
    with pytest.raises(ValueError, match="already exists"):
        cache.create_stream(MAIN)
    with pytest.raises(KeyError, match="create_stream"):
        cache.page_table(StreamKey("s", StreamLabel.UNCOND))
    with pytest.raises(ValueError, match="n_tokens"):
        cache.release_oldest(MAIN, -1)
    with pytest.raises(KeyError):
        cache.offload_session("nobody")
