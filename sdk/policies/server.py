"""A small openpi-protocol policy server: serve any ``obs -> {"actions": ...}`` function over a websocket.

It exists so remote-policy evaluation can be tried and tested without a trained policy: tests and
``examples/remote_policy_eval.py --serve-demo`` run it in a thread on 127.0.0.1. It binds to loopback by
default, answers a bounded number of requests per connection and shuts itself down after ``lifetime_s``.
For real policies use openpi's own ``serve_policy.py``; the wire format is the same.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
from worldstep.engine.checks import check_int

from ..wire import packb, unpackb

__all__ = ["PolicyServer", "demo_policy"]

InferFn = Callable[[dict[str, Any]], dict[str, Any]]


class PolicyServer:
    """Serve ``infer(obs) -> reply`` on ``ws://host:port`` (port 0 picks a free one) in a daemon thread.

    Protocol per connection: send ``metadata``; then, for at most ``max_requests`` messages, unpack the
    observation, call ``infer`` and send the packed reply. An exception in ``infer`` is sent back as a text
    frame holding the traceback, then the connection closes (what openpi's server does).

    ```python
    with PolicyServer(demo_policy(4, 10)) as server:
        policy = RemotePolicy(server.endpoint, (4, 10), prompt="push the block")
    ```
    """

    def __init__(self, infer: InferFn, *, host: str = "127.0.0.1", port: int = 0,
                 metadata: dict[str, Any] | None = None, max_requests: int = 100_000,
                 lifetime_s: float = 3600.0) -> None:
        if not callable(infer):
            raise TypeError(f"infer={infer!r} is invalid; allowed: a callable obs dict -> reply dict")
        check_int("max_requests", max_requests, 1)
        if not lifetime_s > 0:
            raise ValueError(f"lifetime_s={lifetime_s!r} is invalid; allowed: seconds > 0")
        self.infer = infer
        self.host, self.port = host, port
        self.metadata = dict(metadata or {})
        self.max_requests = max_requests
        self.lifetime_s = float(lifetime_s)
        self.requests = 0  # requests answered, over all connections
        self._server = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not running; call start() first")
        return f"ws://{self.host}:{self.port}"

    def start(self) -> PolicyServer:
        """Bind and serve in a daemon thread; returns self."""
        from websockets.sync.server import serve

        if self._server is not None:
            return self
        self._server = serve(self._handle, self.host, self.port, compression=None, max_size=None)
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="worldstep-policy-server",
                                        daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.lifetime_s, self.stop)  # stops by itself
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop serving (safe to call twice)."""
        server, self._server = self._server, None
        if self._timer is not None:
            self._timer.cancel()
        if server is not None:
            server.shutdown()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handle(self, conn) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            conn.send(packb(self.metadata))
            for _ in range(self.max_requests):
                obs = unpackb(conn.recv())
                try:
                    reply = self.infer(obs)
                except Exception:
                    conn.send(traceback.format_exc())
                    conn.close(code=1011, reason="policy raised")
                    return
                conn.send(packb(reply))
                self.requests += 1
        except ConnectionClosed:
            return


def demo_policy(chunk_size: int, action_width: int, horizon: int | None = None) -> InferFn:
    """A closed-loop stand-in policy: smooth motion whose phase follows the latest image's brightness.

    Reads ``observation/image`` (``(H, W, 3)`` uint8) when present and returns ``{"actions": (horizon,
    action_width)}`` in [-0.8, 0.8], ``horizon`` defaulting to ``chunk_size``. Deterministic in the
    observation, so the same episode gives the same actions.
    """
    horizon = chunk_size if horizon is None else horizon

    def infer(obs: dict[str, Any]) -> dict[str, Any]:
        image = obs.get("observation/image")
        phase = 0.0 if image is None else float(np.asarray(image, np.float32).mean()) / 255.0
        t = np.arange(horizon)[:, None] / 12.0 + np.arange(action_width)[None, :] / action_width
        return {"actions": (0.8 * np.sin(2 * np.pi * (t + phase))).astype(np.float32)}

    return infer
