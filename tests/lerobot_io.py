"""Run in the lerobot venv (not worldstep's): write a dataset with LeRobot's own writer, or read one with its reader.

    python lerobot_io.py write ROOT CODEC SPEC.npz      # frames/actions/state per episode from SPEC.npz
    python lerobot_io.py read ROOT OUT.npz              # what LeRobotDataset returns, for worldstep to compare

PyPI's torchvision wheels are CUDA builds whose compiled ops cannot load over the CPU torch; torchvision's
import registers fake kernels for two of those ops (nms, qnms) unconditionally, so their schemas are
declared here first. No torchvision op runs: LeRobot's dataset code imports torchvision for image
transforms and its (removed) video backend, and decodes here through torchcodec when present, else PyAV.
"""

from __future__ import annotations

import json
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
    ds = LeRobotDataset.create("local/test", fps, root=root, features=features, use_videos=True, vcodec=codec,
                               image_writer_threads=0)
    for e, task in enumerate(tasks):
        for t in range(len(data[f"actions_{e}"])):
            frame = {"action": data[f"actions_{e}"][t], "observation.state": data[f"state_{e}"][t], "task": task}
            for c, key in enumerate(cameras):
                frame[key] = data[f"frames_{e}_{c}"][t]
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()


def read(root: Path, out: Path) -> None:
    ds = LeRobotDataset("local/test", root=root, video_backend="pyav")
    arrays = {"fps": np.array(ds.fps), "num_episodes": np.array(ds.num_episodes),
              "camera_keys": np.array(json.dumps(list(ds.meta.video_keys)))}
    hf = ds.hf_dataset.with_format("numpy")
    arrays["episode_index"] = np.asarray(hf["episode_index"])
    arrays["action"] = np.stack(hf["action"])
    arrays["observation.state"] = np.stack(hf["observation.state"])
    arrays["tasks"] = np.array(json.dumps([ds.meta.episodes[e]["tasks"] for e in range(ds.num_episodes)]))
    arrays["success"] = np.array(json.dumps([ds.meta.episodes[e].get("success") for e in range(ds.num_episodes)]))
    np.savez(out, **arrays)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    else:
        read(Path(sys.argv[2]), Path(sys.argv[3]))
