"""``lerobot-eval`` (LeRobot 0.4.4, in its own venv) runs LeRobot policies in the world model served by
``worldstep serve --config pusher`` on loopback, through worldstep's env type ``worldstep`` (worldstep.lerobot_plugin).

A tiny random-weight ACT and a Diffusion Policy, built with LeRobot's own configs and ``save_pretrained`` (no
download; tests/lerobot_policies.py), run 2 episodes each. The plugin records every episode it served
(``--env.record``); worldstep then checks, in its own venv and from the recorded frames, what LeRobot reported:

- the success LeRobot reports per episode (``eval_info.json``) is worldstep's judgement of the same episode: the
  PushSim pixel judge re-run on every window against the episode's first frame, redrawn from its scene seed;
- the actions the model got are the policy's, from the dataset's units through the dataset's ``meta/stats.json``
  (quantile: ``2 (a - q01) / (q99 - q01) - 1``, clipped to the served [-1, 1]);
- LeRobot's videos are the world model's frames, held between windows: after reset and steps ``4w+1..4w+3`` the
  last frame so far, after step ``4w+4`` window ``w``'s last frame (chunk 4), within the video codec's loss
  (LeRobot's video stops before the render after the last step, which shows the same-step autoreset).

A stopped server stops ``lerobot-eval`` with the client's connection error naming the URL, within the bound of the
subprocess (no hang). The env's own chunk semantics are checked directly against the same server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import av
import gymnasium as gym
import numpy as np
import pytest
from lerobot_data import lerobot_env, lerobot_python
from worldstep.lerobot.policy_env import LeRobotPolicyEnv, PolicyEnvOptions
from worldstep.lerobot.writer import DatasetWriter

HERE = Path(__file__).resolve().parent
POLICIES = HERE / "lerobot_policies.py"
TOKEN = "t0ken-for-lerobot"
CHUNK, WINDOWS, SEED = 4, 3, 500
WAIT_S = 300  # bound on each LeRobot process (a hang fails here)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    (folder / "token").write_text(TOKEN + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "worldstep.cli", "serve", "--config", "pusher", "--device", "cpu",
                             "--token-file", str(folder / "token")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving on ws://127.0.0.1:"), line + proc.stderr.read()
        yield {"url": line.split()[-1], "token_file": folder / "token", "proc": proc}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A pusher-shaped LeRobot dataset whose actions span [-3, 3]: its stats.json differs from the model's units."""
    root = tmp_path_factory.mktemp("data") / "ds"
    rng = np.random.default_rng(0)
    with DatasetWriter(root, fps=24, cameras={"observation.images.top": (64, 64)}, action_width=2, state_width=2,
                       codec="h264") as writer:
        for n in (12, 9):
            actions = rng.uniform(-3, 3, (n, 2)).astype(np.float32)
            writer.add_episode(frames={"observation.images.top": rng.integers(0, 256, (n, 64, 64, 3), np.uint8)},
                               actions=actions, state=actions, task="push the block to the goal")
    return root


@pytest.fixture(scope="module")
def policies(tmp_path_factory, dataset):
    """ACT and Diffusion Policy, random weights, their processors normalising with the dataset's stats."""
    folder = tmp_path_factory.mktemp("policies")
    built = run_policies("build", folder, dataset / "meta" / "stats.json", "act", "diffusion")
    assert built.returncode == 0, built.stderr[-4000:]
    return folder


def run_policies(*args: str) -> subprocess.CompletedProcess:
    python = lerobot_python("v3.0")
    return subprocess.run([str(python), str(POLICIES), *map(str, args)], capture_output=True, text=True,
                          timeout=WAIT_S, env=lerobot_env(python))


def lerobot_eval(policy: Path, url: str, token_file: Path, out: Path, record: Path, stats: Path, robot_state: str,
                 *extra: str):
    return run_policies("eval", *extra, f"--policy.path={policy}", "--env.type=worldstep",
                        "--env.discover_packages_path=worldstep.lerobot_plugin", f"--env.url={url}",
                        f"--env.token_file={token_file}", f"--env.robot_state={robot_state}", f"--env.stats={stats}",
                        f"--env.max_windows={WINDOWS}", f"--env.record={record}", "--env.reconnect_s=2",
                        "--eval.n_episodes=2", "--eval.batch_size=1", f"--seed={SEED}", f"--output_dir={out}",
                        "--policy.device=cpu")


def judged(record: dict) -> list[bool]:
    """worldstep's judgement of each recorded window: PushSim's pixel judge against the episode's first frame."""
    sim = gym.make("worldstep/PushSim-v0").unwrapped
    first = sim.reset(seed=int(record["scene_seed"]))[0]["frames"][0]
    sim.close()
    return [bool(sim.success_from_frames(first, window)) for window in record["frames"]]


def quantile_units(raw: np.ndarray, stats_file: Path) -> np.ndarray:
    stats = json.loads(stats_file.read_text())["action"]
    q01, q99 = np.array(stats["q01"]), np.array(stats["q99"])
    return np.clip(2 * (raw - q01) / np.maximum(q99 - q01, 1e-8) - 1, -1, 1)


def video_frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def held_frames(record: dict) -> np.ndarray:
    """What the policy saw at each step (reset first): the last generated frame, new after every CHUNK-th step."""
    last = record["first"]
    seen = [last]
    for window in record["frames"]:
        seen += [last] * (CHUNK - 1) + [window[-1]]
        last = window[-1]
    return np.stack(seen)


