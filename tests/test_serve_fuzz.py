"""Property-based fuzzing of ``worldstep serve``: 1,000 malformed or hostile messages on one connection (bad
bytes, truncated frames, text frames, wrong types, huge or unsafe array markers, NaN actions, another client's
session id), each answered by an error reply that names no internal failure; afterwards the victim client,
whose session id the fuzzer used, is still served the frames the local env gives."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_client import serve_actions
from test_serve import TOKEN, WAIT_S, local_frames, raw_connection
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.serve import RemoteWorldModelEnv
from worldstep.serve.protocol import ErrorKind, Op
from worldstep.serve.server import WorldModelServer
from worldstep.wire import packb, unpackb

EXAMPLES = 1000
OPS = [op.value for op in Op] + ["", "STEP", "exec", "__init__"]
FIELDS = ["session", "actions", "seed", "options", "env", "protocol", "seq", "key", "id", "op", "extra"]


def array_marker(shape=None, dtype=None, data=None):
    """An openpi ndarray marker whose parts may lie about each other."""
    return st.fixed_dictionaries({
        b"__ndarray__": st.just(True),
        b"data": data or st.binary(max_size=64),
        b"dtype": dtype or st.sampled_from(["<f4", "<f8", "|u1", "|O", "<U4", "V8", "garbage", "<c8"]),
        b"shape": shape or st.lists(st.integers(-2, 2**40), max_size=4),
    })


SCALARS = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=True)
           | st.text(max_size=20) | st.binary(max_size=20))
VALUES = st.recursive(SCALARS | array_marker(), lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8), inner, max_size=4),
                      max_leaves=12)


def bad_actions(shape):
    """Actions the schema lets through and the env must refuse: NaN, inf, out of range, wrong shapes."""
    return st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf, 3.0, -1e30]).map(lambda v: np.full(shape, v, np.float32)),
        st.tuples(st.integers(1, 8), st.integers(1, 64)).map(lambda s: np.zeros(s, np.float32)),
        st.just(np.zeros((1, 2**16), np.float32)),
    )


def hostile_messages(own: str, victim: str, shape: tuple[int, int]):
    envelope = st.fixed_dictionaries(
        {"id": st.integers(0, 2**62) | VALUES, "op": st.sampled_from(OPS) | VALUES},
        optional={name: VALUES | st.sampled_from([own, victim]) for name in FIELDS[:8]})
    own_attacks = st.fixed_dictionaries({"id": st.integers(0, 100), "op": st.just("step"), "seq": st.just(2),
                                         "session": st.just(own), "actions": bad_actions(shape)})
    victim_attacks = st.fixed_dictionaries({
        "id": st.integers(0, 100), "op": st.sampled_from(["step", "reset", "fork", "close"]),
        "session": st.just(victim)},
        optional={"actions": st.just(np.zeros(shape, np.float32)), "seed": st.integers(0, 9),
                  "seq": st.integers(1, 3)})
    packed = (envelope | own_attacks | victim_attacks).map(lambda m: ("packed", m))
    truncated = st.tuples(own_attacks, st.floats(0, 0.99)).map(
        lambda t: ("bytes", packb(t[0])[: int(len(packb(t[0])) * t[1])]))
    raw = st.binary(max_size=256).map(lambda b: ("bytes", b))
    text = st.text(max_size=64).map(lambda s: ("text", s))
    return packed | truncated | raw | text


def test_a_thousand_hostile_messages_then_a_well_behaved_client_is_served(world):  # noqa: F811
    server = WorldModelServer(world, token=TOKEN, max_sessions=4).start()
    victim = RemoteWorldModelEnv(server.url, token=TOKEN)
    fuzzer = raw_connection(server.url)
    kinds: dict[str, int] = {}
    try:
        victim.reset(seed=4)
        opened = unpackb(_ask(fuzzer, packb({"id": 1, "op": "open", "env": {}})))
        assert opened["ok"]
        assert unpackb(_ask(fuzzer, packb({"id": 2, "op": "reset", "session": opened["session"],
                                                        "seq": 1})))["ok"]
        shape = victim.action_space.shape

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(hostile_messages(opened["session"], victim.session, shape))
        def answered(message):
            form, payload = message
            try:
                data = packb(payload) if form == "packed" else payload
            except (OverflowError, TypeError, ValueError):  # cannot even be encoded: nothing to send
                return
            reply = unpackb(_ask(fuzzer, data))
            assert isinstance(reply, dict) and "ok" in reply
            if reply["ok"]:
                return  # a request that happened to be valid (a reset, an open)
            kind = reply["error"]["kind"]
            kinds[kind] = kinds.get(kind, 0) + 1
            assert kind != ErrorKind.INTERNAL, reply
            if form == "packed" and payload.get("session") == victim.session:
                assert kind in (ErrorKind.UNKNOWN_SESSION, ErrorKind.PROTOCOL), reply

        answered()
        assert sum(kinds.values()) >= EXAMPLES // 2, kinds  # most messages were refused, by schema or env
        assert {ErrorKind.PROTOCOL, ErrorKind.UNKNOWN_SESSION, ErrorKind.VALUE} <= set(kinds), kinds
        # the victim's episode was never touched: it goes on exactly as a local env does
        want = local_frames(world, 4, 2)
        for k in range(2):
            got = victim.step(serve_actions(shape, k))[0]["frames"]
            assert np.array_equal(got, want[k + 1])
    finally:
        fuzzer.close()
        victim.close()
        server.drain()
    assert server.open_sessions() == 0 and server.pages_in_use() == 0


def _ask(conn, data) -> bytes:
    conn.send(data)
    return conn.recv(timeout=WAIT_S)
