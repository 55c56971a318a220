"""A world-model env that names its simulator starts where the simulator starts, and `rollout --truth` shows both."""

from __future__ import annotations

import json

import av
import gymnasium as gym
import numpy as np
import pytest
import worldstep
from worldstep.cli import main as cli_main
from worldstep.envs.push_sim import PushSimEnv, first_frame
from worldstep.envs.scene import SimulatorScene
from worldstep.measures.frames import psnr
from worldstep.policies import make_policy
from worldstep.truth import HEADER_PX, rollout_with_truth, side_by_side


@pytest.fixture(scope="module")
def pusher():
    return worldstep.load("pusher")


def _sim_first_frame(seed: int) -> np.ndarray:
    obs, _ = PushSimEnv().reset(seed=seed)
    return obs["frames"][0]


def test_simulator_scene_is_the_simulators_first_frame_for_the_same_seed():
    scene = SimulatorScene("worldstep/PushSim-v0")
    rng = np.random.default_rng(0)
    for seed in (0, 7, 123):
        frame, used = scene(seed, rng)
        assert used == seed and np.array_equal(frame, _sim_first_frame(seed))
    frame, used = scene(None, np.random.default_rng(5))  # no seed: one drawn from the env's RNG, and reported
    assert np.array_equal(frame, _sim_first_frame(used))
    scene.close()
    assert scene._env is None


def test_unknown_simulator_is_a_value_error_naming_it(pusher):
    with pytest.raises(ValueError, match=r"simulator='worldstep/NoSuch-v0' is invalid; allowed: a registered"):
        worldstep.make_env(pusher, simulator="worldstep/NoSuch-v0")


def test_pusher_env_resets_to_the_simulator_scene(pusher, monkeypatch):
    env = worldstep.make_env(pusher)
    model = env.unwrapped.model
    seen = []
    real_open = model.open_checked  # the env opens its episodes with inputs it checked itself
    monkeypatch.setattr(model, "open_checked",
                        lambda image, *a, **k: seen.append(image) or real_open(image, *a, **k))
    _, info = env.reset(seed=11)
    assert info["scene_seed"] == 11 and np.array_equal(seen[-1], _sim_first_frame(11))
    _, info = env.reset()  # unseeded: continues the env's RNG, reports the simulator seed that reproduces it
    assert np.array_equal(seen[-1], _sim_first_frame(info["scene_seed"]))
    _, info = env.reset(seed=3, options={"image": first_frame(np.random.default_rng(9))})  # an image wins
    assert "scene_seed" not in info and np.array_equal(seen[-1], first_frame(np.random.default_rng(9)))
    scene = env.unwrapped._scene
    env.close()
    assert scene._env is None and model.kv.num_used_pages == 0 and model.live_sessions == 0


def test_rollout_with_truth_replays_the_models_actions_in_the_simulator(pusher, tmp_path):
    env = worldstep.make_env(pusher)
    truth = PushSimEnv()
    chosen = []
    expert = make_policy("push", env.action_space)

    class Recording:
        def reset(self, seed=None):
            expert.reset(seed)

        def __call__(self, obs):
            chosen.append(expert(obs))
            return chosen[-1]

    result = rollout_with_truth(env, truth, Recording(), seed=4, max_windows=3, video_path=tmp_path / "both.mp4")
    env.close()
    assert result.episode.windows == 3 and result.episode.frames == 12 and len(result.psnr_db) == 3
    # the simulator's side is exactly the replay of the actions the policy chose from the model's frames
    replay = PushSimEnv()
    obs, _ = replay.reset(seed=4)
    frames = [obs["frames"][:1]]
    for actions in chosen:
        obs, *_ = replay.step(actions)
        frames.append(obs["frames"])
    with av.open(str(result.episode.video)) as container:
        video = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(video) == 13 and video[0].shape == (HEADER_PX + 256, 520, 3)  # a label strip over the halves
    right = np.concatenate(frames)[:, ::1].repeat(4, 1).repeat(4, 2)
    # lossy codec: the right half matches the simulator's frames closely, not bit for bit
    assert np.mean([psnr(v[HEADER_PX:, 264:], r) for v, r in zip(video, right)]) > 30
    # the model's frames resemble the simulator's (a trained model, not noise) and the PSNR is per window
    assert all(p > 14 for p in result.psnr_db)


