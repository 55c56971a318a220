"""``worldstep serve``: load one model and serve it until SIGTERM or Ctrl-C, then drain and exit 0."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..flags import add_flags, flag, from_namespace, positive_int

__all__ = ["ServeFlags", "add_parser", "cmd_serve", "read_token"]

LOOPBACK = ("127.0.0.1", "::1", "localhost")


ModelFlags = Callable[[argparse.Namespace], tuple[str, dict[str, Any]]]


def add_parser(sub: argparse._SubParsersAction, add_model_flags: Callable[[argparse.ArgumentParser], None],
               model_and_overrides: ModelFlags) -> None:
    """Add ``serve`` to ``worldstep``'s subcommands, with the model flags every command shares."""
    p = sub.add_parser("serve", help="serve one loaded model to many env clients over a websocket "
                                     "(docs/serving.md)")
    add_model_flags(p)
    add_flags(p, ServeFlags)
    p.set_defaults(func=functools.partial(cmd_serve, model_and_overrides=model_and_overrides))


@dataclass
class ServeFlags:
    """``worldstep serve``'s own flags (beside the model flags); ``cmd_serve`` turns them into ``ServeOptions``."""

    host: str = flag("address to bind (127.0.0.1: loopback only)", default="127.0.0.1")
    port: int = flag("port (0: a free one; the first line printed says which)", default=0)
    token_file: str | None = flag("file holding the token clients must send (Authorization: Api-Key)", default=None)
    max_sessions: int = flag("open sessions over all clients", default=64, type=positive_int)
    max_batch: int = flag("steps in one engine call", default=16, type=positive_int)
    max_wait_ms: float = flag("how long a step waits for other clients' steps to join its batch", default=2.0)
    idle_timeout_s: float = flag("close a connection silent this long (its sessions then wait for a resume)",
                                 default=300.0)
    session_grace_s: float = flag("how long a dropped connection's sessions wait for the client to resume them "
                                  "before they close and free their pages", default=60.0)
    send_buffer_bytes: int | None = flag("kernel send buffer of each connection (default 4 MiB): a client that "
                                         "stops reading stalls only itself once it is full", default=None,
                                         type=positive_int)
    send_timeout_s: float | None = flag("close a connection whose reply stays unsent this long (default 60; its "
                                        "sessions then wait for a resume)", default=None)
    max_message_bytes: int | None = flag("largest request accepted (default 8 MiB); a bigger one closes its "
                                         "connection", default=None, type=positive_int)
    tls_cert: str | None = flag("PEM certificate chain: serve wss://", default=None)
    tls_key: str | None = flag("PEM private key of --tls-cert", default=None)


def read_token(path: str | None) -> str | None:
    """The token in ``path`` (surrounding whitespace stripped), or None without a file."""
    if path is None:
        return None
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--token-file {path!r} does not exist")
    token = file.read_text().strip()
    if not token or not token.isprintable():
        raise ValueError(f"--token-file {path!r} is invalid: allowed: one non-empty printable line")
    return token


def cmd_serve(args: argparse.Namespace, model_and_overrides: ModelFlags) -> int:
    """Load the model of ``args``, serve it, and drain on SIGTERM or Ctrl-C."""
    from ..world import load
    from .server import ServeOptions, WorldModelServer

    given = dataclasses.asdict(from_namespace(ServeFlags, args))
    given["token"] = read_token(given.pop("token_file"))
    options = ServeOptions(**{k: v for k, v in given.items() if v is not None})
    if options.host not in LOOPBACK and options.token is None:
        print(f"worldstep serve: warning: --host {options.host} without --token-file admits anyone who can reach "
              "it (docs/serving.md)", file=sys.stderr)
    model, overrides = model_and_overrides(args)
    server = WorldModelServer(load(model, **overrides), options)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    print(f"serving on {server.url}", flush=True)
    while not stop.wait(0.5):
        pass
    print("draining: no new sessions; finishing in-flight steps", file=sys.stderr, flush=True)
    sessions = server.open_sessions()
    server.drain()
    print(f"drained: closed {sessions} sessions; KV pages in use {server.pages_in_use()}", file=sys.stderr,
          flush=True)
    return 0
