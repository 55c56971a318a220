"""Several cameras through one world model: exact compose/split, refusals naming the camera, and the wrapper
under gymnasium's checker, SB3's MultiInputPolicy, torchrl and RecordVideo."""

from __future__ import annotations

import contextlib

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_world import FAST, cache_dir  # noqa: F401 - fixture (a private WORLDSTEP_CACHE)
from worldstep.engine.models.cosmos3.canvas import resolution_bins
from worldstep.envs import CameraGrid, CameraLayout, MultiCameraObservation

BINS = sorted({(tier, h, w) for tier, bins in resolution_bins().items() for h, w in bins.values()})
CAMERAS = ("exterior", "wrist", "left", "right")


def test_every_tier_and_aspect_bin_is_covered():
    assert {tier for tier, *_ in BINS} == {256, 480, 704, 720} and len(BINS) == 20  # 5 aspect bins per tier


@pytest.mark.parametrize("bin_", BINS, ids=lambda b: f"tier{b[0]}-{b[1]}x{b[2]}")  # every bin, not a sample
@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 4), layout=st.sampled_from(list(CameraLayout)), chunk=st.integers(1, 2),
       seed=st.integers(0, 2**32 - 1))
def test_split_of_compose_is_exact_for_every_tier_and_aspect_bin(bin_, n, layout, chunk, seed):
    _, height, width = bin_
    grid = CameraGrid(CAMERAS[:n], layout, height, width)
    rng = np.random.default_rng(seed)
    views = {name: rng.integers(0, 256, (chunk, h, w, 3), dtype=np.uint8)
             for name, (h, w) in grid.view_shapes().items()}
    frame = grid.compose(views)
    assert frame.shape == (chunk, height, width, 3)
    back = grid.split(frame)
    assert list(back) == list(CAMERAS[:n])
    assert all(np.array_equal(back[name], views[name]) for name in views)
    assert np.array_equal(grid.compose(back), frame)  # and the views tile the frame: nothing left over


def test_row_layout_puts_the_views_side_by_side_in_camera_order():
    grid = CameraGrid(("exterior", "wrist", "left"), "row", 4, 10)
    assert grid.view_shapes() == {"exterior": (4, 3), "wrist": (4, 3), "left": (4, 4)}
    views = {name: np.full((4, w, 3), i, np.uint8) for i, (name, (_, w)) in enumerate(grid.view_shapes().items())}
    assert np.array_equal(grid.compose(views), np.concatenate(list(views.values()), axis=1))
    column = CameraGrid(("exterior", "wrist"), "column", 5, 4)
    assert column.view_shapes() == {"exterior": (2, 4), "wrist": (3, 4)}


@pytest.mark.parametrize("views, match", [
    ({"exterior": np.zeros((8, 4, 3), np.uint8), "wrist": np.zeros((8, 4, 3), np.uint8),
      "top": np.zeros((8, 4, 3), np.uint8)}, r"\['top'\] is invalid: no such camera"),
    ({"exterior": np.zeros((8, 4, 3), np.uint8)}, "lacks camera 'wrist'"),
    ({"exterior": np.zeros((8, 4, 3), np.uint8), "wrist": np.zeros((8, 5, 3), np.uint8)},
     r"\['wrist'\].shape=\(8, 5, 3\) is invalid; allowed: \(8, 4, 3\)"),
    ({"exterior": np.zeros((8, 4, 3), np.float32), "wrist": np.zeros((8, 4, 3), np.uint8)},
     r"\['exterior'\] of dtype float32 is invalid"),
])
def test_bad_views_are_refused_naming_the_camera(views, match):
    with pytest.raises(ValueError, match=match):
        CameraGrid(("exterior", "wrist"), "row", 8, 8).compose(views)


def test_one_image_for_several_cameras_is_refused_naming_the_cameras():
    with pytest.raises(ValueError, match=r"views of shape \(8, 8, 3\) is invalid; allowed: a dict camera -> "
                                         r"\(h, w, 3\) uint8 view for cameras \['exterior', 'wrist'\]"):
        CameraGrid(("exterior", "wrist"), "row", 8, 8).compose(np.zeros((8, 8, 3), np.uint8))


@pytest.mark.parametrize("cameras", ["exterior", (), ("a", "a"), ("frames",), ("state", "x"), ("two words",)])
def test_bad_camera_names_are_refused(cameras):
    with pytest.raises(ValueError, match="cameras"):
        CameraGrid(cameras, "row", 8, 8)


