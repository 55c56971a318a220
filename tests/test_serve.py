"""``worldstep serve`` on 127.0.0.1: remote envs equal local ones, sessions belong to their connection, the
server refuses bad tokens and hostile messages and keeps serving, batches steps across clients, and every
session's pages come back on close, disconnect, kill -9, idle timeout and drain. Every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from serve_client import serve_actions
from tiny_world import FAST, assert_frames_match_batched, cache_dir, world  # noqa: F401 - fixtures
from worldstep.envs import fork_env
from worldstep.serve import (
    RemoteEnvAuthError,
    RemoteEnvConnectionError,
    RemoteEnvProtocolError,
    RemoteWorldModelEnv,
    ServerFullError,
)
from worldstep.serve.server import WorldModelServer
from worldstep.wire import packb, unpackb

TOKEN = "t0ken-for-tests"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WAIT_S = 60  # bound on every wait for a condition


def wait_for(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout_s} s")
        time.sleep(0.02)


@pytest.fixture
def serve(world):  # noqa: F811
    """Start servers of the module's tiny world; each is drained at the end and its pages checked back."""
    servers = []

    def start(**kwargs) -> WorldModelServer:
        server = WorldModelServer(world, **{"token": TOKEN, **kwargs}).start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.drain()
            assert server.open_sessions() == 0 and server.pages_in_use() == 0


@pytest.fixture
def engine_calls(world, monkeypatch):  # noqa: F811
    """Counts ``model.step`` calls and their batch sizes."""
    calls: list[int] = []
    step = world.model.step

    def counted(sessions, actions, **kwargs):
        calls.append(len(sessions))
        return step(sessions, actions, **kwargs)

    monkeypatch.setattr(world.model, "step", counted)
    return calls


@pytest.fixture
def processes():
    """Popen helper whose processes are always killed and reaped."""
    started: list[subprocess.Popen] = []

    def spawn(*args: str, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, *args], cwd=HERE, **kwargs)
        started.append(proc)
        return proc

    try:
        yield spawn
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=WAIT_S)


def raw_connection(url: str, token: str | None = TOKEN, hello: bool = True):
    from websockets.sync.client import connect

    conn = connect(url, additional_headers={"Authorization": f"Api-Key {token}"} if token else None,
                   compression=None, max_size=None, proxy=None, legacy=True)
    if hello:
        conn.send(packb({"id": 0, "op": "hello", "protocol": worldstep.serve.PROTOCOL_VERSION}))
        assert unpackb(conn.recv(timeout=WAIT_S))["ok"]
    return conn


def ask(conn, message) -> dict:
    conn.send(message if isinstance(message, (bytes, str)) else packb(message))
    return unpackb(conn.recv(timeout=WAIT_S))


def local_frames(world, seed: int, steps: int) -> np.ndarray:  # noqa: F811
    env = worldstep.make_env(world, max_windows=64)
    obs, _ = env.reset(seed=seed)
    frames = [obs["frames"]]
    for k in range(steps):
        frames.append(env.step(serve_actions(env.action_space.shape, k))[0]["frames"])
    env.close()
    return np.stack(frames)


# --- the env over the wire -----------------------------------------------------------------------


def test_remote_env_equals_the_local_env(world, serve):  # noqa: F811
    server = serve()
    remote = gym.make("worldstep/Remote-v0", url=server.url, token=TOKEN, max_windows=2)
    local = worldstep.make_env(world, max_windows=2)
    try:
        assert remote.action_space == local.action_space and remote.observation_space == local.observation_space
        assert remote.unwrapped.metadata["render_fps"] == local.metadata["render_fps"]
        (a, ia), (b, ib) = remote.reset(seed=5), local.reset(seed=5)
        assert np.array_equal(a["frames"], b["frames"]) and ia == ib
        for k in range(2):
            actions = serve_actions(local.action_space.shape, k)
            got, want = remote.step(actions), local.step(actions)
            assert np.array_equal(got[0]["frames"], want[0]["frames"])  # one session: the same engine calls
            assert got[1:4] == want[1:4] and got[4] == want[4] and type(got[4]["kv"]) is type(want[4]["kv"])
        assert got[3] is True  # truncated at the server env's max_windows, as locally
        # a fork continues the episode on the server, sharing its pages
        remote.reset(seed=1)
        local.reset(seed=1)
        fork_r, fork_l = remote.unwrapped.fork(seed=9), fork_env(local, seed=9)
        actions = serve_actions(local.action_space.shape, 3)
        assert np.array_equal(fork_r.step(actions)[0]["frames"], fork_l.step(actions)[0]["frames"])
        fork_r.close()
        fork_l.close()
    finally:
        remote.close()
        local.close()
    assert server.open_sessions() == 0


