"""Names of KV streams, one stream's state, and the frozen snapshot consumers read a stream by."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .errors import StaleStreamError


class StreamLabel(str, Enum):
    """Which of a session's streams: its conditioned stream, or the unconditioned one of text-only CFG."""

    MAIN = "main"
    UNCOND = "uncond"


@dataclass(frozen=True, order=True)
class StreamKey:
    """One stream of the pool: a session's stream under a label."""

    session_id: str
    label: StreamLabel

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, str) or not self.session_id:
            raise ValueError(f"StreamKey.session_id must be a non-empty str, got {self.session_id!r}")
        if not isinstance(self.label, StreamLabel):
            raise ValueError(f"StreamKey.label must be a StreamLabel, got {self.label!r}")

    def __str__(self) -> str:
        return f"{self.session_id}/{self.label.value}"


def check_stream_key(key: object) -> StreamKey:
    if not isinstance(key, StreamKey):
        raise ValueError(f"key={key!r} is invalid; allowed: a StreamKey(session_id, StreamLabel)")
    return key


@dataclass(frozen=True)
class PageTable:
    """A snapshot of one stream: which pages hold its tokens, in order, at one epoch.

    Token ``i`` of the stream lives in ``pages[i // page_size]`` at offset ``i % page_size``; every
    page but the last is full. Readers that go by page position must call `StreamTable.check_current`
    first: a release compacts the list, so a position names different tokens afterwards.
    """

    key: StreamKey
    pages: tuple[int, ...]
    seq_len: int
    protected_prefix_tokens: int
    released_tokens: int
    prefix_epoch: int


@dataclass
class StreamState:
    """Mutable per-stream state owned by the `StreamTable` (callers see `PageTable` snapshots only).

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


def check_snapshot(table: PageTable, state: StreamState | None) -> None:
    """Raise `StaleStreamError` unless ``table`` still describes ``state`` (None: the stream is gone) exactly."""
    if state is None:
        raise StaleStreamError(f"KV stream {table.key} was removed since this page table")
    if state.released_tokens != table.released_tokens:
        raise StaleStreamError(
            f"KV stream {table.key} was compacted: {state.released_tokens} tokens released, "
            f"the page table saw {table.released_tokens}; take a fresh page_table()")
    if state.prefix_epoch != table.prefix_epoch:
        raise StaleStreamError(f"KV stream {table.key} changed (epoch {state.prefix_epoch}, page table "
                               f"has {table.prefix_epoch}); take a fresh page_table()")
