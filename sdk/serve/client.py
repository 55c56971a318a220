"""The client side of ``worldstep serve``: one connection (``ServeConnection``) and the env over it.

``RemoteWorldModelEnv`` behaves like the local ``WorldModelEnv``: the same spaces, reset options, info keys
(``timings`` and ``kv`` are the engine's records again), errors (``ValueError``, ``TypeError``,
``ResetNeeded``, ``ClosedEnvironmentError``) and ``fork()``. No model is loaded in the client's process.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from worldstep.envs.info import records_from

from ..wire import EXTRA_HINT, RemoteError, packb, unpackb
from .backoff import Backoff
from .protocol import OPEN_KEYS, PROTOCOL_VERSION, SHUTDOWN_CLOSE_CODE, ErrorKind, decode_space

__all__ = [
    "RemoteEnvAuthError",
    "RemoteEnvConnectionError",
    "RemoteEnvError",
    "RemoteWorldModelEnv",
    "ServeConnection",
    "ServerFullError",
]

MAX_REPLY_BYTES = 1 << 30  # a reply holds one window's frames
logger = logging.getLogger("worldstep.serve")


class RemoteEnvError(RemoteError):
    """A request to a worldstep server failed; ``url`` (the base's ``address``) names the server."""

    server = "worldstep server"

    @property
    def url(self) -> str:
        return self.address


class RemoteEnvConnectionError(RemoteEnvError, ConnectionError):
    """The server could not be reached again within the reconnect bound, or it no longer holds the session (the
    message names the session, its last committed step and the time spent)."""


class RemoteEnvAuthError(RemoteEnvError, PermissionError):
    """The server refused the token at the handshake."""


class RemoteEnvProtocolError(RemoteEnvError, ValueError):
    """The server refused a request as malformed, or speaks another protocol version."""


class ServerFullError(RemoteEnvError):
    """The server holds as many sessions as it admits; ``retry_after_s`` says when to try again."""

    def __init__(self, url: str, message: str, retry_after_s: float) -> None:
        super().__init__(url, message)
        self.retry_after_s = retry_after_s


@dataclass
class ClientSession:
    """What a client keeps of one of its sessions: the resume key, the last acknowledged sequence number and the
    step the server last said it committed."""

    key: str
    seq: int = 0
    committed_step: int = 0


def _shutdown_reason(err: Exception) -> str | None:
    """The reason a draining server closed the connection with (``server shut down; session N lost at step K``),
    None for any other loss."""
    frame = getattr(err, "rcvd", None)
    return frame.reason if frame is not None and frame.code == SHUTDOWN_CLOSE_CODE else None


class _Lost(Exception):
    """The connection dropped (or no reply came in time) during one exchange."""


class ServeConnection:
    """One websocket to a worldstep server: the hello handshake, then ``request(op, **fields)`` (thread-safe).

    When the connection drops, the next exchange reconnects with bounded exponential backoff (for at most
    ``reconnect_s``; 0: never), resumes every session of ``sessions`` with its key and resends the request in
    flight with its sequence number, so the server applies it at most once; each failed attempt and each reconnect
    logs one warning. A server that shut down says so in its close frame: that raises at once, no reconnect.
    """

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 120.0,
                 tls_ca: str | None = None, reconnect_s: float = 30.0) -> None:
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url={url!r} is invalid; allowed: 'ws://host:port' or 'wss://host:port'")
        if token is not None and (not isinstance(token, str) or not token or not token.isprintable()):
            raise ValueError("token is invalid; allowed: None or a non-empty printable string")
        _check_seconds("timeout_s", timeout_s, zero=False)
        _check_seconds("reconnect_s", reconnect_s, zero=True)
        self.url, self.timeout_s = url, float(timeout_s)
        self.backoff = Backoff(float(reconnect_s))
        self.sessions: dict[str, ClientSession] = {}  # the sessions envs of this process hold on this connection
        self.lost: dict[str, str] = {}  # sessions the server no longer holds, with why
        self.reconnects = 0
        self._token, self._tls_ca = token, tls_ca
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._closed = False
        self._conn = self._connect()
        try:
            self.hello = self._exchange_or_raise("hello", {"protocol": PROTOCOL_VERSION})
        except _Lost as err:
            raise RemoteEnvConnectionError(self.url, str(err)) from err.__cause__
        except BaseException:
            self._drop()
            raise

    def _connect(self):
        try:
            from websockets.exceptions import InvalidStatus
            from websockets.sync.client import connect
        except ImportError as err:
            raise ImportError(f"RemoteWorldModelEnv needs websockets and msgpack: {EXTRA_HINT}") from err
        headers = {"Authorization": f"Api-Key {self._token}"} if self._token else None
        legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        context = ssl.create_default_context(cafile=self._tls_ca) if self.url.startswith("wss://") else None
        try:
            return connect(self.url, open_timeout=self.timeout_s, compression=None, max_size=MAX_REPLY_BYTES,
                           additional_headers=headers, proxy=None, ssl=context, **legacy)
        except InvalidStatus as err:
            status = err.response.status_code
            if status == 401:
                raise RemoteEnvAuthError(self.url, "the token was refused (HTTP 401); pass the server's token") \
                    from None
            raise _Refused(self.url, f"the handshake was refused (HTTP {status}: "
                                     f"{err.response.body.decode(errors='replace').strip()})") from None
        except Exception as err:  # OSError (refused), TimeoutError, ssl.SSLError, InvalidURI, ...
            raise RemoteEnvConnectionError(self.url, f"cannot connect ({type(err).__name__}: {err})") from err

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return the reply's fields; a refusal raises the matching exception. A dropped
        connection is reconnected (its sessions resumed) and the request resent, within ``reconnect_s``."""
        session, started = fields.get("session"), None
        with self._lock:
            while True:
                if self._conn is None:
                    if self._closed or started is None and not self.backoff.total_s:
                        raise RemoteEnvConnectionError(self.url, "the connection is closed")
                    started = time.monotonic() if started is None else started
                    self._reconnect(op, session, started)
                try:
                    return self._exchange_or_raise(op, fields)
                except _Lost as err:
                    if not self.backoff.total_s:
                        raise RemoteEnvConnectionError(self.url, str(err)) from err.__cause__
                    started = time.monotonic() if started is None else started

    def session_request(self, session: str, op: str, **fields: Any) -> dict[str, Any]:
        """A ``reset``, ``step`` or ``fork`` of ``session`` with its next sequence number (acknowledged only by an
        ok reply: a refused request consumes no number)."""
        with self._lock:  # re-entered by request(): the number and its acknowledgement belong together
            if session in self.lost:
                raise RemoteEnvConnectionError(self.url, self.lost[session])
            record = self.sessions[session]
            seq = record.seq + 1
            reply = self.request(op, session=session, seq=seq, **fields)
            record.seq, record.committed_step = seq, int(reply["committed_step"])
            return reply

    def _exchange_or_raise(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply on the current connection; ``_Lost`` when the connection fails."""
        request_id = next(self._ids)
        try:
            self._conn.send(packb({"id": request_id, "op": op, **fields}))
            reply = unpackb(self._conn.recv(timeout=self.timeout_s))
        except TimeoutError as err:
            self._drop()
            raise _Lost(f"no reply to {op!r} within {self.timeout_s:g} s") from err
        except Exception as err:  # ConnectionClosed and friends
            self._drop()
            reason = _shutdown_reason(err)
            if reason is not None:  # the server drained: reconnecting cannot bring the sessions back
                self.lost.update({session: reason for session in self.sessions})
                self.sessions.clear()
                raise RemoteEnvConnectionError(self.url, reason) from err
            raise _Lost(f"connection lost during {op!r} ({err})") from err
        if not isinstance(reply, dict) or reply.get("id") != request_id:
            raise RemoteEnvProtocolError(self.url, f"the reply to {op!r} does not answer it")
        if not reply.get("ok"):
            raise self._error(reply.get("error") or {})
        return reply

    # --- reconnecting ----------------------------------------------------------------------------

    def _reconnect(self, op: str, session: str | None, started: float) -> None:
        """Connect again, say hello and resume every session, within the backoff's bound."""
        last: Exception | None = None
        for attempt in self.backoff.attempts(started):
            try:
                self._conn = self._connect()
                self._exchange_or_raise("hello", {"protocol": PROTOCOL_VERSION})
                self._resume_all(started)
            except _Refused as err:  # draining: waiting will not help
                self._drop()
                raise RemoteEnvConnectionError(self.url, self._gave_up(op, session, started, err)) from None
            except (RemoteEnvConnectionError, _Lost) as err:
                self._drop()
                last = err
                left = self.backoff.total_s - (time.monotonic() - started)
                logger.warning("worldstep server %s: reconnect attempt %d failed (%s); retrying for %.1f s more",
                               self.url, attempt, err, max(left, 0.0))
                continue
            self.reconnects += 1
            logger.warning("worldstep server %s: reconnected after %.2f s (%d attempts); resumed %d sessions",
                           self.url, time.monotonic() - started, attempt, len(self.sessions))
            if session in self.lost:
                raise RemoteEnvConnectionError(self.url, self.lost[session])
            return
        raise RemoteEnvConnectionError(self.url, self._gave_up(op, session, started, last))

    def _gave_up(self, op: str, session: str | None, started: float, why: Exception | None) -> str:
        of = ""
        if session in self.sessions:
            of = f" of session {session} (last committed step {self.sessions[session].committed_step})"
        return (f"lost the connection during {op!r}{of} and could not reconnect within "
                f"{time.monotonic() - started:.1f} s ({why})")

    def _resume_all(self, started: float) -> None:
        for session, record in list(self.sessions.items()):
            try:
                self._exchange_or_raise("resume", {"session": session, "key": record.key})
            except RemoteEnvProtocolError as err:  # the server no longer holds it: lost for good
                del self.sessions[session]
                self.lost[session] = (f"session {session} is lost (last committed step {record.committed_step}; "
                                      f"{time.monotonic() - started:.1f} s after the connection dropped): {err}")

    def _error(self, error: dict[str, Any]) -> Exception:
        kind, message = error.get("kind"), str(error.get("message"))
        if kind == ErrorKind.VALUE:
            return ValueError(message)
        if kind == ErrorKind.TYPE:
            return TypeError(message)
        if kind == ErrorKind.RESET_NEEDED:
            return gym.error.ResetNeeded(message)
        if kind == ErrorKind.CLOSED:
            return gym.error.ClosedEnvironmentError(message)
        if kind == ErrorKind.SERVER_FULL:
            return ServerFullError(self.url, message, float(error.get("retry_after_s", 1.0)))
        if kind in (ErrorKind.PROTOCOL, ErrorKind.UNKNOWN_SESSION, ErrorKind.SEQUENCE):
            return RemoteEnvProtocolError(self.url, message)
        return RemoteEnvError(self.url, message)

    def close_session(self, session: str) -> None:
        """End ``session`` on the server when the connection is up (no reconnect just for this: the server closes
        a session of a dropped connection after its grace period); close the connection with its last session."""
        with self._lock:
            self.lost.pop(session, None)
            if self.sessions.pop(session, None) is not None and self._conn is not None:
                with contextlib.suppress(RemoteEnvError, _Lost):  # gone: the server closes it after the grace period
                    self._exchange_or_raise("close", {"session": session})
            if not self.sessions and not self.lost:
                self._closed = True
                self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close the connection; the server closes every session it held after its grace period (safe to call
        twice)."""
        with self._lock:
            self._closed = True
            self._drop()

    @property
    def closed(self) -> bool:
        return self._closed


class _Refused(RemoteEnvConnectionError):
    """The server refused the handshake (HTTP 503 while draining, ...): no reconnect attempt will do better."""


def _check_seconds(name: str, value: Any, zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 if zero else value > 0):
        raise ValueError(f"{name}={value!r} is invalid; allowed: seconds {'>=' if zero else '>'} 0")


class RemoteWorldModelEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """A ``WorldModelEnv`` whose model runs in a ``worldstep serve`` process.

    Args:
        url: ``ws://host:port`` (``wss://`` for a TLS server) as ``worldstep serve`` prints it.
        token: the server's token, sent as ``Authorization: Api-Key <token>`` on the handshake.
        timeout_s: seconds to wait for each reply (and for the handshake).
        reconnect_s: how long to keep reconnecting (bounded exponential backoff) when the connection drops; the
            session resumes and the request in flight is resent, applied at most once. 0: never reconnect.
        tls_ca: a PEM file of the certificate authority to trust (a self-signed server's certificate).
        render_mode: ``"rgb_array"`` (``render()`` returns the latest frame) or None. With
            ``observation="latents"`` no frames travel with a step: ``render()`` asks the server, which decodes the
            windows skipped since the last look.
        **env_kwargs: the served env's keywords (``max_windows``, ``prompt``, ``domain_id``, ``embodiment``,
            ``action_width``, ``image``, ``success_fn`` as ``"sim"``/``"none"``, ``resolution_tier``, ``fps``,
            ``observation``),
            checked by the server with the local env's errors.

    The session lives as long as the env: ``close()`` ends it (a later ``reset()`` opens a new one, as the local
    env does). A dropped connection costs latency and one warning in the log: the env reconnects and resumes its
    session. After ``reconnect_s``, or when the server no longer holds the session (it restarted, or the grace
    period passed), it raises ``RemoteEnvConnectionError`` naming the session, the last committed step and the
    time spent; a ``reset()`` then opens a new session. ``fork()`` opens a second session on the same
    connection; the connection closes with its last env.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 6, "frame_fps": 24}

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 120.0, reconnect_s: float = 30.0,
                 tls_ca: str | None = None, render_mode: str | None = None, **env_kwargs: Any) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} is invalid; allowed: None or 'rgb_array'")
        unknown = sorted(set(env_kwargs) - set(OPEN_KEYS))
        if unknown:
            raise TypeError(f"RemoteWorldModelEnv got an unexpected keyword argument {unknown[0]!r}; allowed: url, "
                            f"token, timeout_s, reconnect_s, tls_ca, render_mode, {', '.join(OPEN_KEYS)}")
        self.render_mode = render_mode
        self._reopen = (url, token, timeout_s, reconnect_s, tls_ca, env_kwargs)  # what reset() after close() opens
        self._open_session()

    def _open_session(self) -> None:
        url, token, timeout_s, reconnect_s, tls_ca, env_kwargs = self._reopen
        connection = ServeConnection(url, token, timeout_s=timeout_s, reconnect_s=reconnect_s, tls_ca=tls_ca)
        try:
            self._attach(connection, connection.request("open", env=env_kwargs))
        except BaseException:
            connection.close()
            raise

    def _attach(self, connection: ServeConnection, opened: dict[str, Any]) -> None:
        self.connection, self.session = connection, opened["session"]
        connection.sessions[self.session] = ClientSession(opened["key"], committed_step=opened["committed_step"])
        self.observation_space = decode_space(opened["observation_space"])
        self.action_space = decode_space(opened["action_space"])
        self.metadata = {**type(self).metadata, "render_fps": opened["render_fps"], "frame_fps": opened["frame_fps"]}
        self.prompt, self.domain_id = opened["prompt"], opened["domain_id"]
        self.embodiment, self.max_windows = opened["embodiment"], opened["max_windows"]
        self._frames: np.ndarray | None = None

    @property
    def url(self) -> str:
        return self.connection.url

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.session not in self.connection.sessions:  # closed or lost: a new session, as a local env reopens
            self.close()
            self._open_session()
        super().reset(seed=seed)
        reply = self._request("reset", seed=seed, options=options)
        self._frames = reply["obs"].get("frames")  # None in latent mode: render() asks the server
        return _writable(reply["obs"]), records_from(reply["info"])

    def step(self, actions: np.ndarray):
        reply = self._request("step", actions=np.asarray(actions))
        self._frames = reply["obs"].get("frames")
        return (_writable(reply["obs"]), float(reply["reward"]), reply["terminated"], reply["truncated"],
                records_from(reply["info"]))

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn("You are calling render method without specifying any render mode.")
            return None
        if "latents" in self.observation_space.spaces:  # decoded on the server, on demand
            if self.session not in self.connection.sessions and self.session not in self.connection.lost:
                raise gym.error.ClosedEnvironmentError("Cannot call env.render() after env.close()")
            frame = self.connection.request("render", session=self.session)["frame"]
            return None if frame is None else np.array(frame)
        return None if self._frames is None else self._frames[-1].copy()

    def fork(self, seed: int | None = None) -> RemoteWorldModelEnv:
        """A second env continuing this episode on the server (committed KV pages shared), as ``WorldModelEnv.fork``."""
        reply = self._request("fork", seed=seed)
        other = object.__new__(type(self))
        other.render_mode, other._reopen = self.render_mode, self._reopen
        other._attach(self.connection, reply)
        other._frames = self._frames
        return other

    def status(self) -> dict[str, Any]:
        """The server's ``status`` of this session: ``pages``, ``kv_bytes``, ``decoder_cache_bytes``,
        ``context_tokens``, ``committed_step``, ``idle_s``, ``model_calls``, ``seq`` (docs/serving.md)."""
        if self.session not in self.connection.sessions:
            raise gym.error.ClosedEnvironmentError("Cannot call env.status() after env.close()")
        rows = self.connection.request("status")["sessions"]
        return next(row for row in rows if row["session"] == self.session)

    def close(self) -> None:
        """End this session on the server; the connection closes with its last env (safe to call twice)."""
        self.connection.close_session(self.session)

    def _request(self, op: str, **fields: Any) -> dict[str, Any]:
        if self.session not in self.connection.sessions and self.session not in self.connection.lost:
            raise gym.error.ClosedEnvironmentError(f"Cannot call env.{op}() after env.close()")
        return self.connection.session_request(self.session, op, **fields)


def _writable(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays decoded from a message are read-only views of it; the local env returns its own copies."""
    return {k: np.array(v) for k, v in obs.items()}
