"""The paged KV cache: one K/V tensor shared by many streams, and the lifecycle rules of a stream.

Layout: ``kv[layer, page, 0 | 1, slot, kv_head, dim]`` (flashinfer's NHD paged layout per layer).
A stream's token ``i`` lives at ``pages[i // page_size]``, slot ``i % page_size``; every page of a
stream but the last is full, so releases and forks only ever move whole pages.

Epochs: every change of a stream's committed content (append, release, reload, and the creation of
a stream, fork targets included) sets ``prefix_epoch`` to the next value of one pool-wide clock.
Epochs therefore only grow, a fork's stream starts at an epoch above its source's, and an epoch is
never reused, even by a stream removed and created again under the same key, so an epoch names one
content version and caches keyed by it cannot alias.

Thread safety: every public method holds one re-entrant lock.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from worldstep.engine.kv.allocator import PageAllocator
from worldstep.engine.kv.cpu_pool import CpuPagePool
from worldstep.engine.kv.errors import StaleStreamError
from worldstep.engine.kv.stream import PageTable, StreamKey, StreamState

if TYPE_CHECKING:
    from worldstep.engine.windowing import RetentionPolicy


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class PagedAllocationManager:
    """Streams keyed ``(session_id, label)`` over one page pool, with CPU offload and forks."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        cpu_offload_pages: int = 0,
    ) -> None:
        self.num_layers = _check_count("num_layers", num_layers, 1)
        self.page_size = _check_count("page_size", page_size, 1)
        self.num_kv_heads = _check_count("num_kv_heads", num_kv_heads, 1)
        self.head_dim = _check_count("head_dim", head_dim, 1)
        _check_count("num_pages", num_pages, 1)
        _check_count("cpu_offload_pages", cpu_offload_pages, 0)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.device = torch.device(device)
        page_shape = (num_layers, 2, page_size, num_kv_heads, head_dim)
        self.kv = torch.zeros(num_layers, num_pages, *page_shape[1:], dtype=dtype, device=self.device)
        self.allocator = PageAllocator(num_pages)
        self.cpu_pool = CpuPagePool(
            cpu_offload_pages, page_shape, dtype, pin_memory=self.device.type == "cuda"
        )
        self._streams: dict[StreamKey, StreamState] = {}
        self._offloaded: set[str] = set()
        self._epoch_clock = itertools.count(1)
        self._lock = threading.RLock()

    # stats

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free

    @property
    def num_used_pages(self) -> int:
        return self.allocator.num_used

    @property
    def num_free_cpu_pages(self) -> int:
        return self.cpu_pool.allocator.num_free

    def pages_in_use(self, session_id: str) -> int:
        """Distinct device pages the session's streams reference (pages shared with a fork count here too)."""
        with self._lock:
            return len({p for key in self._keys_of(session_id) for p in self._streams[key].pages})

    def stream_keys(self, session_id: str | None = None) -> list[StreamKey]:
        with self._lock:
            return list(self._streams) if session_id is None else self._keys_of(session_id)

    # stream lifecycle

    def create_stream(self, key: StreamKey) -> None:
        with self._lock:
            self._check_key(key)
            if key in self._streams:
                raise ValueError(f"KV stream {key!r} already exists")
            self._check_not_offloaded(key[0])
            self._streams[key] = StreamState(prefix_epoch=next(self._epoch_clock))

    def has_stream(self, key: StreamKey) -> bool:
        with self._lock:
            return key in self._streams

    def page_table(self, key: StreamKey) -> PageTable:
        """A frozen snapshot; ``pages`` is empty while the session is offloaded."""
        with self._lock:
            return self._stream(key).table(key)

    def remove(self, key: StreamKey) -> int:
        """Drop a stream; returns how many device pages went back to the free pool.

        Pages still shared with a fork stay in use and are not counted; an offloaded stream returns
        its CPU pages and counts 0 device pages.
        """
        with self._lock:
            state = self._stream(key)
            returned = self.allocator.free(state.pages)
            if state.cpu_pages is not None:
                self.cpu_pool.allocator.free(state.cpu_pages)
            del self._streams[key]
            if not self._keys_of(key[0]):
                self._offloaded.discard(key[0])
            return len(returned)

    def remove_session(self, session_id: str) -> int:
        """Drop every stream of a session (idempotent); returns device pages returned to the pool."""
        with self._lock:
            returned = sum(self.remove(key) for key in self._keys_of(session_id))
            self._offloaded.discard(session_id)
            return returned

    # append and read

    def can_append(self, key: StreamKey, n_tokens: int) -> bool:
        with self._lock:
            needed, _ = self._pages_needed(self._live(key), _check_count("n_tokens", n_tokens, 0))
            return self.allocator.can_allocate(needed)

    def append(self, key: StreamKey, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append ``n`` tokens for all layers at once; ``k``, ``v``: ``[layers, n, kv_heads, head_dim]``.

        Atomic: every page is reserved before anything is written, so `KVPoolExhausted` leaves the
        stream and the pool as they were. A partially filled tail page shared with a fork is copied
        first (copy-on-write), so appending to one stream never changes the other.
        """
        with self._lock:
            state = self._live(key)
            k, v = self._check_kv(k, v)
            n = k.shape[1]
            if n == 0:
                return
            needed, cow = self._pages_needed(state, n)
            new_pages = self.allocator.allocate(needed)
            pages = list(state.pages)
            try:
                if cow:
                    pages[-1] = self._copy_page(pages[-1], new_pages[0])
                pages.extend(new_pages[1:] if cow else new_pages)
                self._write(pages, state.seq_len, k, v)
            except BaseException:
                self.allocator.free(new_pages)
                raise
            if cow:
                self.allocator.free([state.pages[-1]])
            state.pages = pages
            state.seq_len += n
            state.prefix_epoch = next(self._epoch_clock)

    def gather(self, key: StreamKey, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of one layer's committed K and V, each ``[seq_len, kv_heads, head_dim]``."""
        with self._lock:
            state = self._live(key)
            return self._gather_pages(state.pages, state.seq_len, layer, None, None)

    def gather_table(
        self,
        table: PageTable,
        layer: int,
        out_k: torch.Tensor | None = None,
        out_v: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Like `gather`, for the stream as ``table`` saw it, into ``out_k``/``out_v`` when given.

        Raises `StaleStreamError` when the stream changed since ``table`` was taken, so a consumer
        holding a snapshot never reads pages that now hold other tokens.
        """
        with self._lock:
            self.check_current(table)
            return self._gather_pages(list(table.pages), table.seq_len, layer, out_k, out_v)

    def check_current(self, table: PageTable) -> None:
        """Raise `StaleStreamError` unless ``table`` still describes its stream exactly."""
        with self._lock:
            state = self._streams.get(table.key)
            if state is None:
                raise StaleStreamError(f"KV stream {table.key!r} was removed since this page table")
            if table.key[0] in self._offloaded:
                raise StaleStreamError(f"KV stream {table.key!r} is offloaded; reload it first")
            if state.released_tokens != table.released_tokens:
                raise StaleStreamError(
                    f"KV stream {table.key!r} was compacted: {state.released_tokens} tokens released, "
                    f"the page table saw {table.released_tokens}; take a fresh page_table()"
                )
            if state.prefix_epoch != table.prefix_epoch:
                raise StaleStreamError(
                    f"KV stream {table.key!r} changed (epoch {state.prefix_epoch}, page table has "
                    f"{table.prefix_epoch}); take a fresh page_table()"
                )

    # protection and release

    def protect_prefix(self, key: StreamKey, n_tokens: int) -> None:
        """Mark the first ``n_tokens`` as never releasable (the text prompt); set once per stream."""
        with self._lock:
            _check_count("n_tokens", n_tokens, 0)
            state = self._live(key)
            if n_tokens == state.protected_prefix_tokens:
                return
            if state.released_tokens:
                raise ValueError(
                    f"cannot protect a prefix of KV stream {key!r} after {state.released_tokens} "
                    "tokens were released: the head it would protect is gone"
                )
            if state.protected_prefix_tokens:
                raise ValueError(
                    f"KV stream {key!r} already protects {state.protected_prefix_tokens} tokens; "
                    f"cannot change it to {n_tokens}"
                )
            if n_tokens > state.seq_len:
                raise ValueError(f"n_tokens={n_tokens} exceeds the stream's seq_len={state.seq_len}")
            state.protected_prefix_tokens = n_tokens

    def release_oldest(self, key: StreamKey, n_tokens: int) -> int:
        """Free whole pages from the front of the unprotected part, at most ``n_tokens`` tokens.

        Page-floored: the page straddling the protected boundary and a partially filled tail page are
        never freed. Returns the tokens actually released; callers re-offer the shortfall later.
        """
        with self._lock:
            _check_count("n_tokens", n_tokens, 0)
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

    def apply_retention(self, key: StreamKey, policy: RetentionPolicy | None) -> int:
        """Release what ``policy`` says is past the context horizon; ``None`` keeps everything."""
        if policy is None:
            return 0
        with self._lock:
            state = self._live(key)
            if policy.protected_tokens != state.protected_prefix_tokens:
                raise ValueError(
                    f"RetentionPolicy.protected_tokens={policy.protected_tokens} but KV stream {key!r} "
                    f"protects {state.protected_prefix_tokens}; call protect_prefix first"
                )
            n = policy.tokens_to_release(state.seq_len)
            return self.release_oldest(key, n) if n > 0 else 0

    # forks

    def fork(self, src_key: StreamKey, dst_key: StreamKey) -> None:
        """Create ``dst_key`` sharing every committed page of ``src_key`` by reference (zero copy)."""
        with self._lock:
            src = self._live(src_key)
            self._check_key(dst_key)
            if dst_key in self._streams:
                raise ValueError(f"KV stream {dst_key!r} already exists")
            self._check_not_offloaded(dst_key[0])
            self.allocator.share(src.pages)
            self._streams[dst_key] = StreamState(
                pages=list(src.pages),
                seq_len=src.seq_len,
                protected_prefix_tokens=src.protected_prefix_tokens,
                released_tokens=src.released_tokens,
                prefix_epoch=next(self._epoch_clock),
            )

    def fork_session(self, src_session_id: str, dst_session_id: str) -> None:
        """Fork every stream of a session under the same labels."""
        with self._lock:
            keys = self._keys_of(src_session_id)
            if not keys:
                raise KeyError(f"no KV streams for session {src_session_id!r}")
            if self._keys_of(dst_session_id):
                raise ValueError(f"session {dst_session_id!r} already has KV streams")
            for sid, label in keys:
                self._live((sid, label))
            for _, label in keys:
                self.fork((src_session_id, label), (dst_session_id, label))

    # CPU offload

    def is_offloaded(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._offloaded

    def offload(self, session_id: str) -> bool:
        """Move a session's pages to the CPU pool; False (and nothing freed) when they do not fit.

        Pages shared with another session (a fork) are copied and only this session's references
        are dropped, so the other session keeps reading them; pages shared between streams of this
        session are saved once. Reload allocates fresh device pages.
        """
        with self._lock:
            keys = self._session_to_move(session_id)
            unique = list(dict.fromkeys(p for key in keys for p in self._streams[key].pages))
            if not self.cpu_pool.allocator.can_allocate(len(unique)):
                return False
            mapping = dict(zip(unique, self.cpu_pool.save(self.kv, unique)))
            self._rehome(keys, mapping, to_cpu=True)
            self._offloaded.add(session_id)
            return True

    def reload(self, session_id: str) -> None:
        """Bring an offloaded session back onto fresh device pages; bumps every stream's epoch.

        Raises `KVPoolExhausted` (the session stays offloaded, intact) when the pool is short.
        """
        with self._lock:
            if session_id not in self._offloaded:
                raise ValueError(f"session {session_id!r} is not offloaded")
            keys = self._keys_of(session_id)
            unique = list(dict.fromkeys(p for key in keys for p in self._streams[key].cpu_pages or ()))
            device_pages = self.allocator.allocate(len(unique))
            self.cpu_pool.load(self.kv, unique, device_pages)
            self._rehome(keys, dict(zip(unique, device_pages)), to_cpu=False)
            self._offloaded.discard(session_id)

    # invariants

    def check_invariants(self) -> None:
        """Raise AssertionError if the pools and streams disagree (tests and debugging)."""
        with self._lock:
            _check_pool(self.allocator, (s.pages for s in self._streams.values()))
            _check_pool(self.cpu_pool.allocator, (s.cpu_pages or () for s in self._streams.values()))
            for key, state in self._streams.items():
                on_cpu = key[0] in self._offloaded
                pages = state.cpu_pages if on_cpu else state.pages
                held_pages = -(-state.seq_len // self.page_size)
                misplaced = bool(state.pages) if on_cpu else state.cpu_pages is not None
                if pages is None or len(pages) != held_pages or misplaced:
                    raise AssertionError(f"{key!r}: {state} does not match seq_len {state.seq_len}")
                if not 0 <= state.protected_prefix_tokens <= state.seq_len:
                    raise AssertionError(f"{key!r}: protected prefix exceeds seq_len: {state}")

    # private helpers

    def _keys_of(self, session_id: str) -> list[StreamKey]:
        return [key for key in self._streams if key[0] == session_id]

    def _stream(self, key: StreamKey) -> StreamState:
        state = self._streams.get(key)
        if state is None:
            raise KeyError(f"no KV stream {key!r}; create_stream first")
        return state

    def _live(self, key: StreamKey) -> StreamState:
        state = self._stream(key)
        self._check_not_offloaded(key[0])
        return state

    def _check_not_offloaded(self, session_id: str) -> None:
        if session_id in self._offloaded:
            raise ValueError(f"session {session_id!r} is offloaded to CPU; reload it first")

    @staticmethod
    def _check_key(key: StreamKey) -> None:
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(p, str) and p for p in key)):
            raise ValueError(f"a KV stream key is (session_id, label), two non-empty str; got {key!r}")

    def _session_to_move(self, session_id: str) -> list[StreamKey]:
        keys = self._keys_of(session_id)
        if not keys:
            raise KeyError(f"no KV streams for session {session_id!r}")
        self._check_not_offloaded(session_id)
        return keys

    def _rehome(self, keys: list[StreamKey], mapping: dict[int, int], *, to_cpu: bool) -> None:
        """Point each stream at its pages' new home, one reference per stream use, and free the old ones."""
        src_pool, dst_pool = (
            (self.allocator, self.cpu_pool.allocator) if to_cpu else (self.cpu_pool.allocator, self.allocator)
        )
        for key in keys:
            state = self._streams[key]
            old = state.pages if to_cpu else state.cpu_pages or []
            new = [mapping[p] for p in old]
            dst_pool.share(new)
            src_pool.free(old)
            state.pages, state.cpu_pages = ([], new) if to_cpu else (new, None)
            if not to_cpu:
                state.prefix_epoch = next(self._epoch_clock)
        dst_pool.free(mapping.values())  # drop the allocation's own reference

    def _pages_needed(self, state: StreamState, n: int) -> tuple[int, bool]:
        """Pages to reserve for ``n`` more tokens, and whether the tail page must be copied first."""
        fill = state.seq_len % self.page_size
        room = self.page_size - fill if fill else 0
        new_pages = -(-max(0, n - room) // self.page_size)
        cow = n > 0 and fill > 0 and self.allocator.ref_count(state.pages[-1]) > 1
        return new_pages + int(cow), cow

    def _copy_page(self, src: int, dst: int) -> int:
        self.kv[:, dst] = self.kv[:, src]
        return dst

    def _write(self, pages: list[int], start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        pos = torch.arange(start, start + k.shape[1], device=self.device)  # [n]
        page_ids = torch.tensor(pages, dtype=torch.long, device=self.device)[pos // self.page_size]  # [n]
        slots = pos % self.page_size  # [n]
        self.kv[:, page_ids, 0, slots] = k  # [L, n, Hkv, D]
        self.kv[:, page_ids, 1, slots] = v

    def _check_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        expected = (self.num_layers, self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.ndim != 4 or (t.shape[0], *t.shape[2:]) != expected:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} must be [layers={expected[0]}, n, kv_heads={expected[1]}, "
                    f"head_dim={expected[2]}], got {shape}"
                )
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
        return k.to(self.device, self.kv.dtype), v.to(self.device, self.kv.dtype)

    def _gather_pages(
        self,
        pages: list[int],
        seq_len: int,
        layer: int,
        out_k: torch.Tensor | None,
        out_v: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        idx = torch.tensor(pages, dtype=torch.long, device=self.device)
        blocks = self.kv[layer, idx]  # [P, 2, page_size, Hkv, D]
        k = blocks[:, 0].reshape(-1, self.num_kv_heads, self.head_dim)[:seq_len]  # [S, Hkv, D]
        v = blocks[:, 1].reshape(-1, self.num_kv_heads, self.head_dim)[:seq_len]  # [S, Hkv, D]
        if out_k is None or out_v is None:
            return k, v
        out_k[:seq_len].copy_(k)
        out_v[:seq_len].copy_(v)
        return out_k[:seq_len], out_v[:seq_len]


def _check_pool(allocator: PageAllocator, stream_pages: Iterable[Iterable[int]]) -> None:
    """Free and used partition the ids, and each ref count equals the streams' references."""
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
