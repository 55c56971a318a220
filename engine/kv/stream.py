"""One KV stream's state (where its tokens live) and the frozen snapshot consumers read it by."""

from __future__ import annotations

from dataclasses import dataclass, field

StreamKey = tuple[str, str]
"""(session_id, label); labels are "main" and "uncond" (the CFG stream)."""


@dataclass(frozen=True)
class PageTable:
    """A snapshot of one stream: which pages hold its tokens, in order, at one epoch.

    Token ``i`` of the stream lives in ``pages[i // page_size]`` at offset ``i % page_size``; every
    page but the last is full. Readers that go by page position must call
    `PagedAllocationManager.check_current` first: a release compacts the list, so a position names
    different tokens afterwards.
    """

    key: StreamKey
    pages: tuple[int, ...]
    seq_len: int
    protected_prefix_tokens: int
    released_tokens: int
    prefix_epoch: int


@dataclass
class StreamState:
    """Mutable per-stream state owned by the cache (callers see `PageTable` snapshots only).

    ``seq_len`` counts tokens currently held (it drops on release), ``released_tokens`` counts tokens
    released from the front so far, ``prefix_epoch`` changes with every change of committed content.
    While its session is offloaded, ``pages`` is empty and ``cpu_pages`` holds the saved copy.
    """

    pages: list[int] = field(default_factory=list)
    seq_len: int = 0
    protected_prefix_tokens: int = 0
    released_tokens: int = 0
    prefix_epoch: int = 0
    cpu_pages: list[int] | None = None

    def table(self, key: StreamKey) -> PageTable:
        return PageTable(
            key=key,
            pages=tuple(self.pages),
            seq_len=self.seq_len,
            protected_prefix_tokens=self.protected_prefix_tokens,
            released_tokens=self.released_tokens,
            prefix_epoch=self.prefix_epoch,
        )
