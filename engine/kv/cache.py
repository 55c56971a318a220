"""`PagedKVCache`: the one K/V tensor many streams share, and the only API over its table and offload.

Layout: ``kv[layer, page, 0 | 1, slot, kv_head, dim]`` (flashinfer's NHD paged layout per layer). The
`StreamTable` (``table``) says which pages hold which stream's tokens; `Offload` (``offload``) parks whole
sessions in host memory. This class does what needs the tensor: appends (atomic, copy-on-write of a tail
page shared with a fork) and gathers; and it is the one door to the bookkeeping for code outside
``engine/kv`` (pool counts, streams, prefixes, retention, forks, offload), which never reads ``table`` or
``offload`` itself. It owns the one lock over all three: the table and the offload are not thread-safe by
themselves, and every public method here holds ``lock`` (re-entrant) across what it reads and writes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch
from worldstep.engine.checks import check_int
from worldstep.engine.kv.offload import Offload
from worldstep.engine.kv.stream import PageTable, StreamKey, check_stream_key
from worldstep.engine.kv.table import StreamTable

if TYPE_CHECKING:
    from worldstep.engine.windowing import RetentionPolicy


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
        self.lock = threading.RLock()  # the one lock over the tensor, the table and the offload (re-entrant)
        check_int("cpu_offload_pages", cpu_offload_pages, 0)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype!r} is invalid; allowed: a floating torch.dtype")
        self.device = torch.device(device)
        self.kv = torch.zeros(num_layers, num_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype,
                              device=self.device)
        self.offload = Offload(self.table, self.kv, cpu_offload_pages)

    @property
    def page_size(self) -> int:
        return self.table.page_size

    # the pools

    @property
    def num_pages(self) -> int:
        return self.table.allocator.num_pages

    @property
    def num_free_pages(self) -> int:
        with self.lock:
            return self.table.num_free_pages

    @property
    def num_used_pages(self) -> int:
        with self.lock:
            return self.table.num_used_pages

    @property
    def num_cpu_pages(self) -> int:
        """Host pages for offloaded sessions (0: no CPU pool)."""
        return self.offload.allocator.num_pages

    @property
    def num_free_cpu_pages(self) -> int:
        with self.lock:
            return self.offload.num_free_pages

    def pages_for(self, tokens: int) -> int:
        """Pages ``tokens`` tokens of one stream fill."""
        return self.table.pages_for(tokens)

    def pages_in_use(self, session_id: str) -> int:
        with self.lock:
            return self.table.pages_in_use(session_id)

    def held_pages(self, session_id: str) -> int:
        """Device pages the session's streams need (when offloaded: to come back)."""
        with self.lock:
            return sum(self.pages_for(self.page_table(key).seq_len) for key in self.stream_keys(session_id))

    # streams

    def create_stream(self, key: StreamKey) -> None:
        with self.lock:
            self.table.create_stream(key)

    def protect_prefix(self, key: StreamKey, n_tokens: int) -> None:
        with self.lock:
            self.table.protect_prefix(key, n_tokens)

    def apply_retention(self, key: StreamKey, policy: RetentionPolicy | None) -> int:
        """Release what ``policy`` says is past the context horizon; returns tokens released."""
        with self.lock:
            return self.table.apply_retention(key, policy)

    def fork_session(self, src_session_id: str, dst_session_id: str) -> None:
        """Every stream of ``src_session_id`` shared (pages by reference) under ``dst_session_id``."""
        with self.lock:
            self.table.fork_session(src_session_id, dst_session_id)

    def check_current(self, table: PageTable) -> None:
        """Raise `StaleStreamError` unless ``table`` still describes its stream exactly."""
        with self.lock:
            self.table.check_current(table)

    # offload

    def is_offloaded(self, session_id: str) -> bool:
        with self.lock:
            return self.table.is_offloaded(session_id)

    def offload_session(self, session_id: str) -> bool:
        """Park the session in the CPU pool; False (nothing freed) when it does not fit there."""
        with self.lock:
            return self.offload.offload(session_id)

    def reload_session(self, session_id: str) -> None:
        """Bring a parked session back onto device pages, or raise `KVPoolExhausted` (it stays parked)."""
        with self.lock:
            self.offload.reload(session_id)

    def page_table(self, key: StreamKey) -> PageTable:
        """A frozen snapshot of a stream; while its session is offloaded, ``pages`` is empty."""
        check_stream_key(key)
        with self.lock:
            return self.table.page_table(key)

    def stream_keys(self, session_id: str | None = None) -> list[StreamKey]:
        """Every stream of the pool (or of one session), offloaded ones included."""
        with self.lock:
            parked = [k for sid, states in self.offload.parked().items() for k in states
                      if session_id is None or sid == session_id]
            return self.table.stream_keys(session_id) + parked

    def remove(self, key: StreamKey) -> int:
        """Drop one stream, offloaded or not; returns device pages that went back to the free pool."""
        check_stream_key(key)
        with self.lock:
            if self.table.is_offloaded(key.session_id):
                self.offload.remove_stream(key)
                return 0
            return self.table.remove(key)

    def remove_session(self, session_id: str) -> int:
        """Drop every stream of a session, offloaded or not (idempotent); returns device pages freed."""
        with self.lock:
            self.offload.discard(session_id)
            return self.table.remove_session(session_id)

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
            plan = self.table.reserve_append(key, k.shape[1])
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

    def gather(self, key: StreamKey, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of one layer's committed K and V, each ``[seq_len, kv_heads, head_dim]``."""
        with self.lock:
            self.table.check_live(key)
            table = self.table.page_table(key)
            return self._gather_pages(table.pages, table.seq_len, layer, None, None)

    def gather_table(self, table: PageTable, layer: int, out_k: torch.Tensor | None = None,
                     out_v: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like `gather`, for the stream as ``table`` saw it, into ``out_k``/``out_v`` when given.

        Raises `StaleStreamError` when the stream changed since ``table`` was taken, so a consumer holding
        a snapshot never reads pages that now hold other tokens.
        """
        with self.lock:
            self.table.check_current(table)
            return self._gather_pages(table.pages, table.seq_len, layer, out_k, out_v)

    # private helpers

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
