"""`PagedKVCache`: the one K/V tensor many streams share, the `StreamTable` that says which pages hold which
stream, and the `Offload` that parks whole sessions on host pages.

Layout: ``kv[layer, page, 0 | 1, slot, kv_head, dim]`` (flashinfer's NHD paged layout per layer). The cache
holds its two parts and coordinates them: its table (``table``) keeps the live streams' page ids, its offload
(``offload``) the parked sessions and their host pages; a stream lives in exactly one of them. The cache adds
what needs the tensor: appends (atomic, copy-on-write of a tail page shared with a fork), gathers, and moving
sessions between the parts. It is the one API over the pool for code outside ``engine/kv``, which reads neither
part. One lock (``lock``, re-entrant) covers both parts and the tensor: every public method holds it across
what it reads and writes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from ..checks import check_int
from ..devices import canonical_device
from .allocator import PageAllocator
from .errors import StaleStreamError
from .offload import Offload
from .stream import PageTable, StreamKey, check_stream_key
from .table import StreamTable

if TYPE_CHECKING:
    from ..windowing import RetentionPolicy

F = TypeVar("F", bound=Callable)


def locked(method: F) -> F:
    """``method`` run while holding ``self.lock`` (re-entrant: a locked method may call another)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


class PagedKVCache:
    """A page pool of ``num_pages`` pages of ``page_size`` tokens for every layer, plus ``cpu_offload_pages``
    host pages for offloaded sessions."""

    def __init__(self, *, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 cpu_offload_pages: int = 0) -> None:
        self.num_layers = check_int("num_layers", num_layers, 1)
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1)
        self.head_dim = check_int("head_dim", head_dim, 1)
        self.table = StreamTable(num_pages, page_size)
        check_int("cpu_offload_pages", cpu_offload_pages, 0)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype!r} is invalid; allowed: a floating torch.dtype")
        self.device = canonical_device(device)
        self.kv = torch.zeros(num_layers, num_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype,
                              device=self.device)
        self.offload = Offload(self.kv, cpu_offload_pages)
        self.lock = threading.RLock()  # the one lock over the table, the offload and the tensor
        self.page_size = self.table.page_size  # tokens per page, fixed for the pool's life
        self.pages_for = self.table.pages_for  # pages ``tokens`` tokens take (arithmetic: the table's own method)

    # the pools

    @property
    def allocator(self) -> PageAllocator:
        """The device pool's page ids (read-only use: tests and stats)."""
        return self.table.allocator

    @property
    def num_pages(self) -> int:
        return self.table.allocator.num_pages

    @property
    def num_free_pages(self) -> int:
        return self.table.num_free_pages

    @property
    def num_used_pages(self) -> int:
        return self.table.num_used_pages

    @property
    def num_cpu_pages(self) -> int:
        """Host pages for offloaded sessions (0: no CPU pool)."""
        return self.offload.allocator.num_pages

    @property
    def num_free_cpu_pages(self) -> int:
        return self.offload.allocator.num_free

    @locked
    def pages_in_use(self, session_id: str) -> int:
        """Distinct device pages the session's streams reference (0 while offloaded; shared pages count too)."""
        return len({p for key in self.table.stream_keys(session_id) for p in self.table.page_table(key).pages})

    @locked
    def held_pages(self, session_id: str) -> int:
        """Device pages the session's streams need (when offloaded: to come back)."""
        return sum(self.pages_for(self.page_table(key).seq_len) for key in self.stream_keys(session_id))

    # streams, offloaded ones included

    @locked
    def stream_keys(self, session_id: str | None = None) -> list[StreamKey]:
        """Every stream of the pool (or of one session), offloaded ones included."""
        return self.table.stream_keys(session_id) + self.offload.stream_keys(session_id)

    @locked
    def page_table(self, key: StreamKey) -> PageTable:
        """A frozen snapshot; ``pages`` is empty while the session is offloaded."""
        if check_stream_key(key).session_id in self.offload.parked:
            return self.offload.page_table(key)
        return self.table.page_table(key)

    @locked
    def create_stream(self, key: StreamKey) -> None:
        self.table.create_stream(self._live(key))

    @locked
    def remove(self, key: StreamKey) -> int:
        """Drop one stream, offloaded or not; returns device pages that went back to the free pool."""
        if check_stream_key(key).session_id in self.offload.parked:
            self.offload.forget(key)
            return 0
        return self.table.remove(key)

    @locked
    def remove_session(self, session_id: str) -> int:
        """Drop every stream of a session, offloaded or not (idempotent); returns device pages freed."""
        self.offload.forget_session(session_id)
        return self.table.remove_session(session_id)

    # protection, release, forks, staleness: the table's, for live streams

    @locked
    def protect_prefix(self, key: StreamKey, n_tokens: int) -> None:
        self.table.protect_prefix(self._live(key), n_tokens)

    @locked
    def release_oldest(self, key: StreamKey, n_tokens: int) -> int:
        return self.table.release_oldest(self._live(key), n_tokens)

    @locked
    def apply_retention(self, key: StreamKey, policy: RetentionPolicy | None) -> int:
        return self.table.apply_retention(self._live(key), policy)

    @locked
    def fork(self, src_key: StreamKey, dst_key: StreamKey) -> None:
        self.table.fork(self._live(src_key), self._live(dst_key))

    @locked
    def fork_session(self, src_session_id: str, dst_session_id: str) -> None:
        if dst_session_id in self.offload.parked:
            raise ValueError(f"session {dst_session_id!r} is offloaded to CPU; reload it first")
        self.table.fork_session(src_session_id, dst_session_id)

    @locked
    def check_current(self, table: PageTable) -> None:
        """Raise `StaleStreamError` unless ``table`` still describes its stream exactly."""
        if table.key.session_id in self.offload.parked:
            raise StaleStreamError(f"KV stream {table.key} is offloaded; reload it first")
        self.table.check_current(table)

    @locked
    def check_live(self, key: StreamKey) -> None:
        """KeyError when there is no such stream, ValueError when its session is offloaded."""
        self.table.check_live(self._live(key))

    # offload

    @locked
    def is_offloaded(self, session_id: str) -> bool:
        return session_id in self.offload.parked

    @locked
    def offload_session(self, session_id: str) -> bool:
        """Park the session in the CPU pool; False (nothing freed) when it does not fit there.

        Pages shared with another session (a fork) are copied and only this session's references are dropped,
        so the other session keeps reading them; pages shared between streams of this session are saved once.
        """
        if session_id in self.offload.parked:
            raise ValueError(f"session {session_id!r} is offloaded to CPU already; reload it first")
        keys = self.table.stream_keys(session_id)
        if not keys:
            raise KeyError(f"no KV streams for session {session_id!r}")
        if not self.offload.park(session_id, [self.table.page_table(key) for key in keys]):
            return False
        self.table.remove_session(session_id)
        return True

    @locked
    def reload_session(self, session_id: str) -> None:
        """Bring a parked session back onto fresh device pages, every stream at a new epoch, or raise
        `KVPoolExhausted` (it stays parked, intact)."""
        device = self.table.allocator.allocate(self.offload.device_pages_needed(session_id))
        try:
            states = self.offload.unpark(session_id, device)
        except BaseException:
            self.table.allocator.free(device)
            raise
        for key, state in states.items():
            self.table.restore_stream(key, state)
        self.table.allocator.free(device)  # the streams hold their own references now

    # write and read

    def append(self, key: StreamKey, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append ``n`` tokens for all layers at once; ``k``, ``v``: ``[layers, n, kv_heads, head_dim]``.

        Atomic: every page is reserved before anything is written, so `KVPoolExhausted` or a failed write
        leaves the stream and the pool as they were. A partially filled tail page shared with a fork is
        copied first, so appending to one stream never changes the other.
        """
        k, v = self._check_kv(k, v)
        if k.shape[1] == 0:
            return
        with self.lock:
            plan = self.table.reserve_append(self._live(key), k.shape[1])
            try:
                if plan.copy is not None:
                    self.kv[:, plan.copy[1]] = self.kv[:, plan.copy[0]]
                pos = torch.arange(plan.start, plan.start + plan.n, device=self.device)  # [n]
                pages = torch.tensor(plan.pages, dtype=torch.long, device=self.device)[pos // self.page_size]
                slots = pos % self.page_size  # [n]
                self.kv[:, pages, 0, slots] = k  # [L, n, Hkv, D]
                self.kv[:, pages, 1, slots] = v
            except BaseException:
                self.table.cancel_append(plan)
                raise
            self.table.commit_append(plan)

    @locked
    def can_append(self, key: StreamKey, n_tokens: int) -> bool:
        return self.table.can_append(self._live(key), n_tokens)

    def gather(self, key: StreamKey, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of one layer's committed K and V, each ``[seq_len, kv_heads, head_dim]``."""
        with self.lock:
            table = self.table.page_table(self._live(key))
            return self._gather_pages(table.pages, table.seq_len, layer, None, None)

    def gather_table(self, table: PageTable, layer: int, out_k: torch.Tensor | None = None,
                     out_v: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like `gather`, for the stream as ``table`` saw it, into ``out_k``/``out_v`` when given.

        Raises `StaleStreamError` when the stream changed since ``table`` was taken, so a consumer holding
        a snapshot never reads pages that now hold other tokens.
        """
        with self.lock:
            self.check_current(table)
            return self._gather_pages(table.pages, table.seq_len, layer, out_k, out_v)

    # private helpers

    def _live(self, key: StreamKey) -> StreamKey:
        """``key``, unless its session is parked (ValueError; the table raises KeyError for a stream it lacks)."""
        if check_stream_key(key).session_id in self.offload.parked:
            raise ValueError(f"session {key.session_id!r} is offloaded to CPU; reload it first")
        return key

    def _check_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        expected = (self.num_layers, self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.ndim != 4 or (t.shape[0], *t.shape[2:]) != expected:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}.shape={shape} is invalid; allowed: [layers={expected[0]}, n, "
                                 f"kv_heads={expected[1]}, head_dim={expected[2]}]")
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
        return k.to(self.device, self.kv.dtype), v.to(self.device, self.kv.dtype)

    def _gather_pages(self, pages: tuple[int, ...], seq_len: int, layer: int, out_k: torch.Tensor | None,
                      out_v: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        check_int("layer", layer, 0, self.num_layers)
        idx = torch.tensor(pages, dtype=torch.long, device=self.device)
        blocks = self.kv[layer, idx]  # [P, 2, page_size, Hkv, D]
        k = blocks[:, 0].reshape(-1, self.num_kv_heads, self.head_dim)[:seq_len]  # [S, Hkv, D]
        v = blocks[:, 1].reshape(-1, self.num_kv_heads, self.head_dim)[:seq_len]  # [S, Hkv, D]
        if out_k is None or out_v is None:
            return k, v
        out_k[:seq_len].copy_(k)
        out_v[:seq_len].copy_(v)
        return out_k[:seq_len], out_v[:seq_len]
