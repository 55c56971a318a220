"""Run in the lerobot venv (not worldstep's): write a dataset with LeRobot's own writer, or read one with its reader.

    python lerobot_io.py write ROOT CODEC SPEC.npz   # SPEC.npz's episodes (lerobot 0.4 writes v3.0, 0.3 v2.1)
    python lerobot_io.py read ROOT OUT.npz           # what LeRobotDataset returns, for worldstep to compare
    python lerobot_io.py decode ROOT OUT.npz         # every frame LeRobotDataset decodes with torchcodec

PyPI's torchvision wheels are CUDA builds whose compiled ops cannot load over the CPU torch; torchvision's
import registers fake kernels for two of those ops (nms, qnms) unconditionally, so their schemas are
declared here first. No torchvision op runs: LeRobot's dataset code imports torchvision for image
transforms and its (removed) video backend, and decodes here through torchcodec when present, else PyAV.
``decode`` insists on torchcodec, LeRobot's default backend, which loads FFmpeg's shared libraries from
LD_LIBRARY_PATH (tests/lerobot_data.py puts the venv's ``ffmpeg-libs`` there; the Makefile says why).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

_lib = torch.library.Library("torchvision", "DEF")
for _op in ("nms", "qnms"):
    _lib.define(f"{_op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402


def write(root: Path, codec: str, spec: Path) -> None:
    data = np.load(spec)
    cameras = json.loads(str(data["cameras"]))
    tasks = json.loads(str(data["tasks"]))
    fps = int(data["fps"])
    first = data["frames_0_0"]
    features = {"action": {"dtype": "float32", "shape": (data["actions_0"].shape[1],), "names": None},
                "observation.state": {"dtype": "float32", "shape": (data["state_0"].shape[1],), "names": None}}
    for key in cameras:
        features[key] = {"dtype": "video", "shape": first.shape[1:], "names": ["height", "width", "channels"]}
    vcodec = {"av1": "libsvtav1", "h264": "h264"}[codec]
    if "vcodec" in inspect.signature(LeRobotDataset.create).parameters:  # lerobot >= 0.4
        ds = LeRobotDataset.create("local/test", fps, root=root, features=features, use_videos=True, vcodec=vcodec,
                                   image_writer_threads=0)
    else:  # lerobot 0.3 (format v2.1) encodes with its encode_video_frames' default codec, AV1: pass it the codec
        from lerobot.datasets import lerobot_dataset

        lerobot_dataset.encode_video_frames = functools.partial(lerobot_dataset.encode_video_frames, vcodec=vcodec)
        ds = LeRobotDataset.create("local/test", fps, root=root, features=features, use_videos=True,
                                   image_writer_threads=0)
    for e, task in enumerate(tasks):
        for t in range(len(data[f"actions_{e}"])):
            frame = {"action": data[f"actions_{e}"][t], "observation.state": data[f"state_{e}"][t], "task": task}
            for c, key in enumerate(cameras):
                frame[key] = data[f"frames_{e}_{c}"][t]
            if "task" in inspect.signature(ds.add_frame).parameters:  # lerobot 0.3 takes the task apart
                ds.add_frame({k: v for k, v in frame.items() if k != "task"}, task=task)
            else:
                ds.add_frame(frame)
        ds.save_episode()
    if hasattr(ds, "finalize"):  # lerobot >= 0.4 closes its parquet writers here
        ds.finalize()


def read(root: Path, out: Path) -> None:
    ds = LeRobotDataset("local/test", root=root, video_backend="pyav")
    arrays = {"fps": np.array(ds.fps), "num_episodes": np.array(ds.num_episodes),
              "camera_keys": np.array(json.dumps(list(ds.meta.video_keys)))}
    hf = ds.hf_dataset.with_format("numpy")
    arrays["episode_index"] = np.asarray(hf["episode_index"])
    arrays["action"] = np.stack(hf["action"])
    if "observation.state" in ds.meta.features:
        arrays["observation.state"] = np.stack(hf["observation.state"])
    arrays["tasks"] = np.array(json.dumps([ds.meta.episodes[e]["tasks"] for e in range(ds.num_episodes)]))
    arrays["success"] = np.array(json.dumps([ds.meta.episodes[e].get("success") for e in range(ds.num_episodes)]))
    from lerobot.datasets.video_utils import get_video_info  # LeRobot's own probe of each camera's file

    arrays["codec"] = np.array(json.dumps([get_video_info(ds.root / ds.meta.get_video_file_path(0, key))["video.codec"]
                                           for key in ds.meta.video_keys]))
    np.savez(out, **arrays)


def decode(root: Path, out: Path) -> None:
    try:
        import torchcodec.decoders  # noqa: F401  (LeRobot would fall back to PyAV without saying so)
    except Exception as err:  # torchcodec raises RuntimeError/OSError naming every FFmpeg it tried
        sys.exit(f"torchcodec cannot load FFmpeg's libraries (LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH')!r}): "
                 f"{str(err)[-1500:]}")
    ds = LeRobotDataset("local/test", root=root, video_backend="torchcodec")
    assert ds.video_backend == "torchcodec", ds.video_backend
    rows = [ds[i] for i in range(len(ds))]  # each row's frames, found by timestamp as LeRobot's training does
    arrays = {"episode_index": np.array([int(r["episode_index"]) for r in rows])}
    for key in ds.meta.video_keys:  # float [3, H, W] in [0, 1], decoded uint8 / 255: back to uint8 exactly
        arrays[key] = np.stack([(r[key].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8) for r in rows])
    np.savez(out, **arrays)


if __name__ == "__main__":
    {"write": lambda: write(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])),
     "read": lambda: read(Path(sys.argv[2]), Path(sys.argv[3])),
     "decode": lambda: decode(Path(sys.argv[2]), Path(sys.argv[3]))}[sys.argv[1]]()
