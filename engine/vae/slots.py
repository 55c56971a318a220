"""The ledger of warm decoder slots: which sessions hold one, under a cap.

A leaf the decoder owns and a dropped session's finalizer reaches (`give_back`), so a session record never
holds a reference up to its decoder, not even through a bound method.
"""

from __future__ import annotations

import threading


class WarmSlots:
    """Session ids holding a warm slot."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: the collector may give a slot back while it is held
        self._ids: set[int] = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)

    def take(self, session_id: int, cap: int) -> bool:
        """Give ``session_id`` a slot unless ``cap`` (0: no cap) slots are taken; whether it got one."""
        with self._lock:
            if cap and len(self._ids) >= cap:
                return False
            self._ids.add(session_id)
            return True

    def release(self, session_id: int) -> None:
        with self._lock:
            self._ids.discard(session_id)


def give_back(slots: WarmSlots, session_id: int) -> None:
    """Return ``session_id``'s slot (idempotent): called by close, or by the collector for a dropped session."""
    slots.release(session_id)