def test_side_by_side_layout():
    left = np.zeros((2, 4, 4, 3), np.uint8)
    right = np.full((2, 4, 4, 3), 9, np.uint8)
    joined = side_by_side(left, right, scale=2, gap=1)
    assert joined.shape == (2, 8, 18, 3)
    assert (joined[:, :, :8] == 0).all() and (joined[:, :, 8:10] == 255).all() and (joined[:, :, 10:] == 9).all()


def test_side_by_side_labels_its_halves_and_captions_the_window():
    left = np.zeros((1, 64, 64, 3), np.uint8)
    right = np.full((1, 64, 64, 3), 9, np.uint8)
    plain = side_by_side(left, right)
    labelled = side_by_side(left, right, labels=("model", "simulator"), caption="window 3   PSNR 24.1 dB")
    assert labelled.shape == (1, HEADER_PX + 256, 520, 3)
    assert np.array_equal(labelled[:, HEADER_PX:], plain)  # the frames themselves are untouched
    names = labelled[0, : HEADER_PX // 2]
    assert names[:, :256].max() > 128 and names[:, 264:].max() > 128  # a name over each half
    other = side_by_side(left, right, labels=("model", "simulator"), caption="window 4   PSNR 19.0 dB")
    assert np.array_equal(other[0, : HEADER_PX // 2], names)  # same names
    assert not np.array_equal(other[0, HEADER_PX // 2 : HEADER_PX], labelled[0, HEADER_PX // 2 : HEADER_PX])


def test_push_policy_solves_the_simulator_and_rejects_other_action_widths():
    env = gym.make("worldstep/PushSim-v0")
    policy = make_policy("push", env.action_space)
    solved = 0
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        policy.reset(seed)
        for _ in range(16):
            obs, _, terminated, truncated, _ = env.step(policy(obs))
            if terminated or truncated:
                break
        solved += terminated
    assert solved >= 4
    with pytest.raises(ValueError, match=r"policy='push' needs actions \(chunk, 2\)"):
        make_policy("push", (4, 3))


def test_cli_truth_writes_side_by_side_video_and_summary(tmp_path, capsys):
    out = tmp_path / "demo.mp4"
    assert cli_main(["rollout", "--env", "worldstep/Pusher-v0", "--policy", "push", "--windows", "2", "--truth",
                     "--out", str(out), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["simulator"] == "worldstep/PushSim-v0" and summary["windows"] == 2
    assert len(summary["psnr_db"]) == 2 and out.stat().st_size > 0
    assert "PSNR per window" in capsys.readouterr().out


def test_cli_truth_needs_a_simulator(tmp_path, capsys):
    assert cli_main(["rollout", "--env", "worldstep/Tiny-v0", "--truth", "--windows", "1",
                     "--out", str(tmp_path / "x.mp4"), "--quiet"]) == 2
    assert "env.simulator is None" in capsys.readouterr().err
    assert cli_main(["rollout", "--env", "worldstep/Pusher-v0", "--truth", "--image", "x.png",
                     "--out", str(tmp_path / "x.mp4"), "--quiet"]) == 2
    assert "--truth with --image is invalid" in capsys.readouterr().err


def test_make_demo_command_runs(tmp_path):
    """The README's main job, as the Makefile spells it (fewer windows)."""
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = next(ln for ln in makefile.splitlines() if "/worldstep rollout" in ln)
    argv = line.split("/worldstep", 1)[1].split()
    assert "--truth" in argv and "worldstep/Pusher-v0" in argv
    argv[argv.index("--windows") + 1] = "1"
    argv[argv.index("--out") + 1] = str(tmp_path / "rollout.mp4")
    assert cli_main([*argv, "--quiet"]) == 0
    assert (tmp_path / "rollout.mp4").stat().st_size > 0 and (tmp_path / "rollout.json").is_file()


def test_a_trained_checkpoint_folder_takes_the_run_settings_its_worldstep_json_names(tmp_path):
    import shutil
    from pathlib import Path

    from worldstep.config import ConfigError
    from worldstep.world import resolve_config

    shipped = Path(__file__).resolve().parents[1] / "configs" / "models" / "pusher"
    config = resolve_config(str(shipped))
    assert config.model.checkpoint == str(shipped) and config.model.architecture is None
    assert config.env.simulator == "worldstep/PushSim-v0" and config.env.domain_id == 0
    assert config.rollout.context_frames == 4 and config.cache.page_size == 4
    folder = tmp_path / "ckpt"
    shutil.copytree(shipped, folder)
    meta = json.loads((folder / "worldstep.json").read_text())
    (folder / "worldstep.json").write_text(json.dumps({**meta, "config": "nope"}))
    with pytest.raises(ConfigError, match=r"config = 'nope': must be one of"):
        resolve_config(str(folder))
    (folder / "worldstep.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "config"}))
    assert resolve_config(str(folder)).env.simulator is None  # no hint: Cosmos3-Edge's run settings


class _SimAsModel(PushSimEnv):
    """The simulator standing in for the model (exact imagination): both worlds' records are then known."""

    simulator = "worldstep/PushSim-v0"

    def step(self, action):  # a model env judges nothing itself (`rollout --truth` makes it with success_fn="none")
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


class _PushThenPull:
    """The pixel expert for ``push`` windows, then its last chunk's mean direction at full speed (pushes the block
    on past the goal: undoes a success)."""

    def __init__(self, push: int) -> None:
        self.expert, self.push, self.calls = make_policy("push", (4, 2)), push, 0

    def reset(self, seed=None):
        self.expert.reset(seed)
        self.calls = 0

    def __call__(self, obs):
        self.calls += 1
        if self.calls <= self.push:
            self.last = self.expert(obs)
            return self.last
        direction = self.last.mean(axis=0)
        return np.broadcast_to(direction / (np.abs(direction).max() + 1e-6), self.last.shape).astype(np.float32)


def _solved_seed(windows: int = 12) -> tuple[int, int]:
    """(seed, first success window): the first seed from 0 the pixel expert solves in ``windows`` windows."""
    sim, expert = PushSimEnv(), make_policy("push", (4, 2))
    for seed in range(50):
        obs, _ = sim.reset(seed=seed)
        first = obs["frames"][0]
        expert.reset(seed)
        for window in range(windows):
            obs, *_ = sim.step(expert(obs))
            if sim.success_from_frames(first, obs["frames"]):
                return seed, window
    raise AssertionError(f"the expert solves no seed of 0..49 in {windows} windows")


def test_each_world_stops_at_its_own_success_and_the_record_says_when(tmp_path):
    seed, success = _solved_seed()
    result = rollout_with_truth(_SimAsModel(), PushSimEnv(), make_policy("push", (4, 2)), seed=seed, max_windows=16,
                                video_path=tmp_path / "both.mp4")
    assert result.episode.windows == success + 1 and result.episode.terminated  # not 16 windows past it
    for world in (result.model, result.simulator):
        assert (world.success_window, world.final_success, world.ended) == (success, True, "success")
    flat = result.to_dict()
    assert flat["worlds"]["simulator"]["success_window"] == success and flat["success"] is True


def test_running_on_past_a_success_reports_the_success_window_and_the_final_state(tmp_path):
    seed, success = _solved_seed()
    result = rollout_with_truth(_SimAsModel(), PushSimEnv(), _PushThenPull(success + 1), seed=seed, max_windows=16,
                                run_on=True)
    assert result.episode.windows == 16  # ran on by choice
    for world in (result.model, result.simulator):
        assert world.success_window == success and world.final_success is False  # pulled back out
    assert result.episode.success is False and result.truth_success is False
