"""Imagined episodes out: evaluate(..., lerobot_out=DIR) and `worldstep rollout --lerobot-out DIR` write the
episodes as a LeRobot v3.0 dataset (frames, actions, state, task, success), read back by worldstep here and by
LeRobot's own reader (tests/test_lerobot_interop.py runs it); written atomically, an interrupted run leaves none."""

from __future__ import annotations

import av
import numpy as np
import pytest
import worldstep
from lerobot_data import run_lerobot
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.envs.video import frame_fps
from worldstep.lerobot import RobotDataset
from worldstep.lerobot.imagined import RecordLeRobot
from worldstep.policies import SinePolicy


def mp4_frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_evaluate_writes_a_lerobot_dataset(world, tmp_path):  # noqa: F811
    episodes = [{"seed": 1, "max_windows": 2, "prompt": "push the red cube"}, {"seed": 2, "max_windows": 3}]
    report = worldstep.evaluate(world, SinePolicy(world.action_shape), episodes, out_dir=tmp_path / "eval",
                                progress=False, lerobot_out=tmp_path / "imagined",
                                success_fn=lambda frames: float(frames.mean()) >= 0)  # every window succeeds
    ds = RobotDataset(tmp_path / "imagined")
    chunk, width = world.action_shape
    assert ds.info.version == "v3.0" and ds.num_episodes == 2 and ds.camera_keys == ("observation.image",)
    env = worldstep.make_env(world)
    assert ds.fps == frame_fps(env) and ds.action_width == width
    env.close()
    assert [s.task for s in ds.spans] == ["push the red cube", world.config.env.prompt]
    for e, result in enumerate(report.episodes):
        episode = ds.episode(e)
        assert episode.length == 1 + result.windows * chunk
        mp4 = mp4_frames(result.video)  # the episode's own video: the same frames through another encoder
        err = np.abs(episode.frames["observation.image"].astype(int) - mp4.astype(int)).mean()
        assert err < 12, err
    run_lerobot("v3.0", "read", tmp_path / "imagined", tmp_path / "seen.npz")
    seen = np.load(tmp_path / "seen.npz")
    assert int(seen["num_episodes"]) == 2 and str(seen["success"]) == "[true, true]"
    assert seen["action"].shape == (sum(1 + r.windows * chunk for r in report.episodes), width)


def test_actions_and_state_rows_follow_the_frames(world, tmp_path):  # noqa: F811
    env = worldstep.make_env(world, max_windows=4, embodiment="droid_lerobot", robot_state=True)
    recorder = RecordLeRobot(env, tmp_path / "ds", codec="h264")
    chunks, states = [], []
    obs, _ = recorder.reset(seed=3, options={"prompt": "wipe the table"})
    states.append(obs["state"][:1])
    rng = np.random.default_rng(0)
    for _ in range(2):
        action = (0.01 * rng.standard_normal(env.action_space.shape)).astype(np.float32)
        action[:, 3], action[:, 7] = 1.0, 1.0  # near the identity rotation
        obs, *_ = recorder.step(action)
        chunks.append(action)
        states.append(obs["state"])
    recorder.finish()
    recorder.close()
    episode = RobotDataset(tmp_path / "ds").episode(0)
    actions = np.concatenate(chunks)
    np.testing.assert_array_equal(episode.actions, np.concatenate([actions, actions[-1:]]))
    np.testing.assert_array_equal(episode.state, np.concatenate(states))
    assert episode.task == "wipe the table" and episode.length == 1 + 2 * len(chunks[0])


class Interrupting(SinePolicy):
    def __init__(self, shape, after: int) -> None:
        super().__init__(shape)
        self.calls, self.after = 0, after

    def __deepcopy__(self, memo):  # a batched run's per-slot copies share the count
        return self

    def __call__(self, obs):
        self.calls += 1
        if self.calls > self.after:
            raise KeyboardInterrupt
        return super().__call__(obs)


@pytest.mark.parametrize("batched", [False, True])
def test_an_interrupted_run_leaves_no_dataset(world, tmp_path, batched):  # noqa: F811
    with pytest.raises(KeyboardInterrupt):
        worldstep.evaluate(world, Interrupting(world.action_shape, after=3), [{"max_windows": 2}] * 3,
                           out_dir=tmp_path / "eval", progress=False, lerobot_out=tmp_path / "imagined",
                           batched=batched, batch_size=1)
    # the first episode had finished (in its own batch, batched): no dataset, and no hidden half of one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval"]


def test_refusals_before_any_work(world, tmp_path):  # noqa: F811
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="lerobot_out=.*taken.* is invalid: it exists"):
        worldstep.evaluate(world, SinePolicy(world.action_shape), 1, out_dir=tmp_path / "eval", progress=False,
                           lerobot_out=tmp_path / "taken")
    with pytest.raises(ValueError, match="lerobot_out is invalid with backend='ray'"):
        worldstep.evaluate(world, SinePolicy(world.action_shape), 1, out_dir=tmp_path / "eval", backend="ray",
                           progress=False, lerobot_out=tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # nothing ran


def test_a_batched_evaluate_writes_the_same_episodes(world, tmp_path):  # noqa: F811
    """Batched, the dataset holds the episodes in their order, each the same episode as run alone: the same tasks,
    lengths and actions, and frames within a mean level (a batched step's frames are within 1 level of the
    unbatched ones, tiny_world.assert_frames_match_batched; both then go through the same encoder)."""
    episodes = [{"seed": 1, "max_windows": 2, "prompt": "push the red cube"}, {"seed": 2, "max_windows": 1},
                {"seed": 3, "max_windows": 2}]
    for name, batched in (("alone", False), ("batched", True)):
        worldstep.evaluate(world, SinePolicy(world.action_shape), episodes, out_dir=tmp_path / f"eval-{name}",
                           progress=False, record_video=False, batched=batched, batch_size=2,
                           lerobot_out=tmp_path / name)
    alone, batched = RobotDataset(tmp_path / "alone"), RobotDataset(tmp_path / "batched")
    assert [s.task for s in batched.spans] == [s.task for s in alone.spans]
    assert [s.length for s in batched.spans] == [s.length for s in alone.spans] == [9, 5, 9]
    for e in range(3):
        a, b = alone.episode(e), batched.episode(e)
        np.testing.assert_array_equal(a.actions, b.actions)
        assert np.abs(a.frames["observation.image"].astype(int) - b.frames["observation.image"]).mean() < 1.0


def test_cli_rollout_lerobot_out(world, tmp_path, capsys):  # noqa: F811
    from worldstep.cli import main

    code = main(["rollout", "--env", "worldstep/Tiny-v0", "--set", "height=32", "--set", "width=32", "--set",
                 "num_steps=1", "--windows", "2", "--out", str(tmp_path / "r.mp4"), "--quiet",
                 "--lerobot-out", str(tmp_path / "ds")])
    assert code == 0, capsys.readouterr().err
    episode = RobotDataset(tmp_path / "ds").episode(0)
    assert episode.length == 1 + 2 * world.action_shape[0]
    assert main(["rollout", "--env", "worldstep/Tiny-v0", "--windows", "1", "--out", str(tmp_path / "s.mp4"),
                 "--lerobot-out", str(tmp_path / "ds")]) == 2
    assert "--lerobot-out=" in capsys.readouterr().err and not (tmp_path / "s.mp4").exists()
