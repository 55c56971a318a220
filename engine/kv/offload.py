"""CPU offload: the host page pool parked sessions live in, laid out like the device pool, and the record of
what each parked stream held.

Which session to offload is the scheduler's choice; `PagedKVCache` moves a session here (`park`, after which
it drops the streams from its table) and back (`unpark`, onto device pages it reserved). While parked, a
stream's state lives here alone, its ``cpu_pages`` holding one reference each. Copies are synchronous, so a
device page can be reused as soon as `park` returns. Not thread-safe by itself: the cache, its one owner,
calls it under its lock.
"""

from __future__ import annotations

import torch

from .allocator import PageAllocator
from .stream import PageTable, StreamKey, StreamState


class Offload:
    """``num_pages`` host pages laid out like the device pool ``device_kv``, and the sessions parked in them."""

    def __init__(self, device_kv: torch.Tensor, num_pages: int) -> None:
        self.device_kv = device_kv  # [layers, pages, 2, page_size, kv_heads, head_dim]
        self.allocator = PageAllocator(num_pages, name="CPU offload page pool")
        layers, _, *page = device_kv.shape
        self.host_kv = torch.zeros(layers, num_pages, *page, dtype=device_kv.dtype,
                                   pin_memory=device_kv.device.type == "cuda")
        self.parked: dict[str, dict[StreamKey, StreamState]] = {}  # the one record of parked streams (read outside)

    # what is parked

    def stream_keys(self, session_id: str | None = None) -> list[StreamKey]:
        return [k for sid, states in self.parked.items() for k in states if session_id in (None, sid)]

    def page_table(self, key: StreamKey) -> PageTable:
        """The parked stream's snapshot, ``pages`` empty (its tokens are on host pages); KeyError when not parked."""
        state = self.parked.get(key.session_id, {}).get(key)
        if state is None:
            raise KeyError(f"no KV stream {key}; create_stream first")
        return PageTable(key, (), state.seq_len, state.protected_prefix_tokens, state.released_tokens,
                         state.prefix_epoch)

    def states(self) -> dict[StreamKey, StreamState]:
        """Every parked stream's state, for `check_invariants` (a shallow copy of the mapping)."""
        return {k: s for states in self.parked.values() for k, s in states.items()}

    def device_pages_needed(self, session_id: str) -> int:
        """Device pages a parked session takes to come back (pages shared between its streams count once)."""
        return len(self._host_pages(session_id))

    # moving sessions

    def park(self, session_id: str, tables: list[PageTable]) -> bool:
        """Copy the streams ``tables`` describe onto host pages and record them as parked; False (nothing
        copied) when they do not fit. Pages shared between the streams are saved once; the caller then drops
        the streams from the device table."""
        assert tables and session_id not in self.parked, session_id
        device = list(dict.fromkeys(p for t in tables for p in t.pages))
        if not self.allocator.can_allocate(len(device)):
            return False
        host = self.allocator.allocate(len(device))
        if host:
            self.host_kv[:, host] = self.device_kv[:, device].cpu()
        on_host = dict(zip(device, host))
        states = {}
        for t in tables:
            cpu_pages = [on_host[p] for p in t.pages]
            self.allocator.share(cpu_pages)
            states[t.key] = StreamState([], t.seq_len, t.protected_prefix_tokens, t.released_tokens,
                                        t.prefix_epoch, cpu_pages)
        self.allocator.free(host)  # the streams hold their own references now
        self.parked[session_id] = states
        return True

    def unpark(self, session_id: str, device_pages: list[int]) -> dict[StreamKey, StreamState]:
        """Copy a parked session back onto ``device_pages`` (as many as `device_pages_needed`) and forget it; its
        host pages go back to the pool. Returns the streams' states on device pages, for the table to restore."""
        host = self._host_pages(session_id)
        assert len(device_pages) == len(host), (len(device_pages), len(host))
        if host:
            self.device_kv[:, device_pages] = self.host_kv[:, host].to(self.device_kv.device)
        on_device = dict(zip(host, device_pages))
        states = self.parked.pop(session_id)
        for state in states.values():
            cpu_pages = state.cpu_pages or []
            state.pages, state.cpu_pages = [on_device[p] for p in cpu_pages], None
            self.allocator.free(cpu_pages)
        return states

    def forget(self, key: StreamKey) -> None:
        """Drop one parked stream (the session's last one unparks it); KeyError when it is not parked."""
        states = self.parked.get(key.session_id, {})
        if key not in states:
            raise KeyError(f"no KV stream {key}; create_stream first")
        self.allocator.free(states.pop(key).cpu_pages or ())
        if not states:
            del self.parked[key.session_id]

    def forget_session(self, session_id: str) -> None:
        """Drop every parked stream of a session (nothing when it is not parked)."""
        for state in self.parked.pop(session_id, {}).values():
            self.allocator.free(state.cpu_pages or ())

    def _host_pages(self, session_id: str) -> list[int]:
        states = self.parked.get(session_id)
        if states is None:
            raise ValueError(f"session {session_id!r} is not offloaded")
        return list(dict.fromkeys(p for s in states.values() for p in s.cpu_pages or ()))
