"""The client side of ``worldstep serve``: one connection (``ServeConnection``) and the env over it.

``RemoteWorldModelEnv`` behaves like the local ``WorldModelEnv``: the same spaces, reset options, info keys
(``timings`` and ``kv`` are the engine's records again), errors (``ValueError``, ``TypeError``,
``ResetNeeded``, ``ClosedEnvironmentError``) and ``fork()``. No model is loaded in the client's process.
"""

from __future__ import annotations

import inspect
import itertools
import ssl
import threading
from typing import Any

import gymnasium as gym
import numpy as np

from ..remote_policy import packb, unpackb
from .protocol import OPEN_KEYS, PROTOCOL_VERSION, ErrorKind, decode_info, decode_space

__all__ = [
    "RemoteEnvAuthError",
    "RemoteEnvConnectionError",
    "RemoteEnvError",
    "RemoteWorldModelEnv",
    "ServeConnection",
    "ServerFullError",
]

_EXTRA_HINT = "pip install 'worldstep[remote]'"
MAX_REPLY_BYTES = 1 << 30  # a reply holds one window's frames


class RemoteEnvError(RuntimeError):
    """A request to a worldstep server failed; ``url`` names the server."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"worldstep server {url}: {message}")
        self.url = url


class RemoteEnvConnectionError(RemoteEnvError, ConnectionError):
    """The server could not be reached, or it closed the connection."""


class RemoteEnvAuthError(RemoteEnvError, PermissionError):
    """The server refused the token at the handshake."""


class RemoteEnvProtocolError(RemoteEnvError, ValueError):
    """The server refused a request as malformed, or speaks another protocol version."""


class ServerFullError(RemoteEnvError):
    """The server holds as many sessions as it admits; ``retry_after_s`` says when to try again."""

    def __init__(self, url: str, message: str, retry_after_s: float) -> None:
        super().__init__(url, message)
        self.retry_after_s = retry_after_s


class ServeConnection:
    """One websocket to a worldstep server: the hello handshake, then ``request(op, **fields)`` (thread-safe)."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 120.0,
                 tls_ca: str | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url={url!r} is invalid; allowed: 'ws://host:port' or 'wss://host:port'")
        if token is not None and (not isinstance(token, str) or not token or not token.isprintable()):
            raise ValueError("token is invalid; allowed: None or a non-empty printable string")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} is invalid; allowed: seconds > 0")
        self.url, self.timeout_s = url, float(timeout_s)
        self.sessions: set[str] = set()  # the sessions envs of this process hold on this connection
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._conn = self._connect(token, tls_ca)
        self.hello = self.request("hello", protocol=PROTOCOL_VERSION)

    def _connect(self, token: str | None, tls_ca: str | None):
        try:
            from websockets.exceptions import InvalidStatus
            from websockets.sync.client import connect
        except ImportError as err:
            raise ImportError(f"RemoteWorldModelEnv needs websockets and msgpack: {_EXTRA_HINT}") from err
        headers = {"Authorization": f"Api-Key {token}"} if token else None
        legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        context = ssl.create_default_context(cafile=tls_ca) if self.url.startswith("wss://") else None
        try:
            return connect(self.url, open_timeout=self.timeout_s, compression=None, max_size=MAX_REPLY_BYTES,
                           additional_headers=headers, proxy=None, ssl=context, **legacy)
        except InvalidStatus as err:
            status = err.response.status_code
            if status == 401:
                raise RemoteEnvAuthError(self.url, "the token was refused (HTTP 401); pass the server's token") \
                    from None
            raise RemoteEnvConnectionError(self.url, f"the handshake was refused (HTTP {status}: "
                                                     f"{err.response.body.decode(errors='replace').strip()})") from None
        except Exception as err:  # OSError (refused), TimeoutError, ssl.SSLError, InvalidURI, ...
            raise RemoteEnvConnectionError(self.url, f"cannot connect ({type(err).__name__}: {err})") from err

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return the reply's fields; a refusal raises the matching exception."""
        with self._lock:
            if self._conn is None:
                raise RemoteEnvConnectionError(self.url, "the connection is closed")
            request_id = next(self._ids)
            try:
                self._conn.send(packb({"id": request_id, "op": op, **fields}))
                reply = unpackb(self._conn.recv(timeout=self.timeout_s))
            except TimeoutError as err:
                self._drop()
                raise RemoteEnvConnectionError(self.url, f"no reply to {op!r} within {self.timeout_s:g} s") from err
            except Exception as err:  # ConnectionClosed and friends
                self._drop()
                raise RemoteEnvConnectionError(self.url, f"connection lost during {op!r} ({err})") from err
        if not isinstance(reply, dict) or reply.get("id") != request_id:
            raise RemoteEnvProtocolError(self.url, f"the reply to {op!r} does not answer it")
        if not reply.get("ok"):
            raise self._error(reply.get("error") or {})
        return reply

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
        if kind in (ErrorKind.PROTOCOL, ErrorKind.UNKNOWN_SESSION):
            return RemoteEnvProtocolError(self.url, message)
        return RemoteEnvError(self.url, message)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close the connection; the server closes every session it held (safe to call twice)."""
        with self._lock:
            self._drop()

    @property
    def closed(self) -> bool:
        return self._conn is None


class RemoteWorldModelEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """A ``WorldModelEnv`` whose model runs in a ``worldstep serve`` process.

    Args:
        url: ``ws://host:port`` (``wss://`` for a TLS server) as ``worldstep serve`` prints it.
        token: the server's token, sent as ``Authorization: Api-Key <token>`` on the handshake.
        timeout_s: seconds to wait for each reply (and for the handshake).
        tls_ca: a PEM file of the certificate authority to trust (a self-signed server's certificate).
        render_mode: ``"rgb_array"`` (``render()`` returns the latest frame) or None.
        **env_kwargs: the served env's keywords (``max_windows``, ``prompt``, ``domain_id``, ``embodiment``,
            ``action_width``, ``image``, ``success_fn`` as ``"sim"``/``"none"``, ``resolution_tier``, ``fps``),
            checked by the server with the local env's errors.

    The session lives as long as the env: ``close()`` ends it (a later ``reset()`` opens a new one, as the local
    env does), and a lost connection ends it on the server. ``fork()`` opens a second session on the same
    connection; the connection closes with its last env.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 6, "frame_fps": 24}

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 120.0, tls_ca: str | None = None,
                 render_mode: str | None = None, **env_kwargs: Any) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} is invalid; allowed: None or 'rgb_array'")
        unknown = sorted(set(env_kwargs) - set(OPEN_KEYS))
        if unknown:
            raise TypeError(f"RemoteWorldModelEnv got an unexpected keyword argument {unknown[0]!r}; allowed: url, "
                            f"token, timeout_s, tls_ca, render_mode, {', '.join(OPEN_KEYS)}")
        self.render_mode = render_mode
        self._reopen = (url, token, timeout_s, tls_ca, env_kwargs)  # what reset() after close() opens again
        self._open_session()

    def _open_session(self) -> None:
        url, token, timeout_s, tls_ca, env_kwargs = self._reopen
        connection = ServeConnection(url, token, timeout_s=timeout_s, tls_ca=tls_ca)
        try:
            self._attach(connection, connection.request("open", env=env_kwargs))
        except BaseException:
            connection.close()
            raise

    def _attach(self, connection: ServeConnection, opened: dict[str, Any]) -> None:
        self.connection, self.session = connection, opened["session"]
        connection.sessions.add(self.session)
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
        if self.session not in self.connection.sessions:  # closed: a new session, as a local env reopens
            self._open_session()
        super().reset(seed=seed)
        reply = self._request("reset", seed=seed, options=options)
        self._frames = reply["obs"]["frames"]
        return _writable(reply["obs"]), decode_info(reply["info"])

    def step(self, actions: np.ndarray):
        reply = self._request("step", actions=np.asarray(actions))
        self._frames = reply["obs"]["frames"]
        return (_writable(reply["obs"]), float(reply["reward"]), reply["terminated"], reply["truncated"],
                decode_info(reply["info"]))

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn("You are calling render method without specifying any render mode.")
            return None
        return None if self._frames is None else self._frames[-1].copy()

    def fork(self, seed: int | None = None) -> RemoteWorldModelEnv:
        """A second env continuing this episode on the server (committed KV pages shared), as ``WorldModelEnv.fork``."""
        reply = self._request("fork", seed=seed)
        other = object.__new__(type(self))
        other.render_mode, other._reopen = self.render_mode, self._reopen
        other._attach(self.connection, reply)
        other._frames = self._frames
        return other

    def close(self) -> None:
        """End this session on the server; the connection closes with its last env (safe to call twice)."""
        users = self.connection.sessions
        if self.session not in users:
            return
        users.discard(self.session)
        try:
            if not self.connection.closed:
                self.connection.request("close", session=self.session)
        except RemoteEnvError:
            pass  # the connection is gone: the server has closed the session already
        finally:
            if not users:
                self.connection.close()

    def _request(self, op: str, **fields: Any) -> dict[str, Any]:
        if self.session not in self.connection.sessions:
            raise gym.error.ClosedEnvironmentError(f"Cannot call env.{op}() after env.close()")
        return self.connection.request(op, session=self.session, **fields)


def _writable(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays decoded from a message are read-only views of it; the local env returns its own copies."""
    return {k: np.array(v) for k, v in obs.items()}
