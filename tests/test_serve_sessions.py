"""Sessions that survive the network, on 127.0.0.1: a session outlives its connection for the grace period and
resumes with its key (only with the token it was opened with); one nobody resumes is closed after the grace
period and its pages and decoder session come back (counted), as on a drain; every reset/step/fork carries a
sequence number, so a retried request gets the recorded reply without running the model again and a gap or a
stale number is refused; ``status`` reports each session's memory and context; the clients reconnect through a
proxy that cuts connections, and give a clear error once reconnecting cannot help. Every wait is bounded."""

from __future__ import annotations

import logging
import re
import time

import numpy as np
import pytest
from fault_proxy import FaultProxy
from serve_client import serve_actions
from test_serve import TOKEN, WAIT_S, ask, engine_calls, local_frames, raw_connection, serve, wait_for  # noqa: F401
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.sb3 import WorldModelVecEnv
from worldstep.serve import RemoteEnvConnectionError, RemoteWorldModelEnv
from worldstep.wire import packb


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def step_request(request_id: int, session: str, seq: int, k: int, shape) -> dict:
    return {"id": request_id, "op": "step", "session": session, "seq": seq, "actions": serve_actions(shape, k)}


def opened_and_stepped(url: str, token: str = TOKEN, seed: int = 0) -> tuple:
    """A raw connection holding one session, reset with ``seed`` (seq 1) and stepped once (seq 2)."""
    conn = raw_connection(url, token)
    opened = ask(conn, {"id": 1, "op": "open", "env": {"max_windows": 64}})
    shape = tuple(opened["action_space"]["low"].shape)
    assert ask(conn, {"id": 2, "op": "reset", "session": opened["session"], "seq": 1, "seed": seed})["ok"]
    assert ask(conn, step_request(3, opened["session"], 2, 0, shape))["committed_step"] == 1
    return conn, opened, shape


def detached(server, session: str) -> bool:
    return any(row["session"] == session and not row["attached"] for row in server.status())


def live_decoder_sessions(world) -> int:  # noqa: F811
    return world.model.decoder.live_warm_sessions


# --- resume ----------------------------------------------------------------------------------------


def test_a_dropped_session_resumes_with_its_key_and_only_with_its_token(world, serve):  # noqa: F811
    server = serve(token=None)  # anyone is admitted: each connection's Authorization header is its token
    conn, opened, shape = opened_and_stepped(server.url, token="alice", seed=3)
    session, key = opened["session"], opened["key"]
    assert len(key) >= 43 and key != session  # 32 random bytes
    conn.close()
    wait_for(lambda: detached(server, session), "the session detached")
    assert server.pages_in_use() > 0 and server.open_sessions() == 1  # held for the grace period
    refusals = []
    for token, given in (("mallory", key), ("alice", key[:-1] + ("A" if key[-1] != "A" else "B")), ("alice", "x")):
        other = raw_connection(server.url, token)
        reply = ask(other, {"id": 1, "op": "resume", "session": session, "key": given})
        assert not reply["ok"] and reply["error"]["kind"] == "unknown_session"
        refusals.append(reply["error"]["message"])
        other.close()
    assert len(set(refusals)) == 1  # a wrong token and a wrong key read the same: a refusal tells nothing
    owner = raw_connection(server.url, "alice")
    try:
        resumed = ask(owner, {"id": 1, "op": "resume", "session": session, "key": key})
        assert resumed["ok"] and resumed["seq"] == 2 and resumed["committed_step"] == 1
        reply = ask(owner, step_request(2, session, 3, 1, shape))
        assert np.array_equal(reply["obs"]["frames"], local_frames(world, 3, 2)[2])  # it went on where it was
        assert reply["committed_step"] == 2
    finally:
        owner.close()


def test_the_resume_test_fails_when_the_key_check_is_removed(serve, monkeypatch):  # noqa: F811
    """The injected violation: a compare that accepts anything lets a wrong key resume the session."""
    server = serve()
    conn, opened, _ = opened_and_stepped(server.url)
    conn.close()
    monkeypatch.setattr("worldstep.serve.sessions.hmac.compare_digest", lambda a, b: True)
    thief = raw_connection(server.url)
    try:
        assert ask(thief, {"id": 1, "op": "resume", "session": opened["session"], "key": "guess"})["ok"]
    finally:
        thief.close()


