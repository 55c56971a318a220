"""Page ids and their reference counts: the bookkeeping half of the paged KV cache (no tensors)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from ..checks import check_int, is_int
from .errors import KVPoolExhausted


class PageAllocator:
    """A pool of ``num_pages`` page ids with reference counts.

    A page is free (in ``free_page_ids``, ref count 0) or used (in ``used_page_ids``, ref count >= 1);
    forks share a page by raising its count, and it returns to the pool when the last holder frees it.
    Not thread-safe by itself: the cache that owns it serialises every call under its lock.
    """

    def __init__(self, num_pages: int, *, name: str = "KV page pool") -> None:
        self.num_pages = check_int("num_pages", num_pages, 0)
        self.name = name
        self.free_page_ids: deque[int] = deque(range(num_pages))
        self.used_page_ids: set[int] = set()
        self.ref_counts: list[int] = [0] * num_pages

    @property
    def num_free(self) -> int:
        return len(self.free_page_ids)

    @property
    def num_used(self) -> int:
        return len(self.used_page_ids)

    def ref_count(self, page_id: int) -> int:
        self._check_id(page_id)
        return self.ref_counts[page_id]

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self.free_page_ids)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free pages (ref count 1 each); all or nothing."""
        check_int("n", n, 0)
        if not self.can_allocate(n):
            raise KVPoolExhausted(n, self.num_free, self.name)
        return [self._take(self.free_page_ids.popleft()) for _ in range(n)]

    def share(self, page_ids: Iterable[int]) -> None:
        """Add one reference to each page (a fork now holds it too)."""
        page_ids = list(page_ids)
        for page_id in page_ids:
            self._check_used(page_id)
        for page_id in page_ids:
            self.ref_counts[page_id] += 1

    def free(self, page_ids: Iterable[int]) -> list[int]:
        """Drop one reference per listed id; returns the ids that went back to the pool.

        Validates the whole list first, so a double free raises without changing anything.
        """
        counts = Counter(page_ids)
        for page_id, n in counts.items():
            self._check_used(page_id)
            if n > self.ref_counts[page_id]:
                raise ValueError(
                    f"page {page_id} freed {n} times but holds {self.ref_counts[page_id]} references"
                )
        returned = []
        for page_id, n in counts.items():
            self.ref_counts[page_id] -= n
            if self.ref_counts[page_id] == 0:
                self._give_back(page_id)
                returned.append(page_id)
        return returned

    # private helpers: invariants

    def _take(self, page_id: int) -> int:
        assert self.ref_counts[page_id] == 0 and page_id not in self.used_page_ids
        self.ref_counts[page_id] = 1
        self.used_page_ids.add(page_id)
        return page_id

    def _give_back(self, page_id: int) -> None:
        assert self.ref_counts[page_id] == 0 and page_id in self.used_page_ids
        self.used_page_ids.remove(page_id)
        self.free_page_ids.append(page_id)

    def _check_id(self, page_id: int) -> None:
        if not is_int(page_id) or not 0 <= page_id < self.num_pages:  # ids come in lists: no argument name
            raise ValueError(f"page id must be an int in [0, {self.num_pages}), got {page_id!r}")

    def _check_used(self, page_id: int) -> None:
        self._check_id(page_id)
        if self.ref_counts[page_id] == 0:
            raise ValueError(f"page {page_id} is not allocated")
        assert page_id in self.used_page_ids
