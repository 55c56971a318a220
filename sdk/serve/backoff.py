"""How long a client waits between reconnect attempts: bounded exponential backoff.

The delays double from ``first_s`` up to ``max_s``, and the attempts stop once ``total_s`` is spent, so a dead
server costs a bounded wait and a clear error, never a hang.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """``first_s`` doubling to ``max_s`` between attempts, for at most ``total_s`` from ``started``."""

    total_s: float
    first_s: float = 0.05
    max_s: float = 2.0

    def attempts(self, started: float) -> Iterator[int]:
        """Yield attempt numbers 1, 2, ..., sleeping the backoff delay before each but the first, while an
        attempt can still start within ``total_s`` of ``started`` (``time.monotonic``)."""
        delay, attempt = self.first_s, 1
        yield attempt
        while time.monotonic() + delay < started + self.total_s:
            time.sleep(delay)
            delay, attempt = min(2 * delay, self.max_s), attempt + 1
            yield attempt
