"""CPU offload: whole sessions parked in a host page pool, and brought back onto fresh device pages.

Which session to offload is the scheduler's choice; this module only moves pages. Copies are synchronous,
so a device page can be reused as soon as `offload` returns. The parked sessions' stream states stay in the table
(their one record); this module holds the host pool. Not thread-safe by itself: `PagedKVCache`, its one owner,
calls it under its lock, handing itself in as the table.
"""

from __future__ import annotations

import dataclasses

import torch
from worldstep.engine.kv.allocator import PageAllocator
from worldstep.engine.kv.stream import StreamState
from worldstep.engine.kv.table import StreamTable


class Offload:
    """``num_pages`` host pages laid out like the device pool, and the sessions parked in them."""

    def __init__(self, device_kv: torch.Tensor, num_pages: int) -> None:
        self.device_kv = device_kv  # [layers, pages, 2, page_size, kv_heads, head_dim]
        self.allocator = PageAllocator(num_pages, name="CPU offload page pool")
        layers, _, *page = device_kv.shape
        self.host_kv = torch.zeros(layers, num_pages, *page, dtype=device_kv.dtype,
                                   pin_memory=device_kv.device.type == "cuda")

    def offload(self, table: StreamTable, session_id: str) -> bool:
        """Move a session's pages to the host pool; False (and nothing freed) when they do not fit.

        Pages shared with another session (a fork) are copied and only this session's references are
        dropped, so the other session keeps reading them; pages shared between streams of this session are
        saved once.
        """
        if table.is_offloaded(session_id):
            raise ValueError(f"session {session_id!r} is offloaded to CPU already; reload it first")
        keys = table.stream_keys(session_id)
        if not keys:
            raise KeyError(f"no KV streams for session {session_id!r}")
        tables = [table.page_table(key) for key in keys]
        unique = list(dict.fromkeys(p for t in tables for p in t.pages))
        if not self.allocator.can_allocate(len(unique)):
            return False
        host = self.allocator.allocate(len(unique))
        if unique:
            self.host_kv[:, host] = self.device_kv[:, unique].cpu()
        mapping = dict(zip(unique, host))
        states = table.detach(session_id)
        for state in states.values():
            state.cpu_pages = [mapping[p] for p in state.pages]
            state.pages = []
            self.allocator.share(state.cpu_pages)
        self.allocator.free(host)  # drop the allocation's own reference
        return True

    def reload(self, table: StreamTable, session_id: str) -> None:
        """Bring a parked session back onto fresh device pages; every stream gets a new epoch.

        Raises `KVPoolExhausted` (the session stays parked, intact) when the device pool is short.
        """
        states = table.parked().get(session_id)
        if states is None:
            raise ValueError(f"session {session_id!r} is not offloaded")
        unique = list(dict.fromkeys(p for s in states.values() for p in s.cpu_pages or ()))
        device = table.allocator.allocate(len(unique))
        if unique:
            self.device_kv[:, device] = self.host_kv[:, unique].to(self.device_kv.device)
        mapping = dict(zip(unique, device))
        back = {key: dataclasses.replace(s, pages=[mapping[p] for p in s.cpu_pages or ()], cpu_pages=None)
                for key, s in states.items()}
        table.attach(session_id, back)
        table.allocator.free(device)  # the streams hold their own references now
        for s in states.values():
            self.allocator.free(s.cpu_pages or ())

    def free(self, state: StreamState) -> None:
        """Give a parked stream's host pages back (the stream, or its whole session, is being removed)."""
        self.allocator.free(state.cpu_pages or ())
