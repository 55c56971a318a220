"""Which pages hold which stream's tokens: the bookkeeping half of the paged KV cache (ids only, no torch).

Token ``i`` of a stream lives at ``pages[i // page_size]``, slot ``i % page_size``; every page but the last
is full, so releases and forks move whole pages. Every change of committed content (append, release,
restore, stream creation, fork targets included) sets ``prefix_epoch`` from one table-wide clock: epochs
only grow and are never reused, even across a removed and re-created key, so an epoch names one content
version. A write goes in two steps, `reserve_append` then `commit_append` (or `cancel_append`), so the
`PagedKVCache` that holds this table can write K/V in between and a failed write changes nothing.
Not thread-safe by itself: the cache serialises every call under its one lock; the memory planner uses a
table alone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import check_int
from .allocator import PageAllocator
from .stream import PageTable, StreamKey, StreamLabel, StreamState, check_snapshot, check_stream_key

if TYPE_CHECKING:
    from ..windowing import RetentionPolicy


@dataclass(frozen=True)
class AppendPlan:
    """Pages reserved for appending ``n`` tokens at token ``start``; nothing changes until committed.

    ``copy`` is ``(src, dst)`` when the partially filled tail page is shared with a fork and must be
    copied before the write (copy-on-write).
    """

    key: StreamKey
    pages: tuple[int, ...]
    new_pages: tuple[int, ...]
    copy: tuple[int, int] | None
    start: int
    n: int


class StreamTable:
    """Streams keyed by `StreamKey` over one device page pool."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = check_int("page_size", page_size, 1)
        self.allocator = PageAllocator(check_int("num_pages", num_pages, 1))
        self._streams: dict[StreamKey, StreamState] = {}
        self._epoch_clock = itertools.count(1)

    # stats

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free

    @property
    def num_used_pages(self) -> int:
        return self.allocator.num_used

    def stream_keys(self, session_id: str | None = None) -> list[StreamKey]:
        return list(self._streams) if session_id is None else self._keys_of(session_id)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def states(self) -> dict[StreamKey, StreamState]:
        return dict(self._streams)  # every stream's state, for `check_invariants` (a shallow copy of the mapping)

    # stream lifecycle

    def create_stream(self, key: StreamKey) -> None:
        if check_stream_key(key) in self._streams:
            raise ValueError(f"KV stream {key} already exists")
        self._streams[key] = StreamState(prefix_epoch=next(self._epoch_clock))

    def restore_stream(self, key: StreamKey, state: StreamState) -> None:
        """Put a stream back with ``state``'s content, on device pages the caller reserved (each gets one more
        reference), at a new epoch: how an offloaded session comes back."""
        if check_stream_key(key) in self._streams:
            raise ValueError(f"KV stream {key} already exists")
        assert len(state.pages) == self.pages_for(state.seq_len) and state.cpu_pages is None, state
        self.allocator.share(state.pages)
        state.prefix_epoch = next(self._epoch_clock)
        self._streams[key] = state

    def page_table(self, key: StreamKey) -> PageTable:
        """A frozen snapshot of the stream."""
        state = self._stream(key)
        return PageTable(key, tuple(state.pages), state.seq_len, state.protected_prefix_tokens,
                         state.released_tokens, state.prefix_epoch)

    def remove(self, key: StreamKey) -> int:
        """Drop a stream; returns how many device pages went back to the free pool (pages still shared
        with a fork stay in use and are not counted)."""
        returned = self.allocator.free(self._stream(key).pages)
        del self._streams[key]
        return len(returned)

    def remove_session(self, session_id: str) -> int:
        """Drop every stream of a session (idempotent); returns device pages returned."""
        return sum(self.remove(key) for key in self._keys_of(session_id))

    # append

    def can_append(self, key: StreamKey, n_tokens: int) -> bool:
        needed, _ = self._pages_needed(self._stream(key), check_int("n_tokens", n_tokens, 0))
        return self.allocator.can_allocate(needed)

    def append(self, key: StreamKey, n_tokens: int) -> None:
        """Record ``n_tokens`` more tokens: bookkeeping alone (the memory planner's; a cache writes K/V between
        `reserve_append` and `commit_append`)."""
        self.commit_append(self.reserve_append(key, n_tokens))

    def reserve_append(self, key: StreamKey, n_tokens: int) -> AppendPlan:
        """Reserve every page ``n_tokens`` more tokens need (KVPoolExhausted leaves everything as it was); the
        stream is unchanged until `commit_append`, and `cancel_append` gives the pages back."""
        state = self._stream(key)
        needed, cow = self._pages_needed(state, check_int("n_tokens", n_tokens, 0))
        new_pages = self.allocator.allocate(needed)
        pages = list(state.pages)
        copy = None
        if cow:
            copy = (pages[-1], new_pages[0])
            pages[-1] = new_pages[0]
        pages.extend(new_pages[1:] if cow else new_pages)
        return AppendPlan(key, tuple(pages), tuple(new_pages), copy, state.seq_len, n_tokens)

    def commit_append(self, plan: AppendPlan) -> None:
        """The written plan becomes the stream's content (a copied tail page drops this stream's reference)."""
        state = self._stream(plan.key)
        assert state.seq_len == plan.start, "the stream changed between reserve and commit"
        if plan.copy is not None:
            self.allocator.free([plan.copy[0]])
        state.pages = list(plan.pages)
        state.seq_len += plan.n
        state.prefix_epoch = next(self._epoch_clock)

    def cancel_append(self, plan: AppendPlan) -> None:
        """Give a reservation's pages back (the write failed); the stream is as it was."""
        self.allocator.free(plan.new_pages)

    # protection and release

    def protect_prefix(self, key: StreamKey, n_tokens: int) -> None:
        """Mark the first ``n_tokens`` as never releasable (the text prompt); set once per stream."""
        check_int("n_tokens", n_tokens, 0)
        state = self._stream(key)
        if n_tokens == state.protected_prefix_tokens:
            return
        if state.released_tokens:
            raise ValueError(f"cannot protect a prefix of KV stream {key} after {state.released_tokens} "
                             "tokens were released: the head it would protect is gone")
        if state.protected_prefix_tokens:
            raise ValueError(f"KV stream {key} already protects {state.protected_prefix_tokens} tokens; "
                             f"cannot change it to {n_tokens}")
        if n_tokens > state.seq_len:
            raise ValueError(f"n_tokens={n_tokens} exceeds the stream's seq_len={state.seq_len}")
        state.protected_prefix_tokens = n_tokens

    def release_oldest(self, key: StreamKey, n_tokens: int) -> int:
        """Free whole pages from the front of the unprotected part, at most ``n_tokens`` tokens. Page-floored: the
        page straddling the protected boundary and a partially filled tail page are never freed. Returns the
        tokens actually released; callers re-offer the shortfall later."""
        check_int("n_tokens", n_tokens, 0)
        state = self._stream(key)
        first = -(-state.protected_prefix_tokens // self.page_size)  # first wholly unprotected page
        releasable = max(0, state.seq_len // self.page_size - first)
        n_pages = min(n_tokens // self.page_size, releasable)
        if n_pages == 0:
            return 0
        dropped = state.pages[first : first + n_pages]
        del state.pages[first : first + n_pages]
        self.allocator.free(dropped)
        released = n_pages * self.page_size
        state.seq_len -= released
        state.released_tokens += released
        state.prefix_epoch = next(self._epoch_clock)
        return released

    def apply_retention(self, key: StreamKey, policy: RetentionPolicy | None) -> int:
        """Release what ``policy`` says is past the context horizon; ``None`` keeps everything."""
        if policy is None:
            return 0
        state = self._stream(key)
        if policy.protected_tokens != state.protected_prefix_tokens:
            raise ValueError(f"RetentionPolicy.protected_tokens={policy.protected_tokens} but KV stream {key} "
                             f"protects {state.protected_prefix_tokens}; call protect_prefix first")
        n = policy.tokens_to_release(state.seq_len)
        return self.release_oldest(key, n) if n > 0 else 0

    # forks

    def fork(self, src_key: StreamKey, dst_key: StreamKey) -> None:
        """Create ``dst_key`` sharing every committed page of ``src_key`` by reference (zero copy)."""
        src = self._stream(src_key)
        if check_stream_key(dst_key) in self._streams:
            raise ValueError(f"KV stream {dst_key} already exists")
        self.allocator.share(src.pages)
        self._streams[dst_key] = StreamState(
            pages=list(src.pages), seq_len=src.seq_len, protected_prefix_tokens=src.protected_prefix_tokens,
            released_tokens=src.released_tokens, prefix_epoch=next(self._epoch_clock),
        )

    def fork_session(self, src_session_id: str, dst_session_id: str) -> None:
        """Fork every stream of a session under the same labels."""
        keys = self._keys_of(src_session_id)
        if not keys:
            raise KeyError(f"no KV streams for session {src_session_id!r}")
        if self._keys_of(dst_session_id):
            raise ValueError(f"session {dst_session_id!r} already has KV streams")
        for key in keys:
            self.fork(key, StreamKey(dst_session_id, key.label))

    # staleness

    def check_current(self, table: PageTable) -> None:
        """Raise `StaleStreamError` unless ``table`` still describes its stream exactly."""
        check_snapshot(table, self._streams.get(table.key))

    def check_live(self, key: StreamKey) -> None:
        """KeyError when there is no such stream."""
        self._stream(key)

    # private helpers

    def _keys_of(self, session_id: str) -> list[StreamKey]:  # one lookup per label, not a scan of the pool
        return [k for k in (StreamKey(session_id, label) for label in StreamLabel) if k in self._streams]

    def _stream(self, key: StreamKey) -> StreamState:
        state = self._streams.get(check_stream_key(key))
        if state is None:
            raise KeyError(f"no KV stream {key}; create_stream first")
        return state

    def _pages_needed(self, state: StreamState, n: int) -> tuple[int, bool]:
        """Pages to reserve for ``n`` more tokens, and whether the tail page must be copied first."""
        fill = state.seq_len % self.page_size
        room = self.page_size - fill if fill else 0
        new_pages = self.pages_for(max(0, n - room))
        cow = n > 0 and fill > 0 and self.allocator.ref_counts[state.pages[-1]] > 1
        return new_pages + int(cow), cow
