"""PushSimEnv: spaces, determinism, check_env, physics, and the frame detector against the true state."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from worldstep.envs.push_sim import (
    SUCCESS_RADIUS,
    PushSimEnv,
    PushState,
    detect_objects,
    frame_success,
    physics_step,
    push_oracle,
    render_state,
)


def _rollout(seed: int, windows: int = 3) -> tuple[list[np.ndarray], list[dict]]:
    env = PushSimEnv(chunk_size=4)
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    frames, infos = [obs["frames"]], [info]
    for _ in range(windows):
        obs, _, _, _, info = env.step(env.action_space.sample())
        frames.append(obs["frames"])
        infos.append(info)
    return frames, infos


def test_spaces_and_shapes():
    env = PushSimEnv(chunk_size=8, render_mode="rgb_array")
    assert env.action_space.shape == (8, 2)
    obs, info = env.reset(seed=0)
    assert obs["frames"].shape == (8, 64, 64, 3) and obs["frames"].dtype == np.uint8
    assert (obs["frames"] == obs["frames"][:1]).all()  # reset repeats the first frame
    assert env.observation_space.contains(obs)
    obs, reward, terminated, truncated, info = env.step(np.zeros((8, 2), np.float32))
    assert env.observation_space.contains(obs) and truncated is False
    assert info["states"].shape == (8, 3, 2)
    assert np.array_equal(env.render(), obs["frames"][-1])


@pytest.mark.parametrize("bad", [0, 3, 6, True, 4.0])
def test_bad_chunk_size_raises(bad):
    with pytest.raises(ValueError, match="chunk_size"):
        PushSimEnv(chunk_size=bad)


def test_bad_action_shape_raises():
    env = PushSimEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((3, 2), np.float32))


def test_deterministic_given_seed_and_actions():
    a_frames, a_infos = _rollout(7)
    b_frames, b_infos = _rollout(7)
    c_frames, _ = _rollout(8)
    assert all(np.array_equal(a, b) for a, b in zip(a_frames, b_frames))
    assert all(np.array_equal(a["states"], b["states"]) for a, b in zip(a_infos, b_infos))
    assert not np.array_equal(a_frames[0], c_frames[0])


def test_check_env_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if "worldstep/PushSim-v0" not in gym.registry:  # a spec lets check_env test the render modes
            gym.register("worldstep/PushSim-v0", entry_point="worldstep.envs.push_sim:PushSimEnv")
        check_env(gym.make("worldstep/PushSim-v0", render_mode="rgb_array").unwrapped)


def test_effector_pushes_block_and_walls_stop():
    state = PushState(np.array([20.0, 32.0]), np.array([31.0, 32.0]), np.array([50.0, 50.0]))
    moved = physics_step(state, np.array([1.0, 0.0]))
    assert moved.block[0] > state.block[0]  # pushed along +x
    assert moved.effector[0] + 10 <= moved.block[0] + 1e-9  # no overlap after contact
    wall = PushState(np.array([4.0, 4.0]), np.array([40.0, 40.0]), np.array([20.0, 50.0]))
    assert np.array_equal(physics_step(wall, np.array([-1.0, -1.0])).effector, [4.0, 4.0])


@pytest.mark.parametrize("seed", range(6))
def test_detector_agrees_with_true_state(seed):
    frames, infos = _rollout(seed, windows=2)
    first = detect_objects(frames[0][0])  # the first frame shows the whole goal ring
    assert np.abs(first["goal"] - infos[0]["goal"]).max() < 0.3
    for chunk, info in zip(frames[1:], infos[1:]):
        for frame, (eff, block, goal) in zip(chunk, info["states"]):
            found = detect_objects(frame)
            assert np.abs(found["block"] - block).max() < 0.6
            # the effector may cover part of the ring or touch the block; it is never covered itself
            assert np.abs(found["effector"] - eff).max() < 0.3
            assert np.abs(found["goal"] - goal).max() < 2.5


def test_frame_success_matches_true_success():
    goal = np.array([32.0, 32.0])
    inside = PushState(np.array([10.0, 10.0]), goal + SUCCESS_RADIUS - 1, goal)
    outside = PushState(np.array([10.0, 10.0]), goal + SUCCESS_RADIUS + 3, goal)
    assert inside.success and frame_success(render_state(inside), goal)
    assert not outside.success and not frame_success(render_state(outside), goal)
    assert not frame_success(np.zeros((64, 64, 3), np.uint8))  # nothing visible: no success


def test_oracle_solves_most_episodes():
    wins = 0
    for seed in range(10):
        env = PushSimEnv()
        env.reset(seed=seed)
        for _ in range(16):
            rows, s = [], env.state
            for _ in range(4):
                rows.append(push_oracle(s))
                s = physics_step(s, rows[-1])
            *_, terminated, _, _ = env.step(np.stack(rows))
            if terminated:
                wins += 1
                break
    assert wins >= 6


def test_first_frame_is_the_reset_frame():
    from worldstep.envs.push_sim import first_frame

    env = PushSimEnv()
    obs, _ = env.reset(seed=11)
    assert np.array_equal(first_frame(np.random.default_rng(11)), obs["frames"][0])


@pytest.mark.parametrize("chunk_size", [4, 8])
def test_render_fps_plays_a_video_of_the_renders_in_real_time(chunk_size):
    """render() gives one frame per step of `chunk_size` frames: a video of the renders (RecordVideo) must play
    as long as the episode's frames do at frame_fps."""
    env = PushSimEnv(chunk_size=chunk_size, render_mode="rgb_array")
    env.reset(seed=0)
    steps = 3
    renders = [env.render()] + [env.step(np.zeros((chunk_size, 2), np.float32)) and env.render() for _ in range(steps)]
    assert all(r.shape == (64, 64, 3) for r in renders)
    video_s = (len(renders) - 1) / env.metadata["render_fps"]
    assert video_s == pytest.approx(steps * chunk_size / env.metadata["frame_fps"])
    assert type(env).metadata["render_fps"] == 24 / 4  # the class default: the default chunk of 4
