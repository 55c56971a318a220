"""``worldstep serve``: load one model and serve it until SIGTERM or Ctrl-C, then drain and exit 0."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "cmd_serve", "read_token"]

LOOPBACK = ("127.0.0.1", "::1", "localhost")


ModelFlags = Callable[[argparse.Namespace], tuple[str, dict[str, Any]]]


def add_parser(sub: argparse._SubParsersAction, add_model_flags: Callable[[argparse.ArgumentParser], None],
               model_and_overrides: ModelFlags) -> None:
    """Add ``serve`` to ``worldstep``'s subcommands, with the model flags every command shares."""
    p = sub.add_parser("serve", help="serve one loaded model to many env clients over a websocket "
                                     "(docs/serving.md)")
    add_model_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one; the first line printed "
                                                       "says which)")
    p.add_argument("--token-file", help="file holding the token clients must send (Authorization: Api-Key)")
    p.add_argument("--max-sessions", type=_positive_int, default=64, help="open sessions over all clients "
                                                                         "(default 64)")
    p.add_argument("--max-batch", type=_positive_int, default=16, help="steps in one engine call (default 16)")
    p.add_argument("--max-wait-ms", type=float, default=2.0,
                   help="how long a step waits for other clients' steps to join its batch (default 2)")
    p.add_argument("--idle-timeout-s", type=float, default=300.0,
                   help="close a connection silent this long, freeing its sessions (default 300)")
    p.add_argument("--max-message-bytes", type=_positive_int, default=None,
                   help="largest request accepted (default 8 MiB); a bigger one closes its connection")
    p.add_argument("--tls-cert", help="PEM certificate chain: serve wss://")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.set_defaults(func=functools.partial(cmd_serve, model_and_overrides=model_and_overrides))


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: an int >= 1")
    return int(text)


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

    options = ServeOptions(**{k: v for k, v in dict(
        host=args.host, port=args.port, token=read_token(args.token_file), max_sessions=args.max_sessions,
        max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, idle_timeout_s=args.idle_timeout_s,
        max_message_bytes=args.max_message_bytes, tls_cert=args.tls_cert, tls_key=args.tls_key).items()
        if v is not None})
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
