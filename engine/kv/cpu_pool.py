"""The CPU page pool that offloaded sessions park their K/V pages in."""

from __future__ import annotations

import torch
from worldstep.engine.kv.allocator import PageAllocator


class CpuPagePool:
    """``num_pages`` host pages laid out like the device pool: ``[layers, pages, 2, page_size, kv_heads, head_dim]``.

    Copies are synchronous, so a device page can be reused as soon as `save` returns.
    """

    def __init__(
        self, num_pages: int, page_shape: tuple[int, ...], dtype: torch.dtype, *, pin_memory: bool
    ) -> None:
        self.allocator = PageAllocator(num_pages, name="CPU offload page pool")
        num_layers, *rest = page_shape
        self.kv = torch.zeros(num_layers, num_pages, *rest, dtype=dtype, pin_memory=pin_memory)

    def save(self, device_kv: torch.Tensor, device_pages: list[int]) -> list[int]:
        """Copy ``device_pages`` (all layers) into freshly allocated host pages; returns their ids."""
        cpu_pages = self.allocator.allocate(len(device_pages))
        if cpu_pages:
            src = torch.tensor(device_pages, dtype=torch.long, device=device_kv.device)
            dst = torch.tensor(cpu_pages, dtype=torch.long)
            self.kv[:, dst] = device_kv[:, src].cpu()
        return cpu_pages

    def load(self, device_kv: torch.Tensor, cpu_pages: list[int], device_pages: list[int]) -> None:
        """Copy host pages back into already allocated ``device_pages`` (same order)."""
        if not cpu_pages:
            return
        src = torch.tensor(cpu_pages, dtype=torch.long)
        dst = torch.tensor(device_pages, dtype=torch.long, device=device_kv.device)
        device_kv[:, dst] = self.kv[:, src].to(device_kv.device)
