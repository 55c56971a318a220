"""Paged KV cache: page ids (`PageAllocator`), which pages hold which live stream's tokens (`StreamTable`), parked
sessions on host pages (`Offload`), the cache that holds both with the one K/V tensor (`PagedKVCache`), and the
snapshots consumers read streams by (`PageTable`)."""

from .allocator import PageAllocator
from .cache import PagedKVCache
from .errors import KVPoolExhausted, StaleStreamError
from .invariants import check_invariants
from .offload import Offload
from .stream import PageTable, StreamKey, StreamLabel
from .table import StreamTable

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