def test_remote_env_passes_gymnasiums_env_checker(serve):
    from gymnasium.utils.env_checker import check_env

    server = serve()
    env = RemoteWorldModelEnv(server.url, token=TOKEN, max_windows=4)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_remote_env_raises_the_local_errors(world, serve):  # noqa: F811
    server = serve()
    env = RemoteWorldModelEnv(server.url, token=TOKEN)
    try:
        with pytest.raises(gym.error.ResetNeeded):
            env.step(np.zeros(env.action_space.shape, np.float32))
        env.reset(seed=0)
        with pytest.raises(ValueError, match="NaN"):
            env.step(np.full(env.action_space.shape, np.nan, np.float32))
        with pytest.raises(ValueError, match=r"actions.shape=\(2, 2\) is invalid"):
            env.step(np.zeros((2, 2), np.float32))
        with pytest.raises(ValueError, match=r"options\['promt'\] is invalid \(did you mean 'prompt'\?\)"):
            env.reset(options={"promt": "x"})
        env.step(np.zeros(env.action_space.shape, np.float32))  # the session survived every refusal
    finally:
        env.close()
    with pytest.raises(gym.error.ClosedEnvironmentError):
        env.step(np.zeros(env.action_space.shape, np.float32))
    env.reset(seed=0)  # a reset after close opens a new session, as the local env does
    assert server.open_sessions() == 1
    env.close()
    with pytest.raises(TypeError, match="unexpected keyword argument 'frameskip'"):
        RemoteWorldModelEnv(server.url, token=TOKEN, frameskip=4)
    with pytest.raises(ValueError, match="max_windows"):
        RemoteWorldModelEnv(server.url, token=TOKEN, max_windows=0)
    assert server.open_sessions() == 0


def test_another_protocol_version_gets_a_clear_error(serve, monkeypatch):
    server = serve()
    monkeypatch.setattr(worldstep.serve.client, "PROTOCOL_VERSION", 99)
    speaks = f"this server speaks protocol {worldstep.serve.PROTOCOL_VERSION}"
    with pytest.raises(RemoteEnvProtocolError, match=f"protocol 99 is invalid; {speaks}"):
        RemoteWorldModelEnv(server.url, token=TOKEN)


def test_hello_names_model_embodiments_spaces_and_version(serve):
    server = serve()
    conn = raw_connection(server.url, hello=False)
    try:
        version = worldstep.serve.PROTOCOL_VERSION
        reply = ask(conn, {"id": 3, "op": "hello", "protocol": version})
        assert reply["ok"] and reply["id"] == 3 and reply["protocol"] == version and reply["model"] == "tiny"
        assert reply["embodiments"] and reply["env"]["action_space"]["kind"] == "box"
    finally:
        conn.close()


# --- four client processes, one server -----------------------------------------------------------


