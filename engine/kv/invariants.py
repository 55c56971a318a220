"""The paged cache's invariants, checked on demand (tests and debugging)."""

from __future__ import annotations

from collections.abc import Iterable

from .allocator import PageAllocator
from .cache import PagedKVCache


def check_invariants(cache: PagedKVCache) -> None:
    """Raise AssertionError if the pools and the streams disagree.

    Free and used pages partition each pool, each page's ref count equals the streams' references to it,
    a stream holds exactly the pages its ``seq_len`` needs, in the pool its session lives in, and its
    protected prefix fits inside it.
    """
    with cache.lock:
        live, parked = cache.table.states(), cache.offload.states()
        _check_pool(cache.table.allocator, (s.pages for s in live.values()))
        _check_pool(cache.offload.allocator, (s.cpu_pages or () for s in parked.values()))
        for key, state in [*live.items(), *parked.items()]:
            on_cpu = key in parked
            pages = state.cpu_pages if on_cpu else state.pages
            misplaced = bool(state.pages) if on_cpu else state.cpu_pages is not None
            if pages is None or len(pages) != cache.pages_for(state.seq_len) or misplaced:
                raise AssertionError(f"{key}: {state} does not match seq_len {state.seq_len}")
            if not 0 <= state.protected_prefix_tokens <= state.seq_len:
                raise AssertionError(f"{key}: protected prefix exceeds seq_len: {state}")
            if on_cpu != (key.session_id in cache.offload.parked) or (on_cpu and key in live):
                raise AssertionError(f"{key}: both parked and live, or parked under a session not marked so")


def _check_pool(allocator: PageAllocator, stream_pages: Iterable[Iterable[int]]) -> None:
    free, used = set(allocator.free_page_ids), allocator.used_page_ids
    if len(free) != len(allocator.free_page_ids) or free & used or free | used != set(range(allocator.num_pages)):
        raise AssertionError(f"{allocator.name}: free and used pages do not partition the pool")
    refs = [0] * allocator.num_pages
    for pages in stream_pages:
        for page in pages:
            refs[page] += 1
    if refs != allocator.ref_counts:
        raise AssertionError(f"{allocator.name}: ref counts {allocator.ref_counts} != stream references {refs}")
    if any((r > 0) != (p in used) for p, r in enumerate(refs)):
        raise AssertionError(f"{allocator.name}: a page's ref count disagrees with its used flag")
