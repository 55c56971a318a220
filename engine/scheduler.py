"""What runs next: admission of sessions' windows into the page pool, and the groups that run together.

Admission makes room for a window before any work starts: offloaded sessions come back first, and when
the pool is short and a CPU pool is configured, idle sessions (least recently stepped first) are parked
there; otherwise `KVPoolExhausted` is raised with nothing changed. Grouping puts sessions that can share
one batched window together. Sessions are named by id; this module knows pages, not models.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from worldstep.engine.kv import KVPoolExhausted, PagedKVCache

T = TypeVar("T")


def group(items: Sequence[T], key: Callable[[T], Hashable]) -> list[list[int]]:
    """Indices of ``items`` grouped by ``key``, groups and members in first-seen order."""
    groups: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(key(item), []).append(i)
    return list(groups.values())


class Scheduler:
    """Admits windows into ``cache``'s page pool, offloading idle sessions least recently used first."""

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self._last_used: dict[str, int] = {}  # live session id -> clock tick of its last step
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def track(self, session_id: str) -> None:
        """A new live session, counted as just used."""
        with self._lock:
            self._last_used[session_id] = next(self._clock)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._last_used.pop(session_id, None)

    @property
    def live_sessions(self) -> int:
        with self._lock:
            return len(self._last_used)

    def held_pages(self, session_id: str) -> int:
        """Device pages the session's streams need (when offloaded: to come back)."""
        table = self.cache.table
        keys = self.cache.offload.parked().get(session_id) or table.stream_keys(session_id)
        return sum(table.pages_for(self.cache.page_table(key).seq_len) for key in keys)

    def can_admit(self, pages: int, keep: Iterable[str] = ()) -> bool:
        """Whether ``pages`` device pages can be made free, offloading idle sessions not in ``keep``."""
        free = self.cache.table.num_free_pages
        if pages <= free:
            return True
        cpu_room = self.cache.offload.num_free_pages
        for session_id in self._idle(set(keep)):
            held = self.held_pages(session_id)
            if held <= cpu_room:
                free, cpu_room = free + held, cpu_room - held
                if pages <= free:
                    return True
        return False

    def admit(self, session_ids: Sequence[str], pages: int) -> None:
        """Bring the sessions back if offloaded and make ``pages`` more device pages free for their window,
        or raise `KVPoolExhausted`. Counts the sessions as used now."""
        keep = set(session_ids)
        offload = self.cache.offload
        for session_id in session_ids:
            if self.cache.table.is_offloaded(session_id):
                self.make_room(self.held_pages(session_id), keep)
                offload.reload(session_id)
        self.make_room(pages, keep)
        with self._lock:
            for session_id in session_ids:
                self._last_used[session_id] = next(self._clock)

    def make_room(self, pages: int, keep: Iterable[str] = ()) -> None:
        """Offload idle sessions not in ``keep`` until ``pages`` device pages are free, or raise."""
        table = self.cache.table
        if pages <= table.num_free_pages:
            return
        for session_id in self._idle(set(keep)):
            moved = not table.is_offloaded(session_id) and self.cache.offload.offload(session_id)
            if moved and pages <= table.num_free_pages:
                return
        raise KVPoolExhausted(pages, table.num_free_pages)

    def _idle(self, keep: set[str]) -> list[str]:
        """Live sessions not in ``keep``, least recently used first (none when there is no CPU pool)."""
        if self.cache.offload.allocator.num_pages == 0:
            return []
        with self._lock:
            ordered = sorted(self._last_used.items(), key=lambda item: item[1])
        return [sid for sid, _ in ordered if sid not in keep and not self.cache.table.is_offloaded(sid)]