def test_four_client_processes_batch_into_one_engine_call_per_step(world, serve, engine_calls, processes,  # noqa: F811
                                                                  tmp_path):
    steps, seeds = 3, [11, 12, 13, 14]
    server = serve(max_batch=4, max_wait_ms=10_000)  # a batch closes once all four open sessions joined
    go = tmp_path / "go"
    outs = [tmp_path / f"client{i}.npy" for i in range(4)]
    procs = [processes("serve_client.py", server.url, TOKEN, str(s), str(steps), str(o), str(go))
             for s, o in zip(seeds, outs)]
    wait_for(lambda: all(o.with_suffix(".ready").exists() for o in outs), "four clients reset")
    assert server.open_sessions() == 4 and engine_calls == []
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=WAIT_S * 3) == 0
    assert engine_calls == [4] * steps  # one engine call per step for all four clients
    assert list(server.loop.batch_sizes) == [4] * steps
    assert len(server.loop.batch_seconds) == steps and all(t > 0 for t in server.loop.batch_seconds)
    for seed, out in zip(seeds, outs):
        got, want = np.load(out), local_frames(world, seed, steps)
        assert np.array_equal(got[0], want[0])
        assert_frames_match_batched(got[1:], want[1:])
    assert server.open_sessions() == 0 and server.pages_in_use() == 0


def test_a_slow_client_does_not_stall_the_others_beyond_max_wait(serve, engine_calls):
    server = serve(max_wait_ms=50)
    fast, slow = (RemoteWorldModelEnv(server.url, token=TOKEN) for _ in range(2))
    try:
        fast.reset(seed=0)
        slow.reset(seed=1)  # open, but it never steps
        for k in range(3):
            fast.step(serve_actions(fast.action_space.shape, k))
        assert engine_calls == [1, 1, 1]  # each batch closed at the wait's end without the slow session
    finally:
        fast.close()
        slow.close()


# --- lifecycle and capacity ----------------------------------------------------------------------


def test_kill_9_of_a_client_mid_stepping_frees_its_pages(serve, processes, tmp_path):
    server = serve(idle_timeout_s=30, session_grace_s=0)  # grace: tests/test_serve_faults.py
    out = tmp_path / "client.npy"
    proc = processes("serve_client.py", server.url, TOKEN, "0", "-1", str(out))
    wait_for(lambda: server.loop.batches >= 2, "the client stepping")
    assert server.pages_in_use() > 0
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=WAIT_S)
    wait_for(lambda: server.open_sessions() == 0, "the killed client's session closed", timeout_s=30)
    assert server.pages_in_use() == 0


def test_idle_timeout_closes_the_session_and_frees_its_pages(serve):
    server = serve(idle_timeout_s=0.3, session_grace_s=0)  # no grace: the session closes with its connection
    env = RemoteWorldModelEnv(server.url, token=TOKEN)
    env.reset(seed=0)
    assert server.pages_in_use() > 0
    wait_for(lambda: server.open_sessions() == 0, "the idle session closed", timeout_s=30)
    assert server.pages_in_use() == 0
    with pytest.raises(RemoteEnvConnectionError):
        env.step(np.zeros(env.action_space.shape, np.float32))
    env.close()


def test_a_full_server_refuses_with_capacity_and_retry_delay_and_serves_the_others(serve):
    server = serve(max_sessions=2, retry_after_s=2.5)
    a, b = (RemoteWorldModelEnv(server.url, token=TOKEN) for _ in range(2))
    try:
        a.reset(seed=0)
        with pytest.raises(ServerFullError, match="server full: 2 of 2 sessions in use; retry in 2.5 s") as info:
            RemoteWorldModelEnv(server.url, token=TOKEN)
        assert info.value.retry_after_s == 2.5
        with pytest.raises(ServerFullError):
            a.fork()
        a.step(np.zeros(a.action_space.shape, np.float32))  # the others are still served
        b.close()
        c = RemoteWorldModelEnv(server.url, token=TOKEN)  # a freed slot admits again
        c.close()
    finally:
        a.close()
        b.close()


# --- security ------------------------------------------------------------------------------------


def test_a_wrong_or_missing_token_is_refused_before_any_model_work(serve, engine_calls):
    server = serve()
    for token in ("wrong", None, TOKEN + "x"):
        with pytest.raises(RemoteEnvAuthError, match="HTTP 401"):
            RemoteWorldModelEnv(server.url, token=token)
    assert server.open_sessions() == 0 and engine_calls == []
    RemoteWorldModelEnv(server.url, token=TOKEN).close()


