"""A TCP proxy on 127.0.0.1 that cuts connections at seeded random points (the serve fault tests' network).

Each connection's bytes are pumped both ways. After the websocket handshake (each direction's first chunk,
never cut) every chunk may, with ``cut_probability`` and while ``cuts`` stays under ``max_cuts``, end the
connection instead of passing:

- ``before_request``: a client chunk (a request) is dropped, so the server never sees it;
- ``mid_frame``: only part of a client chunk is passed, so the server sees half a frame;
- ``after_apply``: a server chunk (a reply: the server has applied the request) is dropped.

Upstream cuts alternate between the first two kinds. ``faults = False`` stops cutting. ``close()`` stops the
proxy and closes every socket and joins every thread it started (counted by ``threads``).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections import Counter

__all__ = ["FaultProxy"]

CHUNK = 65536


class FaultProxy:
    def __init__(self, target_port: int, seed: int = 0, cut_probability: float = 0.05, max_cuts: int = 40) -> None:
        self.target_port = target_port
        self.cut_probability, self.max_cuts = cut_probability, max_cuts
        self.cuts: Counter[str] = Counter()
        self.connections = 0
        self.faults = True
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._upstream_kinds = ["before_request", "mid_frame"]
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._closing = False
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self._listener.getsockname()[1]}"

    @property
    def threads(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self._sockets |= {client, server}
            pair = (client, server)
            self._spawn(self._pump, client, server, "up", pair)
            self._spawn(self._pump, server, client, "down", pair)

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str, pair) -> None:
        first = True
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                kind = None if first else self._draw(direction, len(data))
                first = False
                if kind == "mid_frame":
                    dst.sendall(data[: max(1, len(data) // 2)])
                if kind is not None:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._cut(pair)

    def _draw(self, direction: str, size: int) -> str | None:
        with self._lock:
            if not self.faults or sum(self.cuts.values()) >= self.max_cuts:
                return None
            if self._rng.random() >= self.cut_probability:
                return None
            if direction == "down":
                kind = "after_apply"
            else:
                kind = self._upstream_kinds[sum(self.cuts[k] for k in self._upstream_kinds) % 2]
                if kind == "mid_frame" and size < 2:
                    kind = "before_request"
            self.cuts[kind] += 1
            return kind

    def _cut(self, pair) -> None:
        for sock in pair:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            self._sockets -= set(pair)

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=10)
