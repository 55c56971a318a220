"""The ledger of warm decoder slots: which streams hold one, under a cap.

A leaf the decoder owns and a dropped stream's finalizer reaches (`give_back`), so a stream record never
holds a reference up to its decoder, not even through a bound method.
"""

from __future__ import annotations

import threading


class WarmSlots:
    """Stream ids holding a warm slot."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: the collector may give a slot back while it is held
        self._ids: set[int] = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)

    def take(self, stream_id: int, cap: int) -> bool:
        """Give ``stream_id`` a slot unless ``cap`` (0: no cap) slots are taken; whether it got one."""
        with self._lock:
            if cap and len(self._ids) >= cap:
                return False
            self._ids.add(stream_id)
            return True

    def release(self, stream_id: int) -> None:
        with self._lock:
            self._ids.discard(stream_id)


def give_back(slots: WarmSlots, stream_id: int) -> None:
    """Return ``stream_id``'s slot (idempotent): called by close, or by the collector for a dropped stream."""
    slots.release(stream_id)