def test_the_token_test_fails_when_the_check_is_removed(serve, monkeypatch):
    """The injected violation: a compare that accepts anything lets a wrong token in."""
    server = serve()
    monkeypatch.setattr("worldstep.serve.server.hmac.compare_digest", lambda a, b: True)
    RemoteWorldModelEnv(server.url, token="wrong").close()


def test_sessions_belong_to_their_connection(serve):
    server = serve()
    owner = RemoteWorldModelEnv(server.url, token=TOKEN)
    intruder = raw_connection(server.url)
    try:
        owner.reset(seed=0)
        assert len(owner.session) >= 32  # 24 random bytes
        for op in ("step", "reset", "fork", "close"):
            fields = {"actions": np.zeros(owner.action_space.shape, np.float32)} if op == "step" else {}
            if op != "close":
                fields["seq"] = 2  # the owner's next number: only the connection stops the intruder
            reply = ask(intruder, {"id": 1, "op": op, "session": owner.session, **fields})
            assert not reply["ok"] and reply["error"]["kind"] == "unknown_session"
        assert server.open_sessions() == 1
        owner.step(np.zeros(owner.action_space.shape, np.float32))  # untouched
    finally:
        intruder.close()
        owner.close()


def test_requests_before_hello_and_oversized_messages_are_refused(serve):
    server = serve(max_message_bytes=4096)
    conn = raw_connection(server.url, hello=False)
    try:
        reply = ask(conn, {"id": 1, "op": "open", "env": {}})
        assert reply["error"]["kind"] == "protocol" and "before hello" in reply["error"]["message"]
        conn.send(b"\x00" * 10_000)
        with pytest.raises(Exception, match="1009|too big"):
            conn.recv(timeout=WAIT_S)  # the connection closes with 1009 (message too big)
    finally:
        conn.close()
    env = RemoteWorldModelEnv(server.url, token=TOKEN)  # the server still serves
    env.reset(seed=0)
    env.close()


def test_tls_serves_wss(world, serve, tmp_path):  # noqa: F811
    cert, key = self_signed_certificate(tmp_path)
    server = serve(tls_cert=str(cert), tls_key=str(key))
    assert server.url.startswith("wss://127.0.0.1:")
    with pytest.raises(RemoteEnvConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        RemoteWorldModelEnv(server.url, token=TOKEN)  # an untrusted certificate is refused
    env = RemoteWorldModelEnv(server.url, token=TOKEN, tls_ca=str(cert))
    try:
        obs, _ = env.reset(seed=2)
        assert obs["frames"].shape == env.observation_space["frames"].shape
    finally:
        env.close()


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 made with the openssl command line (no Python dependency)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=WAIT_S)
    return cert, key


# --- the command -----------------------------------------------------------------------------------