def test_a_session_nobody_resumes_closes_after_the_grace_period(world, serve):  # noqa: F811
    server = serve(session_grace_s=60)
    env = RemoteWorldModelEnv(server.url, token=TOKEN, reconnect_s=5)
    env.reset(seed=0)
    env.step(serve_actions(env.action_space.shape, 0))
    env.connection._drop()  # the network drops the connection (the client still holds its session)
    wait_for(lambda: detached(server, env.session), "the session detached")
    pages, decoder_sessions = server.pages_in_use(), live_decoder_sessions(world)
    assert pages > 0 and decoder_sessions == 1
    detached_at = time.monotonic()  # a clock the reaper is handed: nothing here waits or times anything
    assert server.reap(now=detached_at + 30) == 0 and server.pages_in_use() == pages  # within the grace
    assert server.reap(now=detached_at + 61) == 1  # past it: closed
    assert server.pages_in_use() == 0 and live_decoder_sessions(world) == 0 and server.open_sessions() == 0
    with pytest.raises(RemoteEnvConnectionError, match=rf"session {env.session} is lost \(last committed step 1; "
                                                       r"[0-9.]+ s after the connection dropped\).*grace period"):
        env.step(serve_actions(env.action_space.shape, 1))
    obs, _ = env.reset(seed=0)  # a reset opens a new session, as after close()
    assert np.array_equal(obs["frames"], local_frames(world, 0, 0)[0])
    env.close()


def test_the_reaper_closes_expired_sessions_by_itself(world, serve):  # noqa: F811
    server = serve(session_grace_s=0.2)
    env = RemoteWorldModelEnv(server.url, token=TOKEN, reconnect_s=0)
    env.reset(seed=0)
    env.connection._drop()
    wait_for(lambda: server.open_sessions() == 0, "the expired session closed")
    assert server.pages_in_use() == 0 and live_decoder_sessions(world) == 0
    env.close()


def test_a_drain_closes_the_sessions_waiting_for_a_resume(world, serve):  # noqa: F811
    server = serve(session_grace_s=600)
    conn, opened, _ = opened_and_stepped(server.url)
    conn.close()
    wait_for(lambda: detached(server, opened["session"]), "the session detached")
    server.drain()
    assert server.open_sessions() == 0 and server.pages_in_use() == 0 and live_decoder_sessions(world) == 0


# --- at most once ----------------------------------------------------------------------------------


def test_a_retry_gets_the_recorded_reply_and_a_gap_or_stale_number_is_refused(world, serve, engine_calls):  # noqa: F811
    server = serve()
    conn, opened, shape = opened_and_stepped(server.url, seed=5)
    session = opened["session"]
    try:
        first = ask(conn, step_request(4, session, 3, 1, shape))
        again = ask(conn, step_request(5, session, 3, 7, shape))  # a retry of seq 3 (what it carries is not read)
        assert again["ok"] and again["id"] == 5 and engine_calls == [1, 1]  # the model did not run again
        assert np.array_equal(again["obs"]["frames"], first["obs"]["frames"])
        assert again["info"] == first["info"] and again["committed_step"] == first["committed_step"] == 2
        for seq, what in ((5, "out of order \\(a gap\\)"), (2, "stale"), (1, "stale")):
            reply = ask(conn, step_request(6, session, seq, 2, shape))
            assert reply["error"]["kind"] == "sequence"
            assert re.search(rf"seq={seq} of 'step' is {what}: the session's last applied request is seq=3; "
                             r"allowed: 4 \(the next one\) or 3", reply["error"]["message"])
        reset_retry = ask(conn, {"id": 7, "op": "reset", "session": session, "seq": 3, "seed": 0})
        assert reset_retry["error"]["kind"] == "sequence"  # seq 3 was a step, not this reset
        assert engine_calls == [1, 1]  # no refusal reached the model
        bad = ask(conn, {"id": 8, "op": "step", "session": session, "seq": 4,
                         "actions": np.full(shape, np.nan, np.float32)})
        assert bad["error"]["kind"] == "value"  # refused: it consumes no number
        fork = ask(conn, {"id": 9, "op": "fork", "session": session, "seq": 4, "seed": None})
        fork_again = ask(conn, {"id": 10, "op": "fork", "session": session, "seq": 4, "seed": None})
        assert fork["ok"] and fork_again["session"] == fork["session"] and server.open_sessions() == 2
        assert [r["model_calls"] for r in server.status() if r["session"] == session] == [4]  # reset, 2 steps, fork
    finally:
        conn.close()


