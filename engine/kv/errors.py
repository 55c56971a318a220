"""Errors the KV page pool raises: callers catch these to truncate a rollout or re-read a stream."""

from __future__ import annotations


class KVPoolExhausted(RuntimeError):
    """The page pool cannot hold what was asked; nothing was allocated or written.

    ``needed`` and ``free`` are page counts, so a caller can decide to offload, shrink the context
    or end the episode (a truncation, not a termination).
    """

    def __init__(self, needed: int, free: int, what: str = "KV page pool") -> None:
        super().__init__(
            f"{what} exhausted: {needed} pages needed, {free} free; "
            "free pages (close or offload a session, shorten context_frames) or raise num_pages"
        )
        self.needed = needed
        self.free = free


class StaleStreamError(RuntimeError):
    """A `PageTable` no longer describes its stream (compacted, rewritten, offloaded or removed).

    Reading pages by position from a stale table would splice the wrong tokens, so consumers raise
    this instead and take a fresh `page_table()`.
    """