@pytest.mark.parametrize("policy,robot_state", [("act", "last_action"), ("diffusion", "zeros")])
def test_lerobot_eval_runs_a_policy_in_the_world_model(tmp_path, served, dataset, policies, policy, robot_state):
    stats = dataset / "meta" / "stats.json"
    done = lerobot_eval(policies / policy, served["url"], served["token_file"], tmp_path / "out", tmp_path / "rec",
                        dataset, robot_state)
    assert done.returncode == 0, done.stderr[-4000:]
    reported = json.loads((tmp_path / "out" / "eval_info.json").read_text())
    metrics = reported["per_task"][0]["metrics"]
    records = [dict(np.load(tmp_path / "rec" / f"seed_{SEED + e}.npz")) for e in range(2)]
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == [f"seed_{SEED}.npz", f"seed_{SEED + 1}.npz"]
    judgements = []
    for e, record in enumerate(records):
        windows = judged(record)
        np.testing.assert_array_equal(record["success"], windows)  # the server's judge is worldstep's
        assert len(windows) == WINDOWS or (windows[-1] and not any(windows[:-1]))  # ends on success or the limit
        judgements.append(any(windows))
        np.testing.assert_allclose(record["sent"], quantile_units(record["raw"], stats), atol=1e-5)
        assert np.abs(record["raw"]).max() > 1.0  # the policy acts in the dataset's units, not the model's
        video = video_frames(Path(metrics["video_paths"][e]))
        expected = held_frames(record)[:-1]  # LeRobot keeps the renders up to the done step's: the one after it
        assert video.shape == expected.shape, (video.shape, expected.shape)  # shows the vector env's autoreset
        assert np.abs(video.astype(np.int16) - expected).mean(axis=(1, 2, 3)).max() < 8.0
    assert metrics["successes"] == judgements
    assert reported["overall"]["pc_success"] == 100 * np.mean(judgements)


def test_a_success_in_the_world_model_is_the_success_lerobot_reports(tmp_path, served, dataset, policies):
    """Both episodes start (``--env.image``) from a PushSim frame whose block already sits on the goal, far from the
    effector: the served judge calls a window a success, the episode ends on it, and LeRobot's per-episode
    successes and rate are worldstep's judgement of the recorded frames (the success path, not only 0%)."""
    from PIL import Image
    from worldstep.envs.push_sim import PushSimEnv, PushState, render_state

    goal = np.array([40.0, 40.0])
    start = render_state(PushState(effector=np.array([12.0, 12.0]), block=goal.copy(), goal=goal))
    Image.fromarray(start).save(tmp_path / "start.png")
    done = lerobot_eval(policies / "act", served["url"], served["token_file"], tmp_path / "out", tmp_path / "rec",
                        dataset, "last_action", f"--env.image={tmp_path / 'start.png'}")
    assert done.returncode == 0, done.stderr[-4000:]
    reported = json.loads((tmp_path / "out" / "eval_info.json").read_text())
    metrics = reported["per_task"][0]["metrics"]
    judgements = []
    for e in range(2):
        record = dict(np.load(tmp_path / "rec" / f"seed_{SEED + e}.npz"))
        windows = [PushSimEnv.success_from_frames(start, window) for window in record["frames"]]
        np.testing.assert_array_equal(record["success"], windows)
        judgements.append(any(windows))
    assert any(judgements)  # the path under test: a success reached LeRobot
    assert metrics["successes"] == judgements
    assert reported["overall"]["pc_success"] == 100 * np.mean(judgements)


def test_the_env_gathers_a_chunk_per_window_and_holds_the_frame(served, dataset):
    token = served["token_file"].read_text().strip()
    options = PolicyEnvOptions(robot_state="last_action", stats=str(dataset), max_windows=2)
    with pytest.raises(ValueError, match="frame_height=48 is invalid"):
        LeRobotPolicyEnv(served["url"], token, options, expect=(48, 64, 2))
    env = LeRobotPolicyEnv(served["url"], token, options, expect=(64, 64, 2))
    try:
        assert (env.chunk, env._max_episode_steps, env.task) == (CHUNK, 2 * CHUNK, env.remote.prompt)
        with pytest.raises(gym.error.ResetNeeded):
            env.step(np.zeros(2, np.float32))
        obs, info = env.reset(seed=3)
        assert info == {"is_success": False, "fresh": True}
        start = obs["pixels"]["top"]
        for step in range(1, 2 * CHUNK + 1):
            action = np.full(2, 0.25 * step, np.float32)
            obs, reward, terminated, truncated, info = env.step(action)
            np.testing.assert_array_equal(obs["agent_pos"], action)
            assert info["fresh"] == (step % CHUNK == 0)
            if step < CHUNK:
                np.testing.assert_array_equal(obs["pixels"]["top"], start)
        assert truncated and not terminated and env.remote.status()["committed_step"] == 2
        with pytest.raises(ValueError, match="action of shape"):
            env.reset(seed=4)
            env.step(np.zeros(3, np.float32))
    finally:
        env.close()
    with pytest.raises(ValueError, match="robot_state='joints' is invalid"):
        PolicyEnvOptions(robot_state="joints")


def test_a_stopped_server_stops_lerobot_eval_with_the_connection_error(tmp_path, served, dataset, policies):
    served["proc"].send_signal(signal.SIGTERM)
    assert served["proc"].wait(timeout=60) == 0
    done = lerobot_eval(policies / "act", served["url"], served["token_file"], tmp_path / "out", tmp_path / "rec",
                        dataset, "zeros")
    assert done.returncode != 0
    assert f"RemoteEnvConnectionError: worldstep server {served['url']}: cannot connect" in done.stderr, \
        done.stderr[-4000:]


def test_a_start_image_that_does_not_exist_is_refused_before_connecting(tmp_path):
    from worldstep.lerobot.policy_env import PolicyEnvOptions

    with pytest.raises(ValueError, match=r"image='.*nope.png' is invalid; allowed: None or an image file that exists"):
        PolicyEnvOptions(image=str(tmp_path / "nope.png"))