def test_a_step_applied_before_its_reply_was_lost_is_not_applied_again(world, serve, engine_calls):  # noqa: F811
    server = serve()
    conn, opened, shape = opened_and_stepped(server.url, seed=2)
    session = opened["session"]
    conn.send(packb(step_request(4, session, 3, 1, shape)))
    wait_for(lambda: any(r["seq"] == 3 for r in server.status()), "the step applied")
    conn.close()  # the reply never arrives
    other = raw_connection(server.url)
    try:
        assert ask(other, {"id": 1, "op": "resume", "session": session, "key": opened["key"]})["seq"] == 3
        reply = ask(other, step_request(2, session, 3, 1, shape))  # the client's resend
        assert engine_calls == [1, 1]  # steps 1 and 2 of the session, once each
        assert np.array_equal(reply["obs"]["frames"], local_frames(world, 2, 2)[2])
    finally:
        other.close()


# --- status ----------------------------------------------------------------------------------------


def test_status_reports_each_sessions_memory_context_and_idle_time(world, serve):  # noqa: F811
    server = serve()
    busy, idle = (RemoteWorldModelEnv(server.url, token=TOKEN) for _ in range(2))
    try:
        busy.reset(seed=0)
        info = busy.step(serve_actions(busy.action_space.shape, 0))[4]
        row = busy.status()
        kv = world.model.kv
        assert row["pages"] == server.pages_in_use() == info["kv"].pages_in_use > 0
        assert row["kv_bytes"] == row["pages"] * kv.kv[:, 0].nbytes
        assert row["decoder_cache_bytes"] > 0 and row["context_tokens"] == info["kv"].seq_len > 0
        assert row["committed_step"] == 1 and row["model_calls"] == 2 and row["seq"] == 2 and row["attached"]
        assert row["idle_s"] >= 0
        empty = idle.status()
        assert (empty["pages"], empty["kv_bytes"], empty["decoder_cache_bytes"], empty["context_tokens"]) == (0,) * 4
        assert {r["session"] for r in server.status()} == {busy.session, idle.session}
        assert [r["session"] for r in busy.connection.request("status")["sessions"]] == [busy.session]
    finally:
        busy.close()
        idle.close()


# --- the clients reconnect -------------------------------------------------------------------------


def test_the_env_reconnects_through_a_cutting_proxy_and_sees_only_latency(world, serve, engine_calls,  # noqa: F811
                                                                          caplog):
    server = serve()
    proxy = FaultProxy(port_of(server.url), seed=3, cut_probability=0.25, max_cuts=12)
    steps = 12
    try:
        with caplog.at_level(logging.WARNING, logger="worldstep.serve"):
            proxy.faults = False  # the first connection is not retried: a wrong address fails at once
            env = RemoteWorldModelEnv(proxy.url, token=TOKEN, max_windows=64)
            proxy.faults = True
            obs, _ = env.reset(seed=4)
            frames = [obs["frames"]] + [env.step(serve_actions(env.action_space.shape, k))[0]["frames"]
                                        for k in range(steps)]
            reconnects = env.connection.reconnects
            proxy.faults = False
            env.close()
        assert engine_calls == [1] * steps  # none lost, none doubled
        assert np.array_equal(np.stack(frames), local_frames(world, 4, steps))
        assert reconnects >= 1 and sum(proxy.cuts.values()) >= reconnects
        warnings = [r for r in caplog.records if "reconnected" in r.getMessage()]
        assert len(warnings) == reconnects and all(r.levelno == logging.WARNING for r in warnings)
    finally:
        proxy.close()
    assert proxy.threads == 0
    wait_for(lambda: server.open_sessions() == 0, "the session closed")


