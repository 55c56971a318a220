"""RemotePolicy against small openpi-protocol servers on 127.0.0.1: mapping, action modes, failures, evaluate."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import worldstep  # noqa: E402
from tiny_world import FAST, cache_dir, world  # noqa: E402, F401 - fixtures
from worldstep.policies.remote import (  # noqa: E402
    RemotePolicy,
    RemotePolicyConnectionError,
    RemotePolicyError,
    RemotePolicyProtocolError,
    RemotePolicyTimeout,
)
from worldstep.policies.server import PolicyServer, demo_policy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (4, 3)
OBS = {"frames": np.arange(4 * 8 * 8 * 3, dtype=np.uint8).reshape(4, 8, 8, 3)}


def numbered(horizon: int, width: int = SHAPE[1]):
    """A server function whose request r (from 1) returns rows (r * 10 + i) / 100: which reply a row
    came from can be read back."""
    count = {"n": 0}

    def infer(obs):
        count["n"] += 1
        rows = (count["n"] * 10 + np.arange(horizon, dtype=np.float32)) / 100
        return {"actions": np.repeat(rows[:, None], width, axis=1)}

    infer.count = count
    return infer


@pytest.fixture
def serve():
    """Start PolicyServers that stop at the end of the test (and by themselves after 60 s)."""
    servers = []

    def start(infer, **kwargs) -> PolicyServer:
        server = PolicyServer(infer, lifetime_s=60, max_requests=200, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_observation_mapping_sends_the_configured_keys(serve):
    seen = []
    server = serve(lambda obs: seen.append(obs) or {"actions": np.zeros(SHAPE, np.float32)},
                   metadata={"policy": "echo"})
    policy = RemotePolicy(server.endpoint, SHAPE, obs_keys={"img": "image", "all": "frames", "task": "prompt"},
                          prompt="push the block", static_obs={"observation/state": np.ones(7, np.float32)},
                          image_size=(4, 6))
    assert policy.connect() == {"policy": "echo"}
    assert policy(OBS).shape == SHAPE
    (obs,) = seen
    assert set(obs) == {"img", "all", "task", "observation/state"}
    assert obs["img"].shape == (4, 6, 3) and obs["img"].dtype == np.uint8
    assert np.array_equal(obs["all"], OBS["frames"]) and obs["task"] == "push the block"
    assert np.array_equal(obs["observation/state"], np.ones(7))
    policy.close()


def test_action_modes_truncate_pad_and_rechunk(serve):
    long, short = serve(numbered(6)), serve(numbered(2))
    truncated = RemotePolicy(long.endpoint, SHAPE, prompt="p", action_mode="truncate")(OBS)
    assert np.allclose(truncated[:, 0], [0.10, 0.11, 0.12, 0.13])
    padded = RemotePolicy(short.endpoint, SHAPE, prompt="p", action_mode="pad")(OBS)
    assert np.allclose(padded[:, 0], [0.10, 0.11, 0.11, 0.11])

    three = numbered(3)
    policy = RemotePolicy(serve(three).endpoint, SHAPE, prompt="p", action_mode="rechunk")
    first, second = policy(OBS), policy(OBS)
    assert np.allclose(first[:, 0], [0.10, 0.11, 0.12, 0.20])  # queried twice for the window
    assert np.allclose(second[:, 0], [0.21, 0.22, 0.30, 0.31])  # the leftover opens the next window
    assert three.count["n"] == 3
    policy.reset()
    assert np.allclose(policy(OBS)[:, 0], [0.40, 0.41, 0.42, 0.50])  # reset drops the queue


def test_action_mode_mismatches_and_bad_settings_raise_clear_errors(serve):
    server = serve(numbered(6))
    with pytest.raises(RemotePolicyProtocolError, match=rf"{server.endpoint}.*6 actions.*'exact' needs == 4"):
        RemotePolicy(server.endpoint, SHAPE, prompt="p")(OBS)
    with pytest.raises(RemotePolicyProtocolError, match="'pad' needs <= 4"):
        RemotePolicy(server.endpoint, SHAPE, prompt="p", action_mode="pad")(OBS)
    with pytest.raises(ValueError, match=r"action_mode='stretch' is invalid; allowed: one of \['exact'"):
        RemotePolicy(server.endpoint, SHAPE, prompt="p", action_mode="stretch")
    with pytest.raises(ValueError, match=r"obs_keys\['img'\]='depth' is invalid"):
        RemotePolicy(server.endpoint, SHAPE, obs_keys={"img": "depth"})
    with pytest.raises(ValueError, match="prompt=None is invalid"):
        RemotePolicy(server.endpoint, SHAPE)
    with pytest.raises(ValueError, match="image_size"):
        RemotePolicy(server.endpoint, SHAPE, prompt="p", image_size=(0, 4))
    with pytest.raises(ValueError, match="endpoint"):
        RemotePolicy("", SHAPE, prompt="p")


@pytest.mark.parametrize("reply, match", [
    ({"actions": "nope"}, r"'actions' is str; allowed: a numeric array \(horizon, 3\)"),
    ({"actions": [[0.0, 0.1, 0.2], [0.3]]}, r"'actions' is list; allowed: a numeric array \(horizon, 3\)"),
    ({"actions": np.zeros((4, 5), np.float32)}, r"shape \(4, 5\).*allowed: a numeric array \(horizon, 3\)"),
    ({"action": np.zeros(SHAPE, np.float32)}, r"reply has no 'actions' key \(keys: \['action'\]\)"),
    ({"actions": np.full(SHAPE, np.nan, np.float32)}, "not finite"),
    ({"actions": np.full(SHAPE, 3.0, np.float32)}, r"spans \[3, 3\]; allowed: \[-1, 1\]"),
])
def test_malformed_actions_raise_naming_the_endpoint(serve, reply, match):
    server = serve(lambda obs: reply)
    with pytest.raises(RemotePolicyProtocolError, match=match) as info:
        RemotePolicy(server.endpoint, SHAPE, prompt="p")(OBS)
    assert info.value.endpoint == server.endpoint and server.endpoint in str(info.value)


def test_clip_accepts_out_of_range_actions(serve):
    server = serve(lambda obs: {"actions": np.full(SHAPE, 3.0, np.float32)})
    assert np.all(RemotePolicy(server.endpoint, SHAPE, prompt="p", clip=True)(OBS) == 1.0)


def test_server_exception_comes_back_with_its_traceback(serve):
    def broken(obs):
        raise KeyError("observation/wrist_image")

    server = serve(broken)
    with pytest.raises(RemotePolicyError, match=r"(?s)the server failed:.*KeyError: 'observation/wrist_image'"):
        RemotePolicy(server.endpoint, SHAPE, prompt="p")(OBS)


def test_stalled_server_times_out_then_the_policy_reconnects(serve):
    calls = {"n": 0}
    stalled_reply_ready = threading.Event()

    def stall_once(obs):
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(2.0)  # bounded: longer than the client's timeout
            stalled_reply_ready.set()
        return {"actions": np.zeros(SHAPE, np.float32)}

    server = serve(stall_once)
    policy = RemotePolicy(server.endpoint, SHAPE, prompt="p", timeout_s=0.3)
    with pytest.raises(RemotePolicyTimeout, match=rf"{server.endpoint}: no reply within 0.3 s"):
        policy(OBS)
    # Ordering, not wall time (load-independent): the client gave up before the stalled reply existed.
    assert not stalled_reply_ready.is_set()
    assert policy(OBS).shape == SHAPE  # a fresh connection, not the late reply of the stalled request


def test_unreachable_endpoint_raises_a_connection_error():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = RemotePolicy(f"127.0.0.1:{port}", SHAPE, prompt="p", connect_timeout_s=2)
    with pytest.raises(RemotePolicyConnectionError, match=rf"policy server ws://127.0.0.1:{port}: cannot connect"):
        policy(OBS)


@pytest.mark.parametrize("batched", [False, True])
def test_evaluate_marks_the_episode_whose_policy_failed_and_goes_on(world, serve, tmp_path, batched):  # noqa: F811
    count = {"n": 0}
    lock = threading.Lock()
    inner = demo_policy(*world.action_shape)

    def fails_third(obs):
        with lock:
            count["n"] += 1
            n = count["n"]
        if n == 3:
            raise RuntimeError("policy crashed on request 3")
        return inner(obs)

    server = serve(fails_third)
    policy = RemotePolicy(server.endpoint, world.action_shape, prompt="push the block")
    episodes = [{"seed": i, "max_windows": 2} for i in range(3)]
    report = worldstep.evaluate(world, policy, episodes, out_dir=tmp_path, batched=batched, progress=False)
    failed_index = 2 if batched else 1  # batched: request 3 is slot 2's first; sequential: episode 1's first
    assert [e.status for e in report.episodes] == ["failed" if i == failed_index else "ok" for i in range(3)]
    failed = report.episodes[failed_index]
    assert "policy crashed on request 3" in failed.error and server.endpoint in failed.error
    assert failed.windows == 0
    assert all(e.windows == 2 and e.error is None for i, e in enumerate(report.episodes) if i != failed_index)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["num_failed"] == 1 and data["episodes"][failed_index]["status"] == "failed"
    assert world.model.kv.num_used_pages == 0


def test_remote_policy_example_runs_standalone(tmp_path, cache_dir):  # noqa: F811
    script = ROOT / "examples" / "remote_policy_eval.py"
    text = script.read_text()
    assert "worldstep.engine" not in text and "from worldstep.world" not in text and "._" not in text
    env = {**os.environ, "WORLDSTEP_CACHE": str(cache_dir)}
    proc = subprocess.run([sys.executable, str(script), "--serve-demo", "--episodes", "2", "--windows", "1",
                           "--out", str(tmp_path), "--height", "32", "--width", "32", "--num-steps", "1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["num_episodes"] == 2 and data["num_failed"] == 0 and data["policy"] == "RemotePolicy"
    assert len(list(tmp_path.glob("episode-*.mp4"))) == 2
