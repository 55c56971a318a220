"""Paged KV cache: page ids (`PageAllocator`), the shared K/V tensor and stream lifecycle
(`PagedAllocationManager`), and the snapshots consumers read streams by (`PageTable`)."""

from worldstep.engine.kv.allocator import PageAllocator
from worldstep.engine.kv.cache import PagedAllocationManager
from worldstep.engine.kv.errors import KVPoolExhausted, StaleStreamError
from worldstep.engine.kv.stream import PageTable, StreamKey

__all__ = [
    "KVPoolExhausted",
    "PageAllocator",
    "PageTable",
    "PagedAllocationManager",
    "StaleStreamError",
    "StreamKey",
]
