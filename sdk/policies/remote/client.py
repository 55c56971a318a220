"""The openpi policy protocol's client: one websocket to a policy server, and the errors of a call to one.

On connect the server sends its metadata; then every request is one msgpack-encoded observation dict
(``worldstep.wire``) and every reply one dict holding the action chunk; a server-side failure comes back as a
text frame holding the traceback. We implement this ~60-line client instead of depending on ``openpi-client``:
that package pins ``numpy<2`` (worldstep runs on numpy 2) and pulls ``dm-tree``; the wire format is the same.
"""

from __future__ import annotations

import inspect
from typing import Any

from ...wire import EXTRA_HINT, RemoteError, packb, unpackb

__all__ = [
    "PolicyClient",
    "RemotePolicyConnectionError",
    "RemotePolicyError",
    "RemotePolicyProtocolError",
    "RemotePolicyTimeout",
]


# --- errors ---------------------------------------------------------------------------------------


class RemotePolicyError(RemoteError):
    """A remote policy call failed; ``endpoint`` (the base's ``address``) names the server."""

    server = "policy server"

    @property
    def endpoint(self) -> str:
        return self.address


class RemotePolicyConnectionError(RemotePolicyError, ConnectionError):
    """The server could not be reached, or it closed the connection."""


class RemotePolicyTimeout(RemotePolicyError, TimeoutError):
    """The server did not answer within the timeout."""


class RemotePolicyProtocolError(RemotePolicyError, ValueError):
    """The server answered, but not with what the protocol or the action mapping allows."""


# --- the client -----------------------------------------------------------------------------------


def _normalise_endpoint(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ValueError(f"endpoint={endpoint!r} is invalid; allowed: 'ws://host:port', 'wss://host:port' "
                         "or 'host:port'")
    return endpoint if endpoint.startswith(("ws://", "wss://")) else f"ws://{endpoint}"


class PolicyClient:
    """One websocket connection to a policy server: ``connect()`` reads its metadata, ``infer(obs)`` asks.

    A timed-out request closes the connection (a late reply would otherwise answer the next request);
    the next ``infer`` reconnects.
    """

    def __init__(self, endpoint: str, *, timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 api_key: str | None = None) -> None:
        self.endpoint = _normalise_endpoint(endpoint)
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.connect_timeout_s = _positive("connect_timeout_s", connect_timeout_s)
        self.api_key = api_key
        self.metadata: dict[str, Any] | None = None
        self._conn = None

    def connect(self) -> dict[str, Any]:
        """Open the connection (when closed) and return the server's metadata."""
        if self._conn is not None:
            return self.metadata or {}
        try:
            from websockets.sync.client import connect
        except ImportError as err:
            raise ImportError(f"remote policies need websockets and msgpack: {EXTRA_HINT}") from err
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        # A plain connection we close ourselves (newer websockets want that said with legacy=True).
        legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        try:
            self._conn = connect(self.endpoint, open_timeout=self.connect_timeout_s, compression=None,
                                 max_size=None, additional_headers=headers, proxy=None, **legacy)
        except TimeoutError as err:
            raise RemotePolicyTimeout(self.endpoint, f"no handshake within {self.connect_timeout_s:g} s") from err
        except Exception as err:  # OSError (refused, unreachable), InvalidURI, InvalidHandshake, ...
            raise RemotePolicyConnectionError(self.endpoint, f"cannot connect ({type(err).__name__}: {err})") from err
        metadata = self._receive(self.connect_timeout_s, "metadata")
        self.metadata = metadata if isinstance(metadata, dict) else {"metadata": metadata}
        return self.metadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Send one observation and return the server's reply dict."""
        self.connect()
        try:
            data = packb(obs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"observation for {self.endpoint} cannot be encoded: {err}") from err
        try:
            self._conn.send(data)
        except Exception as err:
            self.close()
            raise RemotePolicyConnectionError(self.endpoint, f"connection lost while sending ({err})") from err
        reply = self._receive(self.timeout_s, "reply")
        if not isinstance(reply, dict):
            raise RemotePolicyProtocolError(self.endpoint, f"reply is a {type(reply).__name__}; allowed: a dict")
        return reply

    def close(self) -> None:
        """Close the connection (safe to call twice)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _receive(self, timeout_s: float, what: str) -> Any:
        try:
            message = self._conn.recv(timeout=timeout_s)
        except TimeoutError as err:
            self.close()
            raise RemotePolicyTimeout(self.endpoint, f"no {what} within {timeout_s:g} s") from err
        except Exception as err:  # ConnectionClosed and friends
            self.close()
            raise RemotePolicyConnectionError(self.endpoint, f"connection closed while waiting for the {what} "
                                                             f"({err})") from err
        if isinstance(message, str):  # openpi servers send the traceback as text, then close
            self.close()
            raise RemotePolicyError(self.endpoint, f"the server failed:\n{message}")
        try:
            return unpackb(message)
        except Exception as err:
            self.close()
            raise RemotePolicyProtocolError(self.endpoint, f"{what} is not msgpack ({err})") from err


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} is invalid; allowed: a number of seconds > 0")
    return float(value)
