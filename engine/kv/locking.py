"""The one lock of a page pool: its table, and in a `PagedKVCache` its tensor and offload, change under it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def locked(method: F) -> F:
    """``method`` run while holding ``self.lock`` (re-entrant: a locked method may call another)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]
