"""`PagedKVCache`: the one K/V tensor many streams share, over the `StreamTable` it is, and the CPU offload.

Layout: ``kv[layer, page, 0 | 1, slot, kv_head, dim]`` (flashinfer's NHD paged layout per layer). As a
`StreamTable` the cache knows which pages hold which stream's tokens, parked sessions' included; its `Offload`
(``offload``) is the host page pool they are parked in. This class adds what needs the tensor: appends (atomic,
copy-on-write of a tail page shared with a fork), gathers, and moving sessions to the host pool and back. It is
the one API over the pool for code outside ``engine/kv``, which never reads ``offload``. One lock (``lock``,
re-entrant) covers the table, the tensor and the offload: every public method holds it across what it reads and
writes.
"""

from __future__ import annotations

import dataclasses

import torch

from ..checks import check_int
from ..devices import canonical_device
from .locking import locked
from .offload import Offload
from .stream import PageTable, StreamKey, check_stream_key
from .table import StreamTable


class PagedKVCache(StreamTable):
    """A page pool of ``num_pages`` pages of ``page_size`` tokens for every layer, plus ``cpu_offload_pages``
    host pages for offloaded sessions."""

    def __init__(self, *, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 cpu_offload_pages: int = 0) -> None:
        self.num_layers = check_int("num_layers", num_layers, 1)
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1)
        self.head_dim = check_int("head_dim", head_dim, 1)
        super().__init__(num_pages, page_size)
        check_int("cpu_offload_pages", cpu_offload_pages, 0)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype!r} is invalid; allowed: a floating torch.dtype")
        self.device = canonical_device(device)
        self.kv = torch.zeros(num_layers, num_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype,
                              device=self.device)
        self.offload = Offload(self.kv, cpu_offload_pages)

    # the pools

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    @property
    def num_cpu_pages(self) -> int:
        """Host pages for offloaded sessions (0: no CPU pool)."""
        return self.offload.allocator.num_pages

    @property
    def num_free_cpu_pages(self) -> int:
        return self.offload.allocator.num_free

    @locked
    def held_pages(self, session_id: str) -> int:
        """Device pages the session's streams need (when offloaded: to come back)."""
        return sum(self.pages_for(self.page_table(key).seq_len) for key in self.stream_keys(session_id))

    # streams, offloaded ones included

    @locked
    def stream_keys(self, session_id: str | None = None) -> list[StreamKey]:
        """Every stream of the pool (or of one session), offloaded ones included."""
        parked = [k for sid, states in self.parked().items() for k in states if session_id is None or sid == session_id]
        return super().stream_keys(session_id) + parked

    @locked
    def remove(self, key: StreamKey) -> int:
        """Drop one stream, offloaded or not; returns device pages that went back to the free pool."""
        if self.is_offloaded(check_stream_key(key).session_id):
            self.offload.allocator.free(self._forget_parked(key).cpu_pages or ())
            return 0
        return super().remove(key)

    @locked
    def remove_session(self, session_id: str) -> int:
        """Drop every stream of a session, offloaded or not (idempotent); returns device pages freed."""
        for state in self._drop_parked(session_id).values():
            self.offload.allocator.free(state.cpu_pages or ())
        return super().remove_session(session_id)

    # offload

    @locked
    def offload_session(self, session_id: str) -> bool:
        """Park the session in the CPU pool; False (nothing freed) when it does not fit there.

        Pages shared with another session (a fork) are copied and only this session's references are dropped,
        so the other session keeps reading them; pages shared between streams of this session are saved once.
        """
        if self.is_offloaded(session_id):
            raise ValueError(f"session {session_id!r} is offloaded to CPU already; reload it first")
        keys = super().stream_keys(session_id)
        if not keys:
            raise KeyError(f"no KV streams for session {session_id!r}")
        device = list(dict.fromkeys(p for key in keys for p in self.page_table(key).pages))
        host = self.offload.save(device)
        if host is None:
            return False
        on_host = dict(zip(device, host))
        for state in self._detach(session_id).values():
            state.cpu_pages, state.pages = [on_host[p] for p in state.pages], []
            self.offload.allocator.share(state.cpu_pages)
        self.offload.allocator.free(host)  # the streams hold their own references now
        return True

    @locked
    def reload_session(self, session_id: str) -> None:
        """Bring a parked session back onto fresh device pages, every stream at a new epoch, or raise
        `KVPoolExhausted` (it stays parked, intact)."""
        states = self.parked().get(session_id)
        if states is None:
            raise ValueError(f"session {session_id!r} is not offloaded")
        host = list(dict.fromkeys(p for s in states.values() for p in s.cpu_pages or ()))
        device = self.allocator.allocate(len(host))
        self.offload.restore(host, device)
        on_device = dict(zip(host, device))
        self._attach(session_id, {key: dataclasses.replace(s, pages=[on_device[p] for p in s.cpu_pages or ()],
                                                           cpu_pages=None) for key, s in states.items()})
        self.allocator.free(device)  # the streams hold their own references now
        for s in states.values():
            self.offload.allocator.free(s.cpu_pages or ())

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
            plan = self._reserve_append(key, k.shape[1])
            try:
                if plan.copy is not None:
                    self.kv[:, plan.copy[1]] = self.kv[:, plan.copy[0]]
                pos = torch.arange(plan.start, plan.start + plan.n, device=self.device)  # [n]
                pages = torch.tensor(plan.pages, dtype=torch.long, device=self.device)[pos // self.page_size]
                slots = pos % self.page_size  # [n]
                self.kv[:, pages, 0, slots] = k  # [L, n, Hkv, D]
                self.kv[:, pages, 1, slots] = v
            except BaseException:
                self.allocator.free(plan.new_pages)  # the reservation goes back
                raise
            self._commit_append(plan)

    def gather(self, key: StreamKey, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of one layer's committed K and V, each ``[seq_len, kv_heads, head_dim]``."""
        with self.lock:
            self.check_live(key)
            table = self.page_table(key)
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