def test_bad_layout_is_refused():
    with pytest.raises(ValueError, match=r"layout='grid' is invalid; allowed: \['row', 'column'\]"):
        CameraGrid(("a", "b"), "grid", 8, 8)


# --- the wrapper on the tiny model --------------------------------------------------------------


def make(**kwargs) -> gym.Env:
    return gym.make("worldstep/Tiny-v0", cameras=("exterior", "wrist"), max_windows=3, **FAST, **kwargs)


def first_views(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.integers(0, 256, (32, 16, 3), dtype=np.uint8) for name in ("exterior", "wrist")}


def test_gym_make_with_cameras_gives_one_box_per_camera(cache_dir):  # noqa: F811
    env = make()
    assert env.unwrapped.conditioning.view_point == "concat_view"
    assert set(env.observation_space.spaces) == {"exterior", "wrist"}
    assert env.observation_space["wrist"].shape == (4, 32, 16, 3)
    obs, _ = env.reset(seed=0, options={"image": first_views()})
    assert obs in env.observation_space
    obs, *_ = env.step(np.zeros(env.action_space.shape, np.float32))
    frames = env.unwrapped.episode.frames  # what the model generated: the composed frames
    assert np.array_equal(np.concatenate([obs["exterior"], obs["wrist"]], axis=2), frames)
    env.close()


def test_bad_first_views_are_refused_before_any_model_work(cache_dir, monkeypatch):  # noqa: F811
    env = make()
    calls = []
    monkeypatch.setattr(env.unwrapped, "reset", lambda **kw: calls.append(kw))
    views = first_views()
    for bad, match in [({**views, "top": views["wrist"]}, "'top'"), ({"exterior": views["exterior"]}, "'wrist'"),
                       ({**views, "wrist": views["wrist"][..., :2]}, "'wrist'")]:
        with pytest.raises(ValueError, match=match):
            env.reset(seed=0, options={"image": bad})
    assert calls == []  # the env never saw the bad views
    monkeypatch.undo()
    env.close()


def test_injected_violation_without_the_check_an_unknown_camera_reaches_the_env(cache_dir, monkeypatch):  # noqa: F811
    """The refusal above is the wrapper's check: a grid that skips it lets an unknown camera through."""

    class Unchecked(CameraGrid):
        def check_views(self, views, field):
            pass

    env = make()
    calls = []
    monkeypatch.setattr(env.unwrapped, "reset", lambda **kw: calls.append(kw))
    wrapper = next(w for w in _chain(env) if isinstance(w, MultiCameraObservation))
    wrapper.grid = Unchecked(*(getattr(wrapper.grid, f) for f in ("cameras", "layout", "height", "width")))
    with pytest.raises(Exception):  # noqa: B017 - the stub env returns nothing; what matters is that it was called
        env.reset(seed=0, options={"image": {**first_views(), "top": first_views()["wrist"]}})
    assert len(calls) == 1
    monkeypatch.undo()
    env.close()


def test_an_env_not_framed_as_concat_view_is_refused(cache_dir):  # noqa: F811
    with pytest.raises(ValueError, match="view point 'ego_view' is invalid for several cameras"):
        make(view_point="ego_view")


def test_gymnasium_checker_passes(cache_dir):  # noqa: F811
    from gymnasium.utils.env_checker import check_env

    env = worldstep.make_env("tiny", cameras=("exterior", "wrist"), robot_state=True, **FAST)
    check_env(env, skip_render_check=True)
    env.close()


def test_sb3_multi_input_policy_runs(cache_dir):  # noqa: F811
    import stable_baselines3 as sb3

    env = make(robot_state=True)
    model = sb3.PPO("MultiInputPolicy", env, n_steps=4, batch_size=4, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=4)
    obs, _ = env.reset(seed=0, options={"image": first_views()})
    action, _ = model.predict(obs, deterministic=True)
    assert action.shape == env.action_space.shape
    env.close()


def test_torchrl_runs(cache_dir):  # noqa: F811
    import torch
    from torchrl.envs import GymWrapper, check_env_specs

    env = GymWrapper(make(robot_state=True))
    try:
        check_env_specs(env)
        td = env.rollout(2)
        assert td["next", "exterior"].shape == (2, 4, 32, 16, 3) and td["next", "wrist"].dtype == torch.uint8
        assert td["next", "observation"].shape == (2, 4, 10)  # torchrl renames a gym "state" key "observation"
    finally:
        env.close()


