"""worldstep.wire: the one msgpack codec of both protocols, and the one error base of both clients."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from worldstep.policies.remote import PolicyClient, RemotePolicyConnectionError, RemotePolicyError
from worldstep.serve import RemoteEnvConnectionError, RemoteEnvError, ServeConnection
from worldstep.wire import RemoteError, packb, unpackb


def test_codec_round_trips_openpi_numpy_payloads():
    payload = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [np.int64(3), "text"], "c": {"d": True},
               "img": np.zeros((2, 2, 3), np.uint8)}
    back = unpackb(packb(payload))
    assert back["a"].dtype == np.float32 and np.array_equal(back["a"], payload["a"])
    assert back["b"] == [3, "text"] and isinstance(back["b"][0], np.int64) and back["c"] == {"d": True}
    assert back["img"].shape == (2, 2, 3)
    with pytest.raises(ValueError, match="dtype object"):
        packb({"x": np.array([object()])})


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_both_clients_raise_a_remote_error_naming_the_server():
    """A refused connection of the policy client and of the env client, caught by the one base."""
    url = f"ws://127.0.0.1:{_closed_port()}"
    caught = []
    for connect in (lambda: PolicyClient(url, connect_timeout_s=5).connect(),
                    lambda: ServeConnection(url, timeout_s=5, reconnect_s=0)):
        with pytest.raises(RemoteError) as info:
            connect()
        assert info.value.address == url and url in str(info.value)
        caught.append(info.value)
    policy, env = caught
    assert isinstance(policy, RemotePolicyConnectionError) and isinstance(policy, RemotePolicyError)
    assert isinstance(env, RemoteEnvConnectionError) and isinstance(env, RemoteEnvError)
    assert policy.endpoint == env.url == url  # each client's own name for the address
    assert str(policy).startswith(f"policy server {url}: ") and str(env).startswith(f"worldstep server {url}: ")
