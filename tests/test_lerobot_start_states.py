"""Start states from data: reproducible (episode, frame) draws, reset options from a recorded frame (its task as
the prompt, its state as the robot's starting state, one or several cameras of any size), `evaluate` and
`worldstep eval` over a dataset's starts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import worldstep
from lerobot_data import CAMERAS, episodes, write_v30
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.lerobot import DatasetError, RobotDataset
from worldstep.lerobot.start_states import StartState, dataset_episodes, draw_start_states, start_options
from worldstep.policies import SinePolicy

IDENTITY = np.array([0, 0, 0, 1, 0, 0, 0, 1, 0, 0], np.float32)  # droid_lerobot: position, 6-D rotation, gripper


@pytest.fixture(scope="module")
def droid(tmp_path_factory):
    """Two cameras, 10-wide actions and states at 15 fps (the tiny model's droid_lerobot embodiment)."""
    recorded = episodes([6, 9, 4], state_width=10, seed=8)
    for e, r in enumerate(recorded):
        r.state[:] = IDENTITY
        r.state[:, :3] = np.arange(len(r.state))[:, None] * 0.01 + e  # positions that differ per frame
    return write_v30(tmp_path_factory.mktemp("starts") / "ds", recorded, fps=15, codec="h264"), recorded


def test_draws_are_reproducible_and_leave_room(droid):
    ds = RobotDataset(droid[0])
    a, b = draw_start_states(ds, 30, seed=4, room=3), draw_start_states(ds, 30, seed=4, room=3)
    assert a == b and a != draw_start_states(ds, 30, seed=5, room=3)
    assert all(s.frame < ds.spans[s.episode].length - 3 for s in a)
    assert {s.episode for s in a} == {0, 1, 2}
    assert {s.episode for s in draw_start_states(ds, 30, seed=4, room=5)} == {0, 1}  # episode 2 has 4 frames
    with pytest.raises(DatasetError, match="no episode .* more than room=9"):
        draw_start_states(ds, 1, seed=0, room=9)
    with pytest.raises(ValueError, match="count=0 is invalid"):
        draw_start_states(ds, 0, seed=0)


def test_start_options_hold_the_recorded_frame_task_and_state(droid):
    root, recorded = droid
    ds = RobotDataset(root)
    options = start_options(ds, StartState(1, 5), camera=CAMERAS[1], state=True)
    assert options["prompt"] == recorded[1].task
    np.testing.assert_array_equal(options["image"], ds.episode(1).frames[CAMERAS[1]][5])
    np.testing.assert_array_equal(options["state"], recorded[1].state[5])
    views = start_options(ds, StartState(0, 2), cameras=["exterior", "wrist"])["image"]
    assert sorted(views) == ["exterior", "wrist"] and views["wrist"].shape == (48, 64, 3)
    with pytest.raises(ValueError, match="frame=9 is invalid for episode 0; allowed: 0 .. 5"):
        start_options(ds, StartState(0, 9))
    with pytest.raises(DatasetError, match=r"need video features \['observation.images.top'\]"):
        start_options(ds, StartState(0, 0), cameras=["exterior", "top"])


def test_an_env_resets_to_a_recorded_start(world, droid, monkeypatch):  # noqa: F811
    ds = RobotDataset(droid[0])
    env = worldstep.make_env(world, embodiment="droid_lerobot", robot_state=True, cameras=("exterior", "wrist"))
    prompts, model = [], env.unwrapped.model
    real = model.open_checked  # the env opens its episodes with inputs it checked itself
    monkeypatch.setattr(model, "open_checked", lambda image, prompt, *a, **k: prompts.append(prompt)
                        or real(image, prompt, *a, **k))
    obs, _ = env.reset(seed=0, options=start_options(ds, StartState(1, 5), cameras=env.cameras, state=True))
    np.testing.assert_allclose(obs["state"][0], droid[1][1].state[5], atol=1e-6)  # the recorded robot state
    assert obs["exterior"].shape == (4, 32, 16, 3)  # 48x64 views cover-cropped into their 32x16 slots
    assert prompts == [droid[1][1].task]  # the episode's task is the prompt
    env.close()


def test_evaluate_and_eval_take_a_dataset_as_their_episodes(world, droid, tmp_path):  # noqa: F811
    root = droid[0]
    listed = dataset_episodes(str(root), starts=3, seed=2)
    drawn = draw_start_states(RobotDataset(root), 3, seed=2)
    assert [(e["start"]["episode"], e["start"]["frame"]) for e in listed] == [(s.episode, s.frame) for s in drawn]
    report = worldstep.evaluate(world, SinePolicy(world.action_shape), [{**e, "max_windows": 1} for e in listed],
                                out_dir=tmp_path / "eval", progress=False, record_video=False)
    assert len(report.episodes) == 3 and all(e.status == "ok" for e in report.episodes)
    from worldstep.cli import main

    code = main(["eval", str(root), "--set", "height=32", "--set", "width=32", "--set", "num_steps=1", "--set",
                 "max_windows=1", "--no-video", "--quiet", "--out-dir", str(tmp_path / "cli")])
    assert code == 0
    assert len(json.loads((tmp_path / "cli" / "report.json").read_text())["episodes"]) == 3  # frame 0 of each


def test_a_recorded_state_is_refused_in_a_batched_evaluation(world, droid, tmp_path):  # noqa: F811
    episode = {"start": {"dataset": str(droid[0]), "episode": 0, "state": True}, "max_windows": 1}
    with pytest.raises(ValueError, match=r"episodes\[0\].start.state=True is invalid with batched=True"):
        worldstep.evaluate(world, SinePolicy(world.action_shape), [episode], out_dir=tmp_path / "eval", batched=True,
                           progress=False)
