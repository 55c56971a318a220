"""`make view-check`: headless Chromium opens the served web viewer on a recorded rollout and takes a screenshot.

Runs the demo's rollout (the pusher model with its simulator beside it) with `--rerun-serve` and
`--rerun-save`, opens the printed URL in Debian's Chromium (headless, software WebGL), waits for the viewer to
load the stream, and writes `docs/images/rerun_viewer.png` through the DevTools protocol. Not part of
`make test`: it needs `apt-get install chromium` and about a minute.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = ["rollout", "--env", "worldstep/Pusher-v0", "--policy", "push", "--windows", "16", "--seed", "20000000",
           "--truth", "--quiet"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_rollout(folder: Path, port: int) -> tuple[subprocess.Popen, str]:
    """The rollout, served: returns the process (serving until SIGINT) and the web viewer's URL."""
    cmd = [sys.executable, "-m", "worldstep.cli", *ROLLOUT, "--out", str(folder / "rollout.mp4"),
           "--rerun-save", str(folder / "rollout.rrd"), "--rerun-serve", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = None
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith("watch it live: "):
            url = line.split(": ", 1)[1].strip()
        if line.startswith("serving the web viewer"):
            return proc, url
    raise RuntimeError(f"the rollout exited ({proc.wait()}) before serving the viewer")


def screenshot(chromium: str, url: str, out: Path, wait_s: float, size: tuple[int, int]) -> None:
    """Open ``url`` in headless Chromium, wait ``wait_s`` seconds of real time, save a PNG of the page."""
    debug_port = free_port()
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
             f"--window-size={size[0]},{size[1]}", f"--remote-debugging-port={debug_port}",
             "--remote-allow-origins=*", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            page = _first_page(debug_port)
            with connect(page["webSocketDebuggerUrl"], max_size=2**26) as ws:
                _call(ws, 1, "Page.navigate", url=url)
                time.sleep(wait_s)
                shot = _call(ws, 2, "Page.captureScreenshot", format="png")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            browser.terminate()
            browser.wait(timeout=30)


def _first_page(port: int) -> dict:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                pages = [t for t in json.load(response) if t.get("type") == "page"]
            if pages:
                return pages[0]
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("headless Chromium did not open its DevTools port within 30 s")
        time.sleep(0.5)


def _call(ws, call_id: int, method: str, **params) -> dict:
    ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
    while True:
        message = json.loads(ws.recv())
        if message.get("id") == call_id:
            if "error" in message:
                raise RuntimeError(f"{method}: {message['error']}")
            return message["result"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "rerun_viewer.png"), help="screenshot path")
    parser.add_argument("--wait", type=float, default=45.0, help="seconds the viewer gets to load (default 45)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("view-check: chromium is not installed (apt-get install -y chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        proc, url = serve_rollout(Path(folder), free_port())
        try:
            screenshot(chromium, url, Path(args.out), args.wait, (1600, 1000))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    print(f"screenshot of {url}: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
