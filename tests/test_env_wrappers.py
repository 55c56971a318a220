"""RecordRollout and the mp4 writer: every frame of every window, readable with av."""

from __future__ import annotations

import av
import gymnasium as gym
import numpy as np
import pytest
import worldstep
from tiny_world import cache_dir, world, zeros  # noqa: F401 - fixtures
from worldstep.envs import Mp4Writer, RecordRollout
from worldstep.envs.video import read_video, write_video


def test_record_rollout_writes_every_frame(world, tmp_path):  # noqa: F811
    env = RecordRollout(worldstep.make_env(world, max_windows=2), tmp_path / "videos", name_prefix="ep")
    obs, _ = env.reset(seed=0)
    frames = [obs["frames"][:1]]
    for _ in range(2):
        obs, _, _, truncated, _ = env.step(zeros(env.action_space))
        frames.append(obs["frames"])
    assert truncated
    path = env.last_video_path
    assert path == tmp_path / "videos" / "ep-000.mp4"
    env.reset(seed=1)
    env.close()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert float(stream.average_rate) == env.unwrapped.metadata["frame_fps"] == 15  # droid_lerobot
    video = read_video(path)
    expected = np.concatenate(frames)
    assert video.shape == expected.shape == (1 + 2 * 4, world.spec.height, world.spec.width, 3)
    assert np.abs(video.astype(int) - expected).mean() < 40  # lossy codec, same pictures
    assert len(env.video_paths) == 2 and read_video(env.video_paths[1]).shape[0] == 1


def test_record_rollout_checks_arguments(world, tmp_path):  # noqa: F811
    env = worldstep.make_env(world)
    with pytest.raises(TypeError, match="env="):
        RecordRollout("env", tmp_path)
    with pytest.raises(TypeError, match="observation_space"):
        RecordRollout(gym.make("CartPole-v1"), tmp_path)
    with pytest.raises(TypeError, match="video_folder"):
        RecordRollout(env, 3)
    with pytest.raises(ValueError, match="name_prefix"):
        RecordRollout(env, tmp_path, name_prefix="")


def test_mp4_writer_pads_odd_sizes_and_checks_input(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (5, 17, 23, 3), dtype=np.uint8)
    video = read_video(write_video(tmp_path / "odd.mp4", frames, fps=12))
    assert video.shape == (5, 18, 24, 3)
    with Mp4Writer(tmp_path / "x.mp4", fps=24) as writer:
        with pytest.raises(ValueError, match="uint8"):
            writer.write(np.zeros((2, 8, 8, 3), np.float32))
        writer.write(np.zeros((16, 16, 3), np.uint8))
        with pytest.raises(ValueError, match="differs"):
            writer.write(np.zeros((1, 32, 32, 3), np.uint8))
    writer.close()
    assert writer.frames_written == 1
    with pytest.raises(ValueError, match="fps"):
        Mp4Writer(tmp_path / "y.mp4", fps=0)
    with pytest.raises(ValueError, match="closed"):
        writer.write(np.zeros((16, 16, 3), np.uint8))
