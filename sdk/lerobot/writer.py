"""Write episodes as a LeRobot v3.0 dataset, atomically: everything goes into a hidden folder beside the
target, renamed onto it only when the dataset is whole.

The layout is LeRobot's own (``lerobot.datasets.utils``): one data file ``data/chunk-000/file-000.parquet``,
one video per camera ``videos/<key>/chunk-000/file-000.mp4`` holding every episode back to back (each one's
span in ``meta/episodes/chunk-000/file-000.parquet``), ``meta/tasks.parquet``, ``meta/stats.json`` and
``meta/info.json``. Frames are encoded as they arrive (AV1 through SVT-AV1, LeRobot's default, or H.264),
so the writer holds no episode's frames after ``add_episode`` returns. Each episode's ``success`` (None:
unknown) is a column of the episode index. An interrupted run (an exception inside ``with``, a killed
process) leaves no folder at the target: at most the hidden one, whose name says it is incomplete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Literal

import numpy as np

CODECS = {"av1": "libsvtav1", "h264": "libx264"}
CHUNK_FILE = "chunk-000/file-000"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
CRF = 30  # LeRobot's default quality
GOP = 2  # LeRobot's default key-frame interval: any frame is at most one frame from a key frame


class _Video:
    """One camera's mp4, open for the whole dataset; frames get consecutive timestamps at ``fps``."""

    def __init__(self, path: Path, codec: str, fps: int, height: int, width: int, crf: int, pix_fmt: str) -> None:
        import av

        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), mode="w")
        options = {"crf": str(crf), "g": str(GOP)}
        if codec == "av1":
            options["preset"] = "12"
            # SVT-AV1 prints ~25 banner and preset lines per encoder unless told otherwise (read at each encoder's
            # start): errors only, so --quiet is quiet; a user's own SVT_LOG wins
            os.environ.setdefault("SVT_LOG", "1")
        self.stream = self.container.add_stream(CODECS[codec], rate=fps, options=options)
        self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, pix_fmt
        self.stream.time_base = Fraction(1, fps)
        self.frames = 0

    def add(self, frames: np.ndarray) -> None:
        import av

        for f in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
            frame.pts = self.frames
            self.frames += 1
            for packet in self.stream.encode(frame):
                self.container.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()


