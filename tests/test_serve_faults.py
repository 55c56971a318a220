"""Fault tests of ``worldstep serve`` on 127.0.0.1, bounded in count and time: four client processes step 200
windows in all through a TCP proxy that cuts connections before requests, mid-frame and after the server applied
a step but before its reply arrived; every episode's frames equal the fault-free local run's, no step is lost or
applied twice (the engine's calls and the server's own count per session), and no page is in use after the
clients close, nor after the grace period for clients killed with ``kill -9``. A server killed with ``kill -9``
and restarted gives the client a clear error, not a hang. A client that stops reading replies stalls only
itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading

import numpy as np
import pytest
from fault_proxy import FaultProxy
from serve_client import serve_actions
from test_serve import ROOT, TOKEN, WAIT_S, ask, engine_calls, local_frames, processes, serve, wait_for  # noqa: F401
from test_serve_sessions import port_of
from tiny_world import FAST, cache_dir, world  # noqa: F401 - fixtures
from worldstep.serve import PROTOCOL_VERSION, RemoteEnvConnectionError, RemoteWorldModelEnv
from worldstep.wire import packb

CLIENTS, STEPS = 4, 50  # 200 steps in all


def test_four_clients_through_a_cutting_proxy_lose_no_step_and_double_none(world, serve, engine_calls,  # noqa: F811
                                                                           processes, tmp_path):  # noqa: F811
    server = serve(max_batch=1, session_grace_s=60)  # alone in each engine call: frames exactly the local env's
    proxy = FaultProxy(port_of(server.url), seed=11, cut_probability=0.05, max_cuts=40)
    proxy.faults = False  # the sessions open and reset fault-free (a lost `open` would hold a slot for the grace)
    go, close = tmp_path / "go", tmp_path / "close"
    seeds = [21 + i for i in range(CLIENTS)]
    outs = [tmp_path / f"client{i}.npy" for i in range(CLIENTS)]
    procs = [processes("serve_client.py", proxy.url, TOKEN, str(seed), str(STEPS), str(out), str(go), str(close),
                       stderr=subprocess.PIPE, text=True) for seed, out in zip(seeds, outs)]
    try:
        wait_for(lambda: all(o.with_suffix(".ready").exists() for o in outs), "four clients reset")
        proxy.faults = True
        go.touch()
        wait_for(lambda: all(o.with_suffix(".status.json").exists() for o in outs) or
                 any(p.poll() not in (None, 0) for p in procs), "four clients stepped", timeout_s=WAIT_S * 4)
        proxy.faults = False
        close.touch()
        logs = [proc.communicate(timeout=WAIT_S)[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * CLIENTS, logs
    finally:
        proxy.close()
    cuts = dict(proxy.cuts)
    assert set(cuts) == {"before_request", "mid_frame", "after_apply"}, cuts  # every kind of fault happened
    assert sum(log.count("reconnected after") for log in logs) >= 1  # the clients' one warning line per reconnect
    assert engine_calls == [1] * (CLIENTS * STEPS)  # 0 lost, 0 doubled
    statuses = [json.loads(o.with_suffix(".status.json").read_text()) for o in outs]
    assert [(s["model_calls"], s["committed_step"], s["seq"]) for s in statuses] == [(STEPS + 1, STEPS, STEPS + 1)] \
        * CLIENTS  # the server's own count per session: one reset and STEPS steps, each applied once
    wait_for(lambda: server.open_sessions() == 0, "the clients' sessions closed")
    assert server.pages_in_use() == 0 and world.model.decoder.live_warm_sessions == 0 and proxy.threads == 0
    for seed, out in zip(seeds, outs):
        assert np.array_equal(np.load(out), local_frames(world, seed, STEPS))  # the fault-free run's frames


def test_clients_killed_with_kill_9_free_their_pages_after_the_grace_period(world, serve, processes,  # noqa: F811
                                                                             tmp_path):
    server = serve(session_grace_s=0.5)
    proxy = FaultProxy(port_of(server.url), seed=2, cut_probability=0.05, max_cuts=10)
    try:
        procs = [processes("serve_client.py", proxy.url, TOKEN, str(i), "-1", str(tmp_path / f"c{i}.npy"))
                 for i in range(2)]
        wait_for(lambda: server.loop.batches >= 6, "the clients stepping")
        assert server.pages_in_use() > 0
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=WAIT_S)
        wait_for(lambda: server.open_sessions() == 0, "the killed clients' sessions expired")
        assert server.pages_in_use() == 0 and world.model.decoder.live_warm_sessions == 0
    finally:
        proxy.close()


def start_server(processes, tmp_path, port: int = 0) -> tuple[subprocess.Popen, str]:  # noqa: F811
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    sets = [arg for key, value in FAST.items() for arg in ("--set", f"{key}={value}")]
    proc = processes("-m", "worldstep.cli", "serve", "--config", "tiny", "--device", "cpu", *sets, "--port", str(port),
                     "--token-file", str(token_file), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                     env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()
    assert line.startswith("serving on ws://127.0.0.1:"), line
    return proc, line.split()[-1]


def test_a_server_killed_and_restarted_gives_the_client_a_clear_error(processes, tmp_path, cache_dir):  # noqa: F811
    first, url = start_server(processes, tmp_path)
    env = RemoteWorldModelEnv(url, token=TOKEN, reconnect_s=WAIT_S)
    env.reset(seed=0)
    env.step(serve_actions(env.action_space.shape, 0))
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=WAIT_S)
    second, again = start_server(processes, tmp_path, port=port_of(url))
    assert again == url
    with pytest.raises(RemoteEnvConnectionError, match=rf"session {env.session} is lost \(last committed step 1.*"
                                                       "server restarted"):
        env.step(serve_actions(env.action_space.shape, 1))
    env.reset(seed=0)  # a new session of the new server
    env.close()
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=WAIT_S) == 0


def test_a_client_that_stops_reading_stalls_only_itself(world, serve):  # noqa: F811
    """Its replies fill bounded buffers (the server's send buffer, its own receive buffer), then its handler waits
    on the socket and its later steps do not run; the other client's steps go on. The injected violation: with
    the kernel's autotuned send buffer (``send_buffer_bytes=4 MiB``) every one of its steps runs."""
    from websockets.sync.client import connect

    server = serve(max_batch=1, session_grace_s=0, send_buffer_bytes=64 * 1024)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port_of(server.url)))
    slow = connect(server.url, sock=sock, additional_headers={"Authorization": f"Api-Key {TOKEN}"},
                   compression=None, max_size=None, proxy=None, max_queue=4, legacy=True)
    sent = 200
    try:
        ask(slow, {"id": 0, "op": "hello", "protocol": PROTOCOL_VERSION})
        opened = ask(slow, {"id": 1, "op": "open", "env": {"max_windows": 1000}})
        session, shape = opened["session"], tuple(opened["action_space"]["low"].shape)
        assert ask(slow, {"id": 2, "op": "reset", "session": session, "seq": 1, "seed": 0})["ok"]

        def flood() -> None:  # never reads a reply
            with contextlib.suppress(Exception):
                for k in range(sent):
                    slow.send(packb({"id": 3 + k, "op": "step", "session": session, "seq": 2 + k,
                                     "actions": serve_actions(shape, k)}))

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        calls = lambda: next(r["model_calls"] for r in server.status() if r["session"] == session)  # noqa: E731
        wait_for(lambda: calls() >= 4, "the slow client's first steps")
        fast = RemoteWorldModelEnv(server.url, token=TOKEN, max_windows=1000)
        fast.reset(seed=1)
        frames, seen = [], []  # the other client steps until the slow one made no step during its last three
        while len(seen) < 4 or len(set(seen[-4:])) > 1:
            assert len(frames) < 150, seen
            frames.append(fast.step(serve_actions(fast.action_space.shape, len(frames)))[0]["frames"])
            seen.append(calls())
        fast.close()
        assert seen[-1] < 1 + sent, seen  # the slow client's steps wait behind its unread replies
        assert np.array_equal(np.stack(frames), local_frames(world, 1, len(frames))[1:])  # the other went on
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        slow.close()
    flooder.join(timeout=WAIT_S)
    assert not flooder.is_alive()
    wait_for(lambda: server.open_sessions() == 0, "the slow client's session closed")
    assert server.pages_in_use() == 0


