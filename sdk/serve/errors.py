"""The server's refusal: what a client gets as ``{"kind", "message", "retry_after_s"?}``.

Its own module so the session table and the server raise the same exception without importing each other.
"""

from __future__ import annotations

from .protocol import ErrorKind

__all__ = ["ServeError"]


class ServeError(Exception):
    """A refusal the client gets as ``{"kind", "message"}`` (and ``retry_after_s`` for capacity)."""

    def __init__(self, kind: ErrorKind, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind, self.retry_after_s = kind, retry_after_s
