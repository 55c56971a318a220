"""The server's sessions: who holds each one, how it is resumed, and the at-most-once rule of its requests.

A session outlives the connection that opened it for a grace period: it is *detached* (no owner) when its
connection drops, a reconnecting client takes it over with its resume key (an unguessable ``secrets`` string,
compared with ``hmac.compare_digest``, valid only with the token the session was opened with), and
``expired()`` hands the server the sessions detached longer than the grace period to close.

Every ``reset``, ``step`` and ``fork`` carries the client's sequence number for the session. ``admit`` lets
through the next number, answers a retry of the last applied request with its recorded reply (the model does
not run again), and refuses anything else naming both numbers. A refused or failed request consumes no number.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import ServeError
from .protocol import ErrorKind, Op

__all__ = ["ServedSession", "SessionTable", "token_digest"]


def token_digest(token: str | None) -> bytes:
    """What a session remembers of the token its connection presented (never the token itself)."""
    return hashlib.sha256(b"" if token is None else token.encode()).digest()


@dataclass(eq=False)
class ServedSession:
    """One served env and its bookkeeping. ``owner`` is the connection holding it (None: detached since
    ``detached_at``); ``seq`` the last applied sequence number and ``reply`` that request's op and reply;
    ``model_calls`` counts the engine calls made for it (resets, steps, forks)."""

    id: str
    env: Any
    key: str
    token: bytes
    owner: object | None
    seq: int = 0
    reply: tuple[Op, dict[str, Any]] | None = None
    model_calls: int = 0
    last_request_at: float = field(default_factory=time.monotonic)
    detached_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # held while a request applies

    def admit(self, op: Op, seq: int) -> dict[str, Any] | None:
        """None when ``seq`` is the next number (apply it), the recorded reply when it retries the last applied
        request, else a ``ServeError`` naming both numbers. Call with ``lock`` held."""
        self.last_request_at = time.monotonic()
        if seq == self.seq + 1:
            return None
        if seq == self.seq and self.reply is not None and self.reply[0] is op:
            return self.reply[1]
        what = "stale" if seq <= self.seq else "out of order (a gap)"
        raise ServeError(ErrorKind.SEQUENCE, f"seq={seq} of {op.value!r} is {what}: the session's last applied "
                                             f"request is seq={self.seq}; allowed: {self.seq + 1} (the next one) or "
                                             f"{self.seq} (a retry of the last applied {self._last_op()!r})")

    def applied(self, op: Op, seq: int, reply: dict[str, Any]) -> None:
        """Record that ``seq`` ran: its reply is what a retry gets."""
        self.seq, self.reply = seq, (op, reply)

    def _last_op(self) -> str:
        return "nothing" if self.reply is None else self.reply[0].value


class SessionTable:
    """Every session of the server by id, each with its owner connection (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, ServedSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, env: Any, owner: object, token: bytes) -> ServedSession:
        session = ServedSession(secrets.token_urlsafe(24), env, secrets.token_urlsafe(32), token, owner)
        with self._lock:
            self._sessions[session.id] = session
        return session

    def owned(self, session_id: str, owner: object) -> ServedSession:
        """The session ``owner`` holds, or ``unknown_session``."""
        session = self._sessions.get(session_id)
        if session is None or session.owner is not owner:
            raise ServeError(ErrorKind.UNKNOWN_SESSION, "session is invalid: not a session of this connection "
                                                        "(open one first, or resume it with its key)")
        return session

    def resume(self, session_id: str, key: str, token: bytes, owner: object) -> ServedSession:
        """Hand the session to ``owner`` when ``key`` and the token match (the same refusal for an unknown id, a
        wrong key and another token, so a refusal tells nothing)."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                key_ok = hmac.compare_digest(key.encode(), session.key.encode())
                token_ok = hmac.compare_digest(token, session.token)
            if session is None or not (key_ok and token_ok):
                raise ServeError(ErrorKind.UNKNOWN_SESSION, "session cannot be resumed: no session of this token "
                                                            "has this id and key (closed, expired after the grace "
                                                            "period, or the server restarted)")
            session.owner, session.detached_at, session.last_request_at = owner, None, time.monotonic()
            return session

    def attach(self, session_id: str, owner: object) -> None:
        """Give ``owner`` a session a retried ``fork`` names (it was opened for the connection that dropped)."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                session.owner, session.detached_at = owner, None

    def detach(self, owner: object) -> list[ServedSession]:
        """The sessions ``owner`` held, now waiting for a resume."""
        now = time.monotonic()
        with self._lock:
            held = [s for s in self._sessions.values() if s.owner is owner]
            for session in held:
                session.owner, session.detached_at = None, now
        return held

    def pop(self, session_id: str) -> ServedSession | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def expired(self, grace_s: float, now: float | None = None) -> list[ServedSession]:
        """Remove and return the sessions detached for longer than ``grace_s`` (at ``now``, monotonic)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [s for s in self._sessions.values() if s.detached_at is not None and now - s.detached_at >= grace_s]
            for session in gone:
                del self._sessions[session.id]
        return gone

    def pop_all(self) -> list[ServedSession]:
        with self._lock:
            gone, self._sessions = list(self._sessions.values()), {}
        return gone

    def attached(self) -> int:
        """Sessions a connection holds now (those that can send a step)."""
        return sum(1 for s in list(self._sessions.values()) if s.owner is not None)

    def of(self, owner: object | None = None) -> list[ServedSession]:
        """The sessions ``owner`` holds (None: every session)."""
        return [s for s in list(self._sessions.values()) if owner is None or s.owner is owner]