def test_record_video_shows_every_camera_side_by_side(cache_dir, tmp_path):  # noqa: F811
    env = gym.wrappers.RecordVideo(make(render_mode="rgb_array"), str(tmp_path), episode_trigger=lambda _: True)
    obs, _ = env.reset(seed=0, options={"image": first_views()})
    views = [obs]
    for _ in range(2):
        views.append(env.step(np.zeros(env.action_space.shape, np.float32))[0])
    recorded = list(env.recorded_frames)
    assert len(recorded) == 3 and recorded[0].shape == (32, 32, 3)
    for frame, obs in zip(recorded, views, strict=True):  # one render per window: its last frame, both cameras
        assert np.array_equal(frame, np.concatenate([obs["exterior"][-1], obs["wrist"][-1]], axis=1))
    env.close()
    assert list(tmp_path.glob("*.mp4"))


def test_renders_show_every_camera_side_by_side(cache_dir):  # noqa: F811
    """What RecordVideo records, without its moviepy dependency: one render() per reset and per window."""
    env = gym.wrappers.RenderCollection(make(render_mode="rgb_array"))
    views = [env.reset(seed=0, options={"image": first_views()})[0]]
    views.append(env.step(np.zeros(env.action_space.shape, np.float32))[0])
    rendered = env.render()
    assert len(rendered) == 2
    for frame, obs in zip(rendered, views, strict=True):
        assert np.array_equal(frame, np.concatenate([obs["exterior"][-1], obs["wrist"][-1]], axis=1))
    env.close()


def _chain(env):
    while True:
        yield env
        if not hasattr(env, "env"):
            return
        env = env.env


def test_worldstep_make_env_takes_the_same_keywords(cache_dir):  # noqa: F811
    env = worldstep.make_env("tiny", cameras=("exterior", "wrist"), camera_layout="column", **FAST)
    assert env.observation_space["exterior"].shape == (4, 16, 32, 3)
    with pytest.raises(ValueError, match="layout="):
        worldstep.make_env("tiny", cameras=("exterior", "wrist"), camera_layout="diagonal", **FAST)
    with pytest.raises(ValueError, match="camera_layout='column' is invalid without cameras"):
        worldstep.make_env("tiny", camera_layout="column", **FAST)
    env.close()
    views = {"exterior": np.full((16, 32, 3), 10, np.uint8), "wrist": np.full((16, 32, 3), 200, np.uint8)}
    env = worldstep.make_env("tiny", cameras=("exterior", "wrist"), camera_layout="column", image=views, **FAST)
    env.reset(seed=0)  # the episode starts from the default first views, stacked
    assert np.array_equal(env.unwrapped.first_image, np.concatenate([views["exterior"], views["wrist"]]))
    env.close()


def test_views_of_any_size_are_cover_cropped_into_their_slots(cache_dir, monkeypatch):  # noqa: F811
    """A DROID camera's 180x320 frames, and views of any other size, go into their 32x16 slots the way one first
    frame goes into the model's frame (engine.vae.encoder.cover_crop); a view of the slot's size is kept as is."""
    from worldstep.engine.vae.encoder import cover_crop

    env = make()
    calls = []
    monkeypatch.setattr(env.unwrapped, "reset", lambda **kw: calls.append(kw) or ({}, {}))
    rng = np.random.default_rng(1)
    views = {"exterior": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
             "wrist": rng.integers(0, 256, (32, 16, 3), dtype=np.uint8)}
    with contextlib.suppress(Exception):  # the stub env returns no observation; what matters is what it got
        env.reset(seed=0, options={"image": views})
    composed = calls[0]["options"]["image"]
    assert composed.shape == (32, 32, 3)
    assert np.array_equal(composed[:, :16], cover_crop(views["exterior"], 32, 16))
    assert np.array_equal(composed[:, 16:], views["wrist"])
    monkeypatch.undo()
    obs, _ = env.reset(seed=0, options={"image": {"exterior": views["exterior"], "wrist": views["exterior"][:90]}})
    assert obs["exterior"].shape == (4, 32, 16, 3)
    env.close()
