"""Small recorded-looking episodes for the LeRobot tests, and a hand-made v2.1 folder of them.

Frames are smooth colour ramps that shift every step, so a video codec keeps them close and each frame is
nearest its own source frame (a decode off by one frame is caught). The v2.1 folder follows the layout of
LeRobot's v2.1 conversion notes (``lerobot/datasets/v30/convert_dataset_v21_to_v30.py``): one parquet file
and one mp4 per camera per episode, ``meta/episodes.jsonl`` and ``meta/tasks.jsonl``. ``write_v30`` writes them
with worldstep's own writer; ``run_lerobot`` runs tests/lerobot_io.py in LeRobot's own venv.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from worldstep.lerobot.writer import DatasetWriter

CAMERAS = ("observation.images.exterior", "observation.images.wrist")
HEIGHT, WIDTH = 48, 64


@dataclass
class Recorded:
    task: str
    actions: np.ndarray  # [T, A] float32
    state: np.ndarray  # [T, S] float32
    frames: dict[str, np.ndarray]  # camera -> [T, H, W, 3] uint8


def frames(length: int, seed: int, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width] / np.array([height, width])[:, None, None]
    phase = seed * 0.7
    return np.stack([np.stack([128 + 90 * np.sin(2 * np.pi * (x + t / 12) + phase),
                               128 + 90 * np.cos(2 * np.pi * (y + t / 17) + phase),
                               np.full_like(x, 40 + 10 * t + 5 * seed % 100)], -1)
                     for t in range(length)]).round().clip(0, 255).astype(np.uint8)


def episodes(lengths: list[int], action_width: int = 10, state_width: int = 7, cameras=CAMERAS,
             seed: int = 0) -> list[Recorded]:
    rng = np.random.default_rng(seed)
    return [Recorded(f"task {e % 3}", rng.standard_normal((n, action_width)).astype(np.float32),
                     rng.standard_normal((n, state_width)).astype(np.float32),
                     {key: frames(n, seed + 7 * e + c) for c, key in enumerate(cameras)})
            for e, n in enumerate(lengths)]


def assert_frames_match(decoded: np.ndarray, source: np.ndarray, mean_abs: float = 8.0) -> None:
    """Decoded frames are the source frames up to codec loss, in the same order."""
    assert decoded.shape == source.shape, (decoded.shape, source.shape)
    err = np.abs(decoded.astype(np.int16) - source.astype(np.int16)).mean(axis=(1, 2, 3))
    assert err.max() < mean_abs, err
    cross = np.abs(decoded[:, None].astype(np.int16) - source[None].astype(np.int16)).mean(axis=(2, 3, 4))
    assert (cross.argmin(axis=1) == np.arange(len(source))).all(), cross.argmin(axis=1)


def encode(path: Path, clip: np.ndarray, fps: int, codec: str) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream({"av1": "libsvtav1", "h264": "libx264"}[codec], rate=fps)
        stream.width, stream.height, stream.pix_fmt = clip.shape[2], clip.shape[1], "yuv420p"
        stream.time_base = Fraction(1, fps)
        for t, f in enumerate(clip):
            frame = av.VideoFrame.from_ndarray(f, format="rgb24")
            frame.pts = t
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_v21(root: Path, recorded: list[Recorded], fps: int, codec: str = "h264") -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tasks = list(dict.fromkeys(r.task for r in recorded))
    cameras = list(recorded[0].frames)
    features = {"action": {"dtype": "float32", "shape": [recorded[0].actions.shape[1]], "names": None},
                "observation.state": {"dtype": "float32", "shape": [recorded[0].state.shape[1]], "names": None}}
    for key in cameras:
        features[key] = {"dtype": "video", "shape": [HEIGHT, WIDTH, 3], "names": ["height", "width", "channel"]}
    for key in ("timestamp",):
        features[key] = {"dtype": "float32", "shape": [1], "names": None}
    for key in ("frame_index", "episode_index", "index", "task_index"):
        features[key] = {"dtype": "int64", "shape": [1], "names": None}
    info = {"codebase_version": "v2.1", "robot_type": None, "total_episodes": len(recorded),
            "total_frames": sum(len(r.actions) for r in recorded), "total_tasks": len(tasks), "total_chunks": 1,
            "chunks_size": 1000, "fps": fps, "splits": {"train": f"0:{len(recorded)}"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
            "features": features}
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    (root / "meta" / "tasks.jsonl").write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n"
                                                       for i, t in enumerate(tasks)))
    (root / "meta" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_index": e, "tasks": [r.task], "length": len(r.actions)}) + "\n"
        for e, r in enumerate(recorded)))
    start = 0
    for e, r in enumerate(recorded):
        n = len(r.actions)
        table = pa.table({
            "action": pa.array(r.actions.tolist(), pa.list_(pa.float32(), r.actions.shape[1])),
            "observation.state": pa.array(r.state.tolist(), pa.list_(pa.float32(), r.state.shape[1])),
            "timestamp": pa.array([t / fps for t in range(n)], pa.float32()),
            "frame_index": pa.array(range(n), pa.int64()), "episode_index": pa.array([e] * n, pa.int64()),
            "index": pa.array(range(start, start + n), pa.int64()),
            "task_index": pa.array([tasks.index(r.task)] * n, pa.int64())})
        path = root / info["data_path"].format(episode_chunk=0, episode_index=e)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        for key in cameras:
            encode(root / info["video_path"].format(episode_chunk=0, video_key=key, episode_index=e), r.frames[key],
                   fps, codec)
        start += n
    return root


def write_v30(root, recorded, fps=15, codec="av1"):
    sizes = {k: v.shape[1:3] for k, v in recorded[0].frames.items()}
    with DatasetWriter(root, fps=fps, cameras=sizes, action_width=recorded[0].actions.shape[1],
                       state_width=recorded[0].state.shape[1], codec=codec) as writer:
        for r in recorded:
            writer.add_episode(frames=r.frames, actions=r.actions, state=r.state, task=r.task)
    return root


REPO = Path(__file__).resolve().parents[1]
HELPER = Path(__file__).with_name("lerobot_io.py")
PYTHONS = {"v3.0": ("WORLDSTEP_LEROBOT_PYTHON", ".venv-lerobot"),
           "v2.1": ("WORLDSTEP_LEROBOT_V21_PYTHON", ".venv-lerobot-v21")}


def lerobot_python(version: str) -> Path:
    variable, folder = PYTHONS[version]
    python = Path(os.environ.get(variable, REPO / folder / "bin" / "python"))
    if not python.is_file():  # part of the test install, never skipped
        pytest.fail(f"LeRobot's own environment {python} is missing: run `make install` (it builds {folder}), or set "
                    f"{variable} to a python with lerobot installed")
    return python


def ffmpeg_libs(python: Path) -> Path:
    """The folder of FFmpeg libraries LeRobot's torchcodec loads: the Makefile links the av wheel's bundled
    FFmpeg there (``<venv>/ffmpeg-libs``). Missing is a failure, never a skip."""
    libs = python.parent.parent / "ffmpeg-libs"
    if not (libs / "libavcodec.so.61").exists():
        pytest.fail(f"{libs} holds no FFmpeg 7 libraries for torchcodec: run `make install` (its "
                    f"{libs.parent.name}/.eval step links the av wheel's bundled FFmpeg there)")
    return libs


def lerobot_env(python: Path) -> dict[str, str]:
    """The environment LeRobot's processes run in: offline, one thread, torchcodec's FFmpeg on the loader path."""
    loader = ":".join(p for p in (str(ffmpeg_libs(python)), os.environ.get("LD_LIBRARY_PATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "LD_LIBRARY_PATH": loader}


def run_lerobot(version: str, *args) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if args[0] == "decode":
        env = lerobot_env(lerobot_python(version))
    done = subprocess.run([str(lerobot_python(version)), str(HELPER), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