def test_worldstep_serve_prints_its_url_and_drains_on_sigterm(processes, tmp_path, cache_dir):  # noqa: F811
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    sets = [arg for key, value in FAST.items() for arg in ("--set", f"{key}={value}")]
    proc = processes("-m", "worldstep.cli", "serve", "--config", "tiny", "--device", "cpu", *sets,
                     "--token-file", str(token_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()
    assert line.startswith("serving on ws://127.0.0.1:"), line + proc.stderr.read()
    url = line.split()[-1]
    env = RemoteWorldModelEnv(url, token=TOKEN, reconnect_s=WAIT_S)  # the drain says why: no reconnect budget spent
    env.reset(seed=0)
    errors: list[Exception] = []

    def keep_stepping() -> None:
        try:
            while True:
                env.step(np.zeros(env.action_space.shape, np.float32))
        except Exception as err:  # the drain closes the connection
            errors.append(err)

    stepper = threading.Thread(target=keep_stepping, daemon=True)
    stepper.start()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == 0
    stepper.join(timeout=WAIT_S)
    assert isinstance(errors[0], RemoteEnvConnectionError) and "server shut down; session" in str(errors[0])
    assert env.connection.reconnects == 0
    stderr = proc.stderr.read()
    assert "drained: closed 1 sessions; KV pages in use 0" in stderr, stderr
    env.close()


def test_server_options_are_checked_before_binding_and_the_token_stays_out_of_reprs(world, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="max_batch = 0: must be >= 1"):
        WorldModelServer(world, max_batch=0)
    with pytest.raises(TypeError, match="did you mean 'max_batch'"):
        WorldModelServer(world, maxbatch=4)
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        WorldModelServer(world, tls_cert=str(tmp_path / "cert.pem"))
    server = WorldModelServer(world, token=TOKEN)
    assert TOKEN not in repr(server.options)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    from worldstep.cli import main

    assert main(["serve", "--config", "tiny", "--token-file", str(empty)]) == 2  # before any model loads
    assert main(["serve", "--config", "tiny", "--token-file", str(tmp_path / "missing")]) == 2


def test_a_server_bug_is_an_internal_error_reply_and_the_connection_goes_on(serve, monkeypatch, capfd):
    """The injected violation the fuzz test watches for: a failing handler answers kind 'internal' (named by type
    only) instead of crashing the server."""
    server = serve()
    conn = raw_connection(server.url)
    try:
        monkeypatch.setattr(server, "_hello", lambda: {}["secret-internal-detail"])
        reply = ask(conn, {"id": 7, "op": "hello", "protocol": worldstep.serve.PROTOCOL_VERSION})
        assert reply["id"] == 7 and reply["error"] == {"kind": "internal", "message": "the server failed (KeyError)"}
        monkeypatch.undo()
        assert ask(conn, {"id": 8, "op": "hello", "protocol": worldstep.serve.PROTOCOL_VERSION})["ok"]
    finally:
        conn.close()
    assert "secret-internal-detail" in capfd.readouterr().err  # the traceback stays on the server


def test_a_full_page_pool_is_server_full_and_the_others_go_on(cache_dir):  # noqa: F811
    small = worldstep.load("tiny", device="cpu", num_pages=40, **FAST)  # two episodes' pages
    server = WorldModelServer(small).start()
    envs = [RemoteWorldModelEnv(server.url) for _ in range(3)]
    try:
        envs[0].reset(seed=0)
        envs[1].reset(seed=1)
        with pytest.raises(ServerFullError, match="KV page pool cannot hold another episode") as info:
            envs[2].reset(seed=2)
        assert info.value.retry_after_s == 1.0
        envs[0].step(np.zeros(envs[0].action_space.shape, np.float32))  # the others are still served
    finally:
        for env in envs:
            env.close()
        server.drain()
    assert small.model.kv.allocator.num_used == 0


def test_idle_sessions_offload_as_they_do_locally(cache_dir):  # noqa: F811
    small = worldstep.load("tiny", device="cpu", num_pages=40, cpu_offload_pages=64, **FAST)  # two episodes on device
    server = WorldModelServer(small).start()
    envs = [RemoteWorldModelEnv(server.url) for _ in range(3)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
        assert small.model.kv.offload.allocator.num_used > 0  # the third reset moved an idle session to CPU pages
        for env in envs:  # each steps in turn: the engine reloads it and offloads another idle one
            env.step(np.zeros(env.action_space.shape, np.float32))
    finally:
        for env in envs:
            env.close()
        server.drain()
    assert small.model.kv.allocator.num_used == 0 and small.model.kv.offload.allocator.num_used == 0


def test_engine_loop_keeps_a_bounded_history_of_its_batches(monkeypatch):
    """A server runs for days: the batch sizes and times it keeps are the newest ``history``, the count is whole."""
    from worldstep.serve import engine_loop

    monkeypatch.setattr(engine_loop, "step_batch", lambda envs, actions: [("ok", len(envs))] * len(envs))
    loop = engine_loop.EngineLoop(max_batch=4, max_wait_s=0.0, open_sessions=lambda: 1, history=3)
    loop.start()
    try:
        for _ in range(5):
            assert loop.step(object(), np.zeros(2)) == ("ok", 1)
    finally:
        loop.stop()
    assert loop.batches == 5
    assert list(loop.batch_sizes) == [1, 1, 1] and len(loop.batch_seconds) == 3