def test_the_sb3_remote_vec_env_reconnects_through_the_proxy(world, serve, engine_calls):  # noqa: F811
    server = serve(max_batch=1)  # one session per engine call: the frames are the local env's exactly
    proxy = FaultProxy(port_of(server.url), seed=5, cut_probability=0.25, max_cuts=8)
    try:
        proxy.faults = False
        venv = WorldModelVecEnv.remote(proxy.url, num_envs=2, token=TOKEN, frames="last", max_windows=64)
        proxy.faults = True
        venv.seed(7)
        venv.reset()
        shape = venv.action_space.shape
        for k in range(5):
            obs, _, dones, _ = venv.step(np.stack([serve_actions(shape, k)] * 2))
        reconnects = sum(env.connection.reconnects for env in venv.envs)
        proxy.faults = False
        venv.close()
        assert not dones.any() and reconnects >= 1 and engine_calls == [1] * 10
        for i in range(2):
            assert np.array_equal(obs[i], local_frames(world, 7 + i, 5)[-1][-1])
    finally:
        proxy.close()


def test_after_the_reconnect_bound_the_error_names_session_step_and_time(serve, caplog):  # noqa: F811
    server = serve()
    proxy = FaultProxy(port_of(server.url), cut_probability=0.0)
    env = RemoteWorldModelEnv(proxy.url, token=TOKEN, reconnect_s=0.5)
    env.reset(seed=0)
    env.step(serve_actions(env.action_space.shape, 0))
    proxy.close()  # the network is gone, with no word from the server
    with caplog.at_level(logging.WARNING, logger="worldstep.serve.client"), \
            pytest.raises(RemoteEnvConnectionError, match=rf"during 'step' of session {env.session} \(last committed "
                                                          r"step 1\) and could not reconnect within [0-9.]+ s"):
        env.step(serve_actions(env.action_space.shape, 1))
    attempts = [r.getMessage() for r in caplog.records if "reconnect attempt" in r.getMessage()]
    assert attempts and all(f"reconnect attempt {i + 1} failed" in line for i, line in enumerate(attempts))
    env.close()


def test_a_drain_tells_each_client_why_at_once(serve, caplog):  # noqa: F811
    """No reconnect budget spent on a server that said it shut down: counted, not timed (a 60 s budget)."""
    server = serve()
    env = RemoteWorldModelEnv(server.url, token=TOKEN, reconnect_s=WAIT_S)
    env.reset(seed=0)
    env.step(serve_actions(env.action_space.shape, 0))
    server.drain()
    with caplog.at_level(logging.WARNING, logger="worldstep.serve.client"), \
            pytest.raises(RemoteEnvConnectionError, match=rf"server shut down; session {env.session} lost at step 1"):
        env.step(serve_actions(env.action_space.shape, 1))
    assert env.connection.reconnects == 0 and not [r for r in caplog.records if "reconnect" in r.getMessage()]
    with pytest.raises(RemoteEnvConnectionError, match="server shut down"):  # the session stays lost, said the same
        env.step(serve_actions(env.action_space.shape, 1))
    env.close()


def test_a_restarted_server_gives_the_client_a_clear_error_not_a_hang(world, serve):  # noqa: F811
    first = serve()
    env = RemoteWorldModelEnv(first.url, token=TOKEN, reconnect_s=WAIT_S)
    env.reset(seed=0)
    env.step(serve_actions(env.action_space.shape, 0))
    port = port_of(first.url)
    first.drain()
    second = serve(port=port)  # the same address, a new process' worth of state: no session
    with pytest.raises(RemoteEnvConnectionError, match=rf"server shut down; session {env.session} lost at step 1"):
        env.step(serve_actions(env.action_space.shape, 1))  # the first server said so when it drained
    obs, _ = env.reset(seed=0)  # a new session on the new server
    assert np.array_equal(obs["frames"], local_frames(world, 0, 0)[0]) and second.open_sessions() == 1
    env.close()