def test_a_reply_left_unsent_past_the_send_timeout_closes_the_connection(serve):  # noqa: F811
    """The stalled connection closes (its handler freed) and its session, nobody resuming it, closes with it."""
    from websockets.sync.client import connect

    server = serve(session_grace_s=0, send_buffer_bytes=64 * 1024, send_timeout_s=0.5)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port_of(server.url)))
    slow = connect(server.url, sock=sock, additional_headers={"Authorization": f"Api-Key {TOKEN}"},
                   compression=None, max_size=None, proxy=None, max_queue=4, legacy=True)
    try:
        ask(slow, {"id": 0, "op": "hello", "protocol": PROTOCOL_VERSION})
        opened = ask(slow, {"id": 1, "op": "open", "env": {"max_windows": 1000}})
        session, shape = opened["session"], tuple(opened["action_space"]["low"].shape)
        assert ask(slow, {"id": 2, "op": "reset", "session": session, "seq": 1, "seed": 0})["ok"]
        with contextlib.suppress(Exception):  # never reads a reply; the sends fail once the server closes
            for k in range(200):
                slow.send(packb({"id": 3 + k, "op": "step", "session": session, "seq": 2 + k,
                                 "actions": serve_actions(shape, k)}))
        # within 20 s: before the websocket keepalive (a 20 s ping, 20 s for its pong) would close it anyway
        wait_for(lambda: server.open_sessions() == 0, "the stalled connection closed", timeout_s=20)
        assert server.pages_in_use() == 0
    finally:
        sock.close()
        slow.close()
