"""Where a logged rollout goes: a spawned (or already running) Rerun viewer, an ``.rrd`` file, the served web viewer.

The CLI's ``--rerun``, ``--rerun-save PATH`` and ``--rerun-serve [PORT]`` (any combination) open one recording
with these sinks; :class:`worldstep.wrappers.RerunLogger` logs into it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from worldstep.engine.checks import is_int

DEFAULT_WEB_PORT = 9090
"""The web viewer's HTTP port of ``--rerun-serve`` without a number (Rerun's own default)."""
VIEWER_PORT = 9876
"""The gRPC port of the native viewer ``--rerun`` spawns or connects to (Rerun's default)."""
LOOPBACK = "127.0.0.1"


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


def open_viewer(*, spawn: bool = False, save: str | os.PathLike | None = None, serve: int | None = None,
                grpc_port: int | None = None, application_id: str = "worldstep") -> Viewer:
    """A recording streaming to every sink asked for: ``spawn`` a native viewer (or connect to one already
    listening on ``VIEWER_PORT``), ``save`` an ``.rrd`` file, ``serve`` the web viewer on this HTTP port.

    The served data stream (gRPC, on ``grpc_port``, default ``serve + 1``; 0: any free port) binds to loopback
    only; from another machine, forward both ports over SSH (``ssh -L 9090:127.0.0.1:9090 -L
    9091:127.0.0.1:9091 host``) and open the printed URL. The web viewer's HTTP server (the page and the wasm
    viewer, no data) is Rerun's own, which binds to every interface.
    """
    if not isinstance(spawn, bool):
        raise TypeError(f"spawn={spawn!r} is invalid; allowed: a bool")
    if serve is not None and (not is_int(serve) or not 0 < serve < 65536):
        raise ValueError(f"--rerun-serve {serve!r} is invalid; allowed: a TCP port in 1..65535")
    if serve is not None and grpc_port is None:
        grpc_port = serve + 1 if serve < 65535 else 0
    if grpc_port is not None and (not is_int(grpc_port) or not 0 <= grpc_port < 65536):
        raise ValueError(f"grpc_port={grpc_port!r} is invalid; allowed: None, 0 (any free port) or a TCP port")
    save_path = None if save is None else Path(save)
    if save_path is not None and save_path.suffix != ".rrd":
        raise ValueError(f"--rerun-save {str(save)!r} is invalid; allowed: a path ending in .rrd")
    if not (spawn or save_path is not None or serve is not None):
        raise ValueError("open_viewer needs at least one of spawn, save or serve")
    from .rerun_log import rerun_module

    rr = rerun_module()
    recording = rr.RecordingStream(application_id)
    sinks: list[Any] = []
    if spawn:
        recording.spawn(port=VIEWER_PORT, connect=False)
        sinks.append(rr.GrpcSink(f"rerun+http://{LOOPBACK}:{VIEWER_PORT}/proxy"))
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


def _free_port() -> int:
    """A TCP port free on loopback now (the OS picks it)."""
    import socket

    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