class DatasetWriter:
    """Episodes in, a LeRobot v3.0 dataset at ``root`` out (on ``close``, or leaving a ``with`` block).

    Args:
        root: the dataset folder to create; it must not exist yet.
        fps: frames per second of every camera.
        cameras: camera key -> (height, width) of its frames (even sizes: the videos are 4:2:0).
        action_width, state_width: numbers per action and state row (state_width None: no state feature).
        codec: ``av1`` (LeRobot's default) or ``h264``.
        robot_type: recorded in ``info.json``.
        crf: the encoder's constant rate factor (lower: closer to the frames, larger files; LeRobot's is 30).
        pix_fmt: ``yuv420p`` (LeRobot's: colour at half resolution) or ``yuv444p`` (full-resolution colour; with
            ``crf=0`` and H.264 the frames come back within rounding of the colour conversion).
    """

    def __init__(self, root: str | os.PathLike, *, fps: int, cameras: Mapping[str, tuple[int, int]],
                 action_width: int, state_width: int | None = None, codec: Literal["av1", "h264"] = "av1",
                 robot_type: str | None = None, crf: int = CRF,
                 pix_fmt: Literal["yuv420p", "yuv444p"] = "yuv420p") -> None:
        self.root = Path(root)
        if self.root.exists():
            raise ValueError(f"root={str(self.root)!r} is invalid: it exists; allowed: a path that does not exist yet")
        if not isinstance(fps, int) or isinstance(fps, bool) or fps < 1:
            raise ValueError(f"fps={fps!r} is invalid; allowed: a positive integer")
        if codec not in CODECS:
            raise ValueError(f"codec={codec!r} is invalid; allowed: {sorted(CODECS)}")
        if not isinstance(crf, int) or isinstance(crf, bool) or not 0 <= crf <= 51:
            raise ValueError(f"crf={crf!r} is invalid; allowed: an integer 0 .. 51")
        if pix_fmt not in ("yuv420p", "yuv444p"):
            raise ValueError(f"pix_fmt={pix_fmt!r} is invalid; allowed: 'yuv420p' or 'yuv444p'")
        if not isinstance(cameras, Mapping) or not cameras:
            raise ValueError(f"cameras={cameras!r} is invalid; allowed: a non-empty dict key -> (height, width)")
        for key, size in cameras.items():
            if (not isinstance(size, (tuple, list)) or len(size) != 2
                    or any(not isinstance(n, int) or n < 2 or n % 2 for n in size)):
                raise ValueError(f"cameras[{key!r}]={size!r} is invalid; allowed: (height, width), even and >= 2")
        for name, width in (("action_width", action_width), ("state_width", state_width)):
            if width is not None and (not isinstance(width, int) or isinstance(width, bool) or width < 1):
                raise ValueError(f"{name}={width!r} is invalid; allowed: a positive integer")
        self.fps, self.codec, self.robot_type = fps, codec, robot_type
        self.cameras = {k: (int(h), int(w)) for k, (h, w) in cameras.items()}
        self.action_width, self.state_width = action_width, state_width
        self.tmp = self.root.parent / f".{self.root.name}.incomplete-{os.getpid()}"
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.videos = {k: _Video(self.tmp / VIDEO_PATH.format(video_key=k, chunk_index=0, file_index=0), codec, fps,
                                 h, w, crf, pix_fmt) for k, (h, w) in self.cameras.items()}
        self.pix_fmt = pix_fmt
        self.rows: dict[str, list] = {k: [] for k in ("action", "observation.state", "timestamp", "frame_index",
                                                      "episode_index", "index", "task_index")}
        self.episodes: list[dict] = []
        self.task_ids: dict[str, int] = {}
        self.closed = False

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def add_episode(self, *, frames: Mapping[str, np.ndarray], actions: np.ndarray, task: str,
                    state: np.ndarray | None = None, success: bool | None = None) -> int:
        """Append one episode (``frames`` camera -> ``[T, h, w, 3]`` uint8, ``actions`` ``[T, A]``, ``state``
        ``[T, S]``); returns its index. Checked whole before anything is written."""
        if self.closed:
            raise ValueError("this DatasetWriter is closed; allowed: add_episode before close")
        actions = np.asarray(actions, dtype=np.float32)
        length = len(actions)
        self._check(frames, actions, state, task, success)
        index = len(self.episodes)
        start = len(self.rows["index"])
        spans = {}
        for key, video in self.videos.items():
            spans[key] = video.frames / self.fps
            video.add(np.asarray(frames[key]))
        task_index = self.task_ids.setdefault(task, len(self.task_ids))
        self.rows["action"] += list(actions)
        if self.state_width is not None:
            self.rows["observation.state"] += list(np.asarray(state, dtype=np.float32))
        self.rows["timestamp"] += [t / self.fps for t in range(length)]
        self.rows["frame_index"] += list(range(length))
        self.rows["episode_index"] += [index] * length
        self.rows["index"] += list(range(start, start + length))
        self.rows["task_index"] += [task_index] * length
        row = {"episode_index": index, "tasks": [task], "length": length, "data/chunk_index": 0,
               "data/file_index": 0, "dataset_from_index": start, "dataset_to_index": start + length}
        for key, from_s in spans.items():
            row.update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0,
                        f"videos/{key}/from_timestamp": from_s,
                        f"videos/{key}/to_timestamp": from_s + length / self.fps})
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, "success": success})
        self.episodes.append(row)
        return index

    def _check(self, frames, actions, state, task, success) -> None:
        length = len(actions)
        if actions.ndim != 2 or actions.shape[1] != self.action_width or length < 1:
            raise ValueError(f"actions.shape={actions.shape} is invalid; allowed: (T >= 1, {self.action_width})")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task={task!r} is invalid; allowed: a non-empty string")
        if success is not None and not isinstance(success, (bool, np.bool_)):
            raise ValueError(f"success={success!r} is invalid; allowed: True, False or None")
        if self.state_width is None and state is not None:
            raise ValueError("state is invalid: this writer has no state feature (state_width=None)")
        if self.state_width is not None and (state is None or np.shape(state) != (length, self.state_width)):
            raise ValueError(f"state of shape {np.shape(state) if state is not None else None} is invalid; allowed: "
                             f"({length}, {self.state_width})")
        if not isinstance(frames, Mapping) or set(frames) != set(self.cameras):
            raise ValueError(f"frames keys {sorted(frames) if isinstance(frames, Mapping) else frames!r} are "
                             f"invalid; allowed: exactly {sorted(self.cameras)}")
        for key, (h, w) in self.cameras.items():
            view = frames[key]
            if not isinstance(view, np.ndarray) or view.dtype != np.uint8 or view.shape != (length, h, w, 3):
                got = view.shape if isinstance(view, np.ndarray) else type(view).__name__
                raise ValueError(f"frames[{key!r}] of {got} is invalid; allowed: uint8 ({length}, {h}, {w}, 3)")

    def abort(self) -> None:
        """Drop everything written so far (no folder is left at ``root``)."""
        if self.closed:
            return
        self.closed = True
        for video in self.videos.values():
            with contextlib.suppress(Exception):  # the folder goes anyway
                video.container.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def close(self) -> Path:
        """Finish the videos, write the tables and ``meta/``, and move the dataset to ``root``."""
        if self.closed:
            raise ValueError("this DatasetWriter is closed already")
        if not self.episodes:
            self.abort()
            raise ValueError("no episode was added; allowed: close after at least one add_episode")
        try:
            for video in self.videos.values():
                video.close()
            self._write_tables()
            (self.tmp / "meta" / "info.json").write_text(json.dumps(self._info(), indent=4))
            self.tmp.rename(self.root)
        except BaseException:
            self.abort()
            raise
        self.closed = True
        return self.root

    def _write_tables(self) -> None:
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = {"action": pa.array(np.stack(self.rows["action"]).tolist(), pa.list_(pa.float32(), self.action_width))}
        if self.state_width is not None:
            data["observation.state"] = pa.array(np.stack(self.rows["observation.state"]).tolist(),
                                                 pa.list_(pa.float32(), self.state_width))
        data["timestamp"] = pa.array(self.rows["timestamp"], pa.float32())
        for key in ("frame_index", "episode_index", "index", "task_index"):
            data[key] = pa.array(self.rows[key], pa.int64())
        path = self.tmp / DATA_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(data), path)
        episodes = self.tmp / "meta" / "episodes" / f"{CHUNK_FILE}.parquet"
        episodes.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.episodes), episodes)
        tasks = pd.DataFrame({"task_index": list(self.task_ids.values())}, index=list(self.task_ids))
        tasks.to_parquet(self.tmp / "meta" / "tasks.parquet")
        stats = {key: _stats(np.stack(self.rows[key])) for key in ("action", "observation.state")
                 if self.rows[key]}
        (self.tmp / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))

    def _info(self) -> dict:
        features: dict = {"action": {"dtype": "float32", "shape": [self.action_width], "names": None}}
        if self.state_width is not None:
            features["observation.state"] = {"dtype": "float32", "shape": [self.state_width], "names": None}
        for key, (h, w) in self.cameras.items():
            features[key] = {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                             "info": {"video.height": h, "video.width": w, "video.codec": self.codec,
                                      "video.pix_fmt": self.pix_fmt, "video.is_depth_map": False,
                                      "video.fps": self.fps, "video.channels": 3, "has_audio": False}}
        features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
        for key in ("frame_index", "episode_index", "index", "task_index"):
            features[key] = {"dtype": "int64", "shape": [1], "names": None}
        return {"codebase_version": "v3.0", "robot_type": self.robot_type, "total_episodes": len(self.episodes),
                "total_frames": len(self.rows["index"]), "total_tasks": len(self.task_ids), "chunks_size": 1000,
                "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": self.fps,
                "splits": {"train": f"0:{len(self.episodes)}"}, "data_path": DATA_PATH, "video_path": VIDEO_PATH,
                "features": features}


def _stats(rows: np.ndarray) -> dict[str, list[float] | list[int]]:
    rows = rows.astype(np.float64)
    out = {"min": rows.min(0), "max": rows.max(0), "mean": rows.mean(0), "std": rows.std(0)}
    out.update({f"q{q:02d}": np.quantile(rows, q / 100, axis=0) for q in (1, 10, 50, 90, 99)})
    return {**{k: v.tolist() for k, v in out.items()}, "count": [len(rows)]}
