"""CPU offload: the host page pool parked sessions live in, laid out like the device pool.

Which session to offload is the scheduler's choice, and the parked sessions' stream states stay in the cache's
table (their one record); this module holds the host pages and copies them. Copies are synchronous, so a device
page can be reused as soon as `save` returns. Not thread-safe by itself: `PagedKVCache`, its one owner, calls it
under its lock.
"""

from __future__ import annotations

import torch

from .allocator import PageAllocator


class Offload:
    """``num_pages`` host pages laid out like the device pool ``device_kv``."""

    def __init__(self, device_kv: torch.Tensor, num_pages: int) -> None:
        self.device_kv = device_kv  # [layers, pages, 2, page_size, kv_heads, head_dim]
        self.allocator = PageAllocator(num_pages, name="CPU offload page pool")
        layers, _, *page = device_kv.shape
        self.host_kv = torch.zeros(layers, num_pages, *page, dtype=device_kv.dtype,
                                   pin_memory=device_kv.device.type == "cuda")

    def save(self, device_pages: list[int]) -> list[int] | None:
        """Copy ``device_pages`` into as many new host pages (each holding one reference), or None when they do
        not fit."""
        if not self.allocator.can_allocate(len(device_pages)):
            return None
        host = self.allocator.allocate(len(device_pages))
        if host:
            self.host_kv[:, host] = self.device_kv[:, device_pages].cpu()
        return host

    def restore(self, host_pages: list[int], device_pages: list[int]) -> None:
        """Copy ``host_pages`` back into ``device_pages`` (pairwise); the host pages keep their references."""
        if host_pages:
            self.device_kv[:, device_pages] = self.host_kv[:, host_pages].to(self.device_kv.device)
