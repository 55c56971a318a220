"""Which pages hold which stream's tokens: the bookkeeping half of the paged KV cache (no torch).

Token ``i`` of a stream lives at ``pages[i // page_size]``, slot ``i % page_size``; every page but the last
is full, so releases and forks move whole pages. Every change of committed content (append, release,
reload, stream creation, fork targets included) sets ``prefix_epoch`` from one table-wide clock: epochs
only grow and are never reused, even across a removed and re-created key, so an epoch names one content
version. Every method used from outside holds ``lock`` (`PagedKVCache`, this table with the K/V tensor, too).
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

from ..checks import check_int
from .allocator import PageAllocator
from .locking import locked
from .plans import AppendPlan
from .stream import PageTable, StreamKey, StreamLabel, StreamState, check_snapshot, check_stream_key

if TYPE_CHECKING:
    from ..windowing import RetentionPolicy


class StreamTable:
    """Streams keyed by `StreamKey` over one device page pool."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = check_int("page_size", page_size, 1)
        self.allocator = PageAllocator(check_int("num_pages", num_pages, 1))
        self.lock = threading.RLock()  # one lock over the table (and, in a PagedKVCache, its tensor and offload)
        self._streams: dict[StreamKey, StreamState] = {}
        self._parked: dict[str, dict[StreamKey, StreamState]] = {}  # offloaded sessions' streams: the one record
        self._epoch_clock = itertools.count(1)

    # stats

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free

    @property
    def num_used_pages(self) -> int:
        return self.allocator.num_used

    @locked
    def pages_in_use(self, session_id: str) -> int:
        """Distinct device pages the session's streams reference (pages shared with a fork count too)."""
        return len({p for key in self._keys_of(session_id) for p in self._streams[key].pages})

    @locked
    def stream_keys(self, session_id: str | None = None) -> list[StreamKey]:
        return list(self._streams) if session_id is None else self._keys_of(session_id)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # stream lifecycle

    @locked
    def create_stream(self, key: StreamKey) -> None:
        check_stream_key(key)
        if key in self._streams:
            raise ValueError(f"KV stream {key} already exists")
        self._check_not_offloaded(key.session_id)
        self._streams[key] = StreamState(prefix_epoch=next(self._epoch_clock))

    @locked
    def page_table(self, key: StreamKey) -> PageTable:
        """A frozen snapshot; ``pages`` is empty while the session is offloaded (its parked state's own)."""
        state = self._streams.get(check_stream_key(key))
        if state is None:
            state = self._parked.get(key.session_id, {}).get(key)
            if state is None:
                raise KeyError(f"no KV stream {key}; create_stream first")
        return PageTable(key, tuple(state.pages), state.seq_len, state.protected_prefix_tokens,
                         state.released_tokens, state.prefix_epoch)

    @locked
    def remove(self, key: StreamKey) -> int:
        """Drop a stream; returns how many device pages went back to the free pool (pages still shared
        with a fork stay in use and are not counted)."""
        returned = self.allocator.free(self._stream(key).pages)
        del self._streams[key]
        return len(returned)

    @locked
    def remove_session(self, session_id: str) -> int:
        """Drop every stream of a session, parked or not (idempotent); returns device pages returned."""
        self._parked.pop(session_id, None)
        return sum(self.remove(key) for key in self._keys_of(session_id))

    # append

    @locked
    def can_append(self, key: StreamKey, n_tokens: int) -> bool:
        needed, _ = self._pages_needed(self._live(key), check_int("n_tokens", n_tokens, 0))
        return self.allocator.can_allocate(needed)

    @locked
    def append(self, key: StreamKey, n_tokens: int) -> None:
        """Record ``n_tokens`` more tokens: bookkeeping alone (a `PagedKVCache` appends K/V, through the same steps)."""
        self._commit_append(self._reserve_append(key, n_tokens))

    def _reserve_append(self, key: StreamKey, n_tokens: int) -> AppendPlan:
        """Reserve every page ``n_tokens`` more tokens need (KVPoolExhausted leaves everything as it was)."""
        state = self._live(key)
        needed, cow = self._pages_needed(state, check_int("n_tokens", n_tokens, 0))
        new_pages = self.allocator.allocate(needed)
        pages = list(state.pages)
        copy = None
        if cow:
            copy = (pages[-1], new_pages[0])
            pages[-1] = new_pages[0]
        pages.extend(new_pages[1:] if cow else new_pages)
        return AppendPlan(key, tuple(pages), tuple(new_pages), copy, state.seq_len, n_tokens)

    def _commit_append(self, plan: AppendPlan) -> None:
        """The written plan becomes the stream's content (a copied tail page drops this stream's reference)."""
        state = self._live(plan.key)
        assert state.seq_len == plan.start, "the stream changed between reserve and commit"
        if plan.copy is not None:
            self.allocator.free([plan.copy[0]])
        state.pages = list(plan.pages)
        state.seq_len += plan.n
        state.prefix_epoch = next(self._epoch_clock)

    # protection and release

    @locked
    def protect_prefix(self, key: StreamKey, n_tokens: int) -> None:
        """Mark the first ``n_tokens`` as never releasable (the text prompt); set once per stream."""
        check_int("n_tokens", n_tokens, 0)
        state = self._live(key)
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

    @locked
    def release_oldest(self, key: StreamKey, n_tokens: int) -> int:
        """Free whole pages from the front of the unprotected part, at most ``n_tokens`` tokens. Page-floored: the
        page straddling the protected boundary and a partially filled tail page are never freed. Returns the
        tokens actually released; callers re-offer the shortfall later."""
        check_int("n_tokens", n_tokens, 0)
        state = self._live(key)
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

    @locked
    def apply_retention(self, key: StreamKey, policy: RetentionPolicy | None) -> int:
        """Release what ``policy`` says is past the context horizon; ``None`` keeps everything."""
        if policy is None:
            return 0
        state = self._live(key)
        if policy.protected_tokens != state.protected_prefix_tokens:
            raise ValueError(f"RetentionPolicy.protected_tokens={policy.protected_tokens} but KV stream {key} "
                             f"protects {state.protected_prefix_tokens}; call protect_prefix first")
        n = policy.tokens_to_release(state.seq_len)
        return self.release_oldest(key, n) if n > 0 else 0

    # forks

    @locked
    def fork(self, src_key: StreamKey, dst_key: StreamKey) -> None:
        """Create ``dst_key`` sharing every committed page of ``src_key`` by reference (zero copy)."""
        src = self._live(src_key)
        check_stream_key(dst_key)
        if dst_key in self._streams:
            raise ValueError(f"KV stream {dst_key} already exists")
        self._check_not_offloaded(dst_key.session_id)
        self.allocator.share(src.pages)
        self._streams[dst_key] = StreamState(
            pages=list(src.pages), seq_len=src.seq_len, protected_prefix_tokens=src.protected_prefix_tokens,
            released_tokens=src.released_tokens, prefix_epoch=next(self._epoch_clock),
        )

    @locked
    def fork_session(self, src_session_id: str, dst_session_id: str) -> None:
        """Fork every stream of a session under the same labels."""
        keys = self._keys_of(src_session_id)
        if not keys:
            raise KeyError(f"no KV streams for session {src_session_id!r}")
        if self._keys_of(dst_session_id):
            raise ValueError(f"session {dst_session_id!r} already has KV streams")
        for key in keys:
            self._live(key)
        for key in keys:
            self.fork(key, StreamKey(dst_session_id, key.label))

    # staleness

    @locked
    def check_current(self, table: PageTable) -> None:
        """Raise `StaleStreamError` unless ``table`` still describes its stream exactly."""
        check_snapshot(table, self._streams.get(table.key), table.key.session_id in self._parked)

    @locked
    def check_live(self, key: StreamKey) -> None:
        """KeyError when there is no such stream, ValueError when its session is offloaded."""
        self._live(key)

    # parking (`PagedKVCache` moves a whole session between the device and its offload's host pool)

    @locked
    def is_offloaded(self, session_id: str) -> bool:
        return session_id in self._parked

    def parked(self) -> dict[str, dict[StreamKey, StreamState]]:
        """The parked sessions' stream states (copies of the mappings; the states themselves)."""
        return {sid: dict(states) for sid, states in self._parked.items()}

    def _drop_parked(self, session_id: str) -> dict[StreamKey, StreamState]:
        """Forget a parked session (it is being removed); its states, {} when it was not parked."""
        return self._parked.pop(session_id, {})

    def _forget_parked(self, key: StreamKey) -> StreamState:
        """Drop one stream of a parked session and return its state (the session's last one unparks it)."""
        states = self._parked.get(key.session_id, {})
        if key not in states:
            raise KeyError(f"no KV stream {key}; create_stream first")
        if len(states) == 1:
            del self._parked[key.session_id]
        return states.pop(key)

    def _detach(self, session_id: str) -> dict[StreamKey, StreamState]:
        """Take every stream of a live session out of the table, its device pages freed; the session is
        marked parked (operations on it raise "reload it first") until `_attach`."""
        keys = self._keys_of(session_id)
        if not keys:
            raise KeyError(f"no KV streams for session {session_id!r}")
        self._check_not_offloaded(session_id)
        states = {key: self._streams.pop(key) for key in keys}
        for state in states.values():
            self.allocator.free(state.pages)
        self._parked[session_id] = states
        return states

    def _attach(self, session_id: str, states: dict[StreamKey, StreamState]) -> None:
        """Put a parked session's streams back, on device pages the caller reserved (one reference is
        added per stream use); every stream gets a new epoch."""
        if session_id not in self._parked:
            raise ValueError(f"session {session_id!r} is not offloaded")
        for key, state in states.items():
            self.allocator.share(state.pages)
            state.prefix_epoch = next(self._epoch_clock)
            self._streams[key] = state
        del self._parked[session_id]

    def states(self) -> dict[StreamKey, StreamState]:
        return dict(self._streams)  # every stream's state, for `check_invariants` (a shallow copy of the mapping)

    # private helpers

    def _keys_of(self, session_id: str) -> list[StreamKey]:  # one lookup per label, not a scan of the pool
        return [k for k in (StreamKey(session_id, label) for label in StreamLabel) if k in self._streams]

    def _stream(self, key: StreamKey) -> StreamState:
        state = self._streams.get(key)
        if state is None:
            if key in self._parked.get(key.session_id, ()):
                self._check_not_offloaded(key.session_id)
            raise KeyError(f"no KV stream {key}; create_stream first")
        return state

    def _live(self, key: StreamKey) -> StreamState:
        state = self._streams.get(key)  # a parked session's streams are never in ``_streams``
        return state if state is not None else self._stream(key)  # raises: parked, or no such stream

    def _check_not_offloaded(self, session_id: str) -> None:
        if session_id in self._parked:
            raise ValueError(f"session {session_id!r} is offloaded to CPU; reload it first")

    def _pages_needed(self, state: StreamState, n: int) -> tuple[int, bool]:
        """Pages to reserve for ``n`` more tokens, and whether the tail page must be copied first."""
        fill = state.seq_len % self.page_size
        room = self.page_size - fill if fill else 0
        new_pages = self.pages_for(max(0, n - room))
        cow = n > 0 and fill > 0 and self.allocator.ref_counts[state.pages[-1]] > 1
        return new_pages + int(cow), cow
