"""openpi's own client library speaks to worldstep: the DROID observation dict RemotePolicy would send, decoded by
openpi-client's msgpack_numpy, sent by its WebsocketClientPolicy through worldstep's PolicyServer.

openpi-client pins numpy<2 and worldstep runs on numpy 2, so the client runs in its own environment, named
by ``WORLDSTEP_OPENPI_PYTHON`` (default: the repository's ``.venv-openpi``, which ``make test`` builds;
openpi-client 0.1.2 on PyPI imports typing_extensions without declaring it).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from worldstep.policies.remote import DROID_OBS_KEYS, RemotePolicy
from worldstep.policies.server import PolicyServer
from worldstep.wire import packb, unpackb

OPENPI_PYTHON = Path(os.environ.get("WORLDSTEP_OPENPI_PYTHON",
                                    Path(__file__).resolve().parents[1] / ".venv-openpi" / "bin" / "python"))

CLIENT = """
import sys
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

obs = msgpack_numpy.unpackb(open(sys.argv[2], "rb").read())  # what worldstep's RemotePolicy packs
policy = WebsocketClientPolicy(sys.argv[1])
reply = policy.infer(obs)
open(sys.argv[3], "wb").write(msgpack_numpy.packb({"reply": reply, "metadata": policy.get_server_metadata(),
                                                   "types": {k: type(v).__name__ for k, v in obs.items()}}))
"""


@pytest.fixture(scope="module")
def openpi_python():
    if not OPENPI_PYTHON.is_file():  # part of the test install, never skipped
        pytest.fail(f"openpi-client's own environment {OPENPI_PYTHON} is missing: run `make install` (it builds "
                    ".venv-openpi), or set WORLDSTEP_OPENPI_PYTHON to a python with openpi-client installed")
    return OPENPI_PYTHON


def droid_obs(chunk: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    state = np.zeros((chunk, 10), np.float32)
    state[:, :3] = rng.normal(size=(chunk, 3))
    state[:, 3:9] = [0.0, 1.0, 0.0, -1.0, 0.0, 0.0]  # 90 degrees about z
    state[:, 9] = 0.25
    return {"exterior": rng.integers(0, 256, (chunk, 32, 16, 3), dtype=np.uint8),
            "wrist": rng.integers(0, 256, (chunk, 32, 16, 3), dtype=np.uint8), "state": state}


def test_droid_request_holds_both_cameras_and_the_state():
    obs = droid_obs()
    policy = RemotePolicy("127.0.0.1:1", (4, 10), obs_keys=DROID_OBS_KEYS, prompt="put the cup in the sink",
                          static_obs={"observation/joint_position": np.zeros(7, np.float32)})
    request = policy.request(obs)
    assert np.array_equal(request["observation/exterior_image_1_left"], obs["exterior"][-1])
    assert np.array_equal(request["observation/wrist_image_left"], obs["wrist"][-1])
    assert np.allclose(request["observation/cartesian_position"], [*obs["state"][-1, :3], 0, 0, np.pi / 2])
    assert request["observation/gripper_position"].tolist() == [0.25] and request["prompt"] == "put the cup in the sink"
    with pytest.raises(ValueError,
                       match=r"source '(pose_euler\[0:9\]|state\[9:10\])' needs obs\['state'\].*robot_state=True"):
        policy.request({k: v for k, v in obs.items() if k != "state"})
    with pytest.raises(ValueError, match="source 'image:wrist' needs obs\\['wrist'\\]"):
        policy.request({k: v for k, v in obs.items() if k != "wrist"})
    with pytest.raises(ValueError, match=r"source 'state\[9:10\]' is invalid for a state 9 wide"):
        policy.request({**obs, "state": obs["state"][:, :9]})


def test_openpi_client_sends_the_droid_request_through_worldstep_server(openpi_python, tmp_path):
    obs = droid_obs()
    policy = RemotePolicy("127.0.0.1:1", (4, 10), obs_keys=DROID_OBS_KEYS, prompt="put the cup in the sink",
                          static_obs={"observation/joint_position": np.zeros(7, np.float32)})
    request = policy.request(obs)
    received = []
    actions = np.linspace(-1, 1, 40, dtype=np.float32).reshape(4, 10)

    def infer(observation):
        received.append(observation)
        return {"actions": actions}

    (tmp_path / "obs.msgpack").write_bytes(packb(request))
    with PolicyServer(infer, metadata={"server": "worldstep"}, max_requests=4, lifetime_s=120) as server:
        done = subprocess.run([str(openpi_python), "-c", CLIENT, server.endpoint, str(tmp_path / "obs.msgpack"),
                               str(tmp_path / "reply.msgpack")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (got,) = received  # what the server decoded from openpi's client
    assert set(got) == set(request)
    for key, value in request.items():
        if isinstance(value, np.ndarray):
            assert got[key].dtype == value.dtype and np.array_equal(got[key], value), key
        else:
            assert got[key] == value, key
    back = unpackb((tmp_path / "reply.msgpack").read_bytes())
    assert np.array_equal(back["reply"]["actions"], actions)  # and openpi's client decoded the server's reply
    assert back["metadata"] == {"server": "worldstep"}
    assert back["types"] == {k: "str" if k == "prompt" else "ndarray" for k in request}  # openpi's decoder, numpy 1
