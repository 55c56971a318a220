"""Paged KV cache: page ids (`PageAllocator`), which pages hold which stream (`StreamTable`), the table with the one
K/V tensor (`PagedKVCache`), CPU offload (`Offload`), and the snapshots consumers read streams by (`PageTable`)."""

from worldstep.engine.kv.allocator import PageAllocator
from worldstep.engine.kv.cache import PagedKVCache
from worldstep.engine.kv.errors import KVPoolExhausted, StaleStreamError
from worldstep.engine.kv.invariants import check_invariants
from worldstep.engine.kv.offload import Offload
from worldstep.engine.kv.stream import PageTable, StreamKey, StreamLabel
from worldstep.engine.kv.table import StreamTable

__all__ = [
    "KVPoolExhausted",
    "Offload",
    "PageAllocator",
    "PageTable",
    "PagedKVCache",
    "StaleStreamError",
    "StreamKey",
    "StreamLabel",
    "StreamTable",
    "check_invariants",
]
