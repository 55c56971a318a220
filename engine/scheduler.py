"""What runs next: the live sessions, admission of their windows into the page pool, and the groups that run.

`Scheduler.schedule(sessions, actions)` is the first of a step's three calls (then the model's runner, then
its postprocess). It resolves each session's next window once, makes room for the windows' commits before
any work starts (offloaded sessions come back first; when the pool is short and a CPU pool is configured,
idle sessions, least recently stepped first, are parked there; otherwise `KVPoolExhausted` is raised with
nothing changed) and groups the sessions that can share one batched window. This module knows pages and
window plans, not models: a session is anything `Schedulable`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .kv import KVPoolExhausted, PagedKVCache, StreamKey
from .windowing import WindowPlan


class Schedulable(Protocol):
    """What the scheduler reads of a session."""

    session_id: str

    plan: WindowPlan  # the session's next window
    keys: tuple[StreamKey, ...]  # its KV streams

    def commit_tokens(self, plan: WindowPlan) -> int:
        """Tokens the window's commit appends to each stream (0: the window commits nothing)."""
        ...

    def group_key(self, plan: WindowPlan) -> Hashable:
        """Sessions with equal keys can run one batched window."""
        ...


S = TypeVar("S", bound=Schedulable)


@dataclass(frozen=True)
class ScheduledWindow(Generic[S]):
    """One session's window in a step: where it sits in the step, its actions and its plan, resolved once."""

    index: int
    session: S
    actions: Any
    plan: WindowPlan


@dataclass(frozen=True)
class StepBatch(Generic[S]):
    """A step's windows (in the order the sessions were given), in groups that each run as one batched
    window, in running order."""

    windows: tuple[ScheduledWindow[S], ...]
    groups: tuple[tuple[ScheduledWindow[S], ...], ...]


class Scheduler(Generic[S]):
    """The live sessions over ``cache``'s page pool; admits windows, offloading idle sessions LRU first."""

    def __init__(self, cache: PagedKVCache, *, split_groups: bool = False) -> None:
        """``split_groups``: run a group of two or more whose every window decodes (`schedule`'s ``decodes``) as
        two halves, so one half's decode overlaps the other's denoise; a group that does not decode stays one."""
        self.cache = cache
        self.split_groups = split_groups
        self._live: dict[str, S] = {}
        self._last_used: dict[str, int] = {}  # live session id -> clock tick of its last step
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    # the live set

    def add(self, session: S) -> None:
        """A new live session, counted as just used."""
        with self._lock:
            self._live[session.session_id] = session
            self._last_used[session.session_id] = next(self._clock)

    def remove(self, session_id: str) -> None:
        with self._lock:
            self._live.pop(session_id, None)
            self._last_used.pop(session_id, None)

    def sessions(self) -> list[S]:
        with self._lock:
            return list(self._live.values())

    @property
    def live_sessions(self) -> int:
        with self._lock:
            return len(self._live)

    # one step

    def schedule(self, sessions: Sequence[S], actions: Sequence[Any],
                 decodes: Sequence[bool] | None = None) -> StepBatch[S]:
        """Each session's next window, admitted into the pool, in groups that run together (``decodes``: per
        session, whether its window is decoded in this step, None: none is; only groups that all decode are
        split)."""
        windows = [ScheduledWindow(i, s, a, s.plan) for i, (s, a) in enumerate(zip(sessions, actions, strict=True))]
        self.admit([s.session_id for s in sessions], self.pages_to_commit(windows))
        groups: dict[Hashable, list[ScheduledWindow[S]]] = {}
        for w in windows:
            groups.setdefault(w.session.group_key(w.plan), []).append(w)
        parts = []
        for members in groups.values():
            half = len(members) // 2
            split = self.split_groups and half and decodes is not None and all(decodes[w.index] for w in members)
            parts.extend([members[:half], members[half:]] if split else [members])
        return StepBatch(tuple(windows), tuple(tuple(p) for p in parts))

    # admission maths

    def pages_to_open(self, stream_tokens: Iterable[int]) -> int:
        """Pages new streams of these many tokens take."""
        return sum(self.cache.pages_for(n) for n in stream_tokens)

    def pages_to_commit(self, windows: Iterable[ScheduledWindow[S]]) -> int:
        """Pages the windows' commits may take: their tokens per stream, plus one copied tail page each."""
        needed = 0
        for w in windows:
            tokens = w.session.commit_tokens(w.plan)
            if tokens:
                for key in w.session.keys:
                    seq = self.cache.page_table(key).seq_len
                    needed += self.cache.pages_for(seq + tokens) - self.cache.pages_for(seq) + 1
        return needed

    # admission

    def admit(self, session_ids: Sequence[str], pages: int) -> None:
        """Bring the sessions back if offloaded and make ``pages`` more device pages free for their window,
        or raise `KVPoolExhausted`. Counts the sessions as used now."""
        keep = set(session_ids)
        for session_id in session_ids:
            if self.cache.is_offloaded(session_id):
                self.make_room(self.cache.held_pages(session_id), keep)
                self.cache.reload_session(session_id)
        self.make_room(pages, keep)
        with self._lock:
            for session_id in session_ids:
                self._last_used[session_id] = next(self._clock)

    def make_room(self, pages: int, keep: Iterable[str] = ()) -> None:
        """Offload idle sessions not in ``keep`` until ``pages`` device pages are free, or raise."""
        if pages <= self.cache.num_free_pages:
            return
        for session_id in self._idle(set(keep)):
            moved = not self.cache.is_offloaded(session_id) and self.cache.offload_session(session_id)
            if moved and pages <= self.cache.num_free_pages:
                return
        raise KVPoolExhausted(pages, self.cache.num_free_pages)

    def _idle(self, keep: set[str]) -> list[str]:
        """Live sessions not in ``keep``, least recently used first (none when there is no CPU pool)."""
        if self.cache.num_cpu_pages == 0:
            return []
        with self._lock:
            ordered = sorted(self._last_used.items(), key=lambda item: item[1])
        return [sid for sid, _ in ordered if sid not in keep and not self.cache.is_offloaded(sid)]
