"""A reservation the stream table hands out: pages set aside for a write, nothing changed yet.

The cache writes between reserving and committing, so a failed write leaves every stream as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stream import StreamKey


@dataclass(frozen=True)
class AppendPlan:
    """Pages reserved for appending ``n`` tokens at token ``start``; nothing changes until committed.

    ``copy`` is ``(src, dst)`` when the partially filled tail page is shared with a fork and must be
    copied before the write (copy-on-write).
    """

    key: StreamKey
    pages: tuple[int, ...]
    new_pages: tuple[int, ...]
    copy: tuple[int, int] | None
    start: int
    n: int
