"""Where a logged rollout goes: a spawned (or already running) Rerun viewer, an ``.rrd`` file, the served web viewer.

The CLI's ``--rerun`` (or ``--rerun-connect URL``), ``--rerun-save PATH`` and ``--rerun-serve [PORT]`` (any
combination) open one recording with these sinks; `loggers.RerunLogger` logs into it. A viewer that
cannot be reached or started is refused at once, before the rollout, so a run never streams into nothing.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from worldstep.engine.checks import is_int

DEFAULT_WEB_PORT = 9090
"""The web viewer's HTTP port of ``--rerun-serve`` without a number (Rerun's own default)."""
VIEWER_PORT = 9876
"""The gRPC port of the native viewer ``--rerun`` spawns or connects to (Rerun's default)."""
LOOPBACK = "127.0.0.1"
CONNECT_SCHEMES = {"rerun": 443, "rerun+https": 443, "rerun+http": 80}
"""The URL schemes a viewer or Rerun server accepts logging on (Rerun's own ``--connect``), with their default port."""


@dataclass
class Viewer:
    """One open recording and what it streams to."""

    recording: Any
    """the ``rerun.RecordingStream`` to log into"""
    web_url: str | None = None
    """the served web viewer's address (``serve``), with the recording's stream to open"""
    save_path: Path | None = None

    def close(self) -> None:
        """Flush everything and close the sinks (the file is complete after this)."""
        self.recording.flush()
        self.recording.disconnect()

    def wait(self, message: str = "") -> None:
        """Print ``message``, then keep serving the web viewer until Ctrl-C (the served data lives in this
        process)."""
        try:
            print(message, flush=True)
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass


def open_viewer(*, spawn: bool = False, connect: str | int | None = None, save: str | os.PathLike | None = None,
                serve: int | None = None, grpc_port: int | None = None, application_id: str = "worldstep") -> Viewer:
    """A recording streaming to every sink asked for: ``spawn`` a native viewer (or connect to one already
    listening on ``VIEWER_PORT``), ``connect`` to a running viewer or Rerun server (its URL, or a port on
    loopback), ``save`` an ``.rrd`` file, ``serve`` the web viewer on this HTTP port.

    The served data stream (gRPC, on ``grpc_port``, default ``serve + 1``; 0: any free port) binds to loopback
    only; from another machine, forward both ports over SSH (``ssh -L 9090:127.0.0.1:9090 -L
    9091:127.0.0.1:9091 host``) and open the printed URL. The web viewer's HTTP server (the page and the wasm
    viewer, no data) is Rerun's own, which binds to every interface.
    """
    if not isinstance(spawn, bool):
        raise TypeError(f"spawn={spawn!r} is invalid; allowed: a bool")
    if spawn and connect is not None:
        raise ValueError(f"--rerun with --rerun-connect {connect!r} is invalid; allowed: one of them (--rerun "
                         f"connects to the viewer on port {VIEWER_PORT} or spawns one)")
    connect_url = None if connect is None else viewer_url(connect)
    if serve is not None and (not is_int(serve) or not 0 < serve < 65536):
        raise ValueError(f"--rerun-serve {serve!r} is invalid; allowed: a TCP port in 1..65535")
    if serve is not None and grpc_port is None:
        grpc_port = serve + 1 if serve < 65535 else 0
    if grpc_port is not None and (not is_int(grpc_port) or not 0 <= grpc_port < 65536):
        raise ValueError(f"grpc_port={grpc_port!r} is invalid; allowed: None, 0 (any free port) or a TCP port")
    save_path = None if save is None else Path(save)
    if save_path is not None and save_path.suffix != ".rrd":
        raise ValueError(f"--rerun-save {str(save)!r} is invalid; allowed: a path ending in .rrd")
    if not (spawn or connect_url is not None or save_path is not None or serve is not None):
        raise ValueError("open_viewer needs at least one of spawn, connect, save or serve")
    if connect_url is not None and not _answers(connect_url):
        raise ValueError(f"--rerun-connect {connect!r} is invalid: nothing answers at {connect_url}; allowed: the "
                         "URL of a running Rerun viewer or server (`rerun`, `rerun --serve-grpc`)")
    viewer_port = VIEWER_PORT
    spawn_needed = spawn and not _answers(f"rerun+http://{LOOPBACK}:{viewer_port}/proxy")
    if spawn_needed:
        _check_can_spawn(viewer_port)
    from .rerun_log import rerun_module

    rr = rerun_module()
    recording = rr.RecordingStream(application_id)
    sinks: list[Any] = []
    if spawn:
        connect_url = f"rerun+http://{LOOPBACK}:{viewer_port}/proxy"
    if spawn_needed:
        recording.spawn(port=viewer_port, connect=False)  # waits a few seconds for the viewer, then gives up
        if not _answers(connect_url):
            raise RuntimeError(f"--rerun: the Rerun viewer spawned from {shutil.which('rerun')} did not listen on "
                               f"{LOOPBACK}:{viewer_port}; run `rerun` by hand to see why, or use --rerun-serve or "
                               "--rerun-save")
    if connect_url is not None:
        sinks.append(rr.GrpcSink(connect_url))
    if save_path is not None:
        save_path.parent.mkdir(parents=True, exist_ok=True)
        sinks.append(rr.FileSink(save_path))
    web_url = None
    if serve is not None:
        server = rr.GrpcServerSink(bind_ip=LOOPBACK, port=grpc_port or _free_port())
        sinks.append(server)
    recording.set_sinks(*sinks)
    if serve is not None:
        rr.serve_web_viewer(web_port=serve, open_browser=False, connect_to=server.uri)
        web_url = f"http://{LOOPBACK}:{serve}/?url={quote(server.uri, safe='')}"
    return Viewer(recording, web_url, save_path)


def viewer_url(connect: str | int) -> str:
    """``--rerun-connect``'s value as a Rerun proxy URL: a port means the viewer on loopback (as ``rerun
    --connect PORT``); a URL keeps its scheme, host and port and must end in ``/proxy``."""
    allowed = ("a TCP port (the viewer on 127.0.0.1) or a URL rerun+http://HOST:PORT/proxy (rerun+https:// and "
               "rerun:// too)")
    text = str(connect).strip()
    if is_int(connect) or text.isdigit():
        port = int(text)
        if not 0 < port < 65536:
            raise ValueError(f"--rerun-connect {connect!r} is invalid; allowed: {allowed}")
        return f"rerun+http://{LOOPBACK}:{port}/proxy"
    if not isinstance(connect, str):
        raise ValueError(f"--rerun-connect {connect!r} is invalid; allowed: {allowed}")
    parts = urlsplit(text)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:  # a port that is not a number
        port_ok = False
    if parts.scheme not in CONNECT_SCHEMES or not parts.hostname or parts.path != "/proxy" or not port_ok or \
            parts.query or parts.fragment:
        raise ValueError(f"--rerun-connect {connect!r} is invalid; allowed: {allowed}")
    return text


def _answers(url: str, timeout_s: float = 5.0) -> bool:
    """Whether something accepts TCP connections at a proxy URL's host and port (bounded by ``timeout_s``)."""
    parts = urlsplit(url)
    port = parts.port or CONNECT_SCHEMES[parts.scheme]
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _check_can_spawn(port: int) -> None:
    """Refuse ``--rerun`` at once where no native viewer can start (no executable, no display), rather than
    log a whole rollout into a connection that never opens."""
    instead = ("--rerun-serve [PORT] (the web viewer, in a browser here or over SSH), --rerun-save PATH.rrd, or "
               "--rerun-connect URL (a viewer running elsewhere)")
    if shutil.which("rerun") is None:
        raise FileNotFoundError(f"--rerun: no Rerun viewer listens on {LOOPBACK}:{port} and no `rerun` executable "
                                "is on PATH to spawn one; allowed: install it (pip install 'worldstep[view]' puts "
                                f"`rerun` beside python), start `rerun` yourself, or {instead}")
    if sys.platform.startswith("linux") and not any(os.environ.get(name) for name in
                                                    ("DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET")):
        raise ValueError(f"--rerun: no Rerun viewer listens on {LOOPBACK}:{port} and a native viewer needs a "
                         f"display, which is missing here (DISPLAY and WAYLAND_DISPLAY are unset); allowed: "
                         f"{instead}")


def _free_port() -> int:
    """A TCP port free on loopback now (the OS picks it)."""
    import socket

    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
