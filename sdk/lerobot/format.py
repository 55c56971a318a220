"""What a LeRobot dataset folder says about itself: ``meta/info.json`` and the episode index.

LeRobot keeps a dataset as parquet for the numbers, one mp4 per camera (AV1 by default, also H.264) and
``meta/`` for fps, features, tasks and episode spans. Two layouts are in use:

- ``v3.0`` packs many episodes per file: ``meta/episodes/chunk-*/file-*.parquet`` gives each episode its
  rows ``dataset_from_index .. dataset_to_index`` of a data file and its span
  ``videos/<key>/from_timestamp .. to_timestamp`` of each camera's video file; tasks are
  ``meta/tasks.parquet`` (the task string is the index, ``task_index`` the column).
- ``v2.1`` keeps one data file and one video per camera per episode, named by the ``data_path`` and
  ``video_path`` templates of ``info.json`` (``episode_chunk = episode_index // chunks_size``); episodes and
  tasks are ``meta/episodes.jsonl`` and ``meta/tasks.jsonl``.

Everything here is metadata: no frame is decoded and no data row is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_VERSIONS = ("v2.1", "v3.0")
INFO_PATH = Path("meta") / "info.json"
DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")


class DatasetError(ValueError):
    """A LeRobot dataset that cannot be read as one: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Feature:
    """One entry of ``info.json``'s ``features``: ``dtype`` (``video``, ``float32``, ...), ``shape``, ``names``."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    names: Any = None

    @property
    def width(self) -> int:
        """Numbers per row of a vector feature (1 for a scalar)."""
        width = 1
        for n in self.shape:
            width *= int(n)
        return width


@dataclass(frozen=True)
class DatasetInfo:
    """``meta/info.json`` of the dataset at ``root``, checked."""

    root: Path
    version: str
    fps: float
    features: dict[str, Feature]
    data_path: str
    video_path: str | None
    chunks_size: int
    total_episodes: int
    robot_type: str | None = None

    @property
    def camera_keys(self) -> tuple[str, ...]:
        """The video features, in ``info.json`` order (e.g. ``observation.images.wrist``)."""
        return tuple(k for k, f in self.features.items() if f.dtype == "video")

    def feature(self, key: str, argument: str) -> Feature:
        """The feature ``key``; a DatasetError naming ``argument`` and the features there are, when absent."""
        if key not in self.features:
            names = [k for k in self.features if k not in DEFAULT_FEATURES]
            raise DatasetError(f"{argument}={key!r} is not a feature of {self.root / INFO_PATH}; allowed: {names}")
        return self.features[key]


def read_info(root: Path) -> DatasetInfo:
    """The checked ``meta/info.json`` of ``root``: FileNotFoundError when it is missing, DatasetError when
    its version is not one of ``SUPPORTED_VERSIONS`` or a required key is missing."""
    path = root / INFO_PATH
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {root} is not a LeRobot dataset (it keeps fps, features "
                                "and paths in meta/info.json)")
    try:
        info = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON: {e}") from None
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise DatasetError(f"{path}: codebase_version={version!r} is not supported; allowed: "
                           f"{list(SUPPORTED_VERSIONS)}")
    missing = [k for k in ("fps", "features", "data_path") if k not in info]
    if missing:
        raise DatasetError(f"{path} lacks {missing}; a {version} info.json has fps, features and data_path")
    features = {k: Feature(k, str(v["dtype"]), tuple(v.get("shape") or ()), v.get("names"))
                for k, v in info["features"].items()}
    return DatasetInfo(root=root, version=version, fps=float(info["fps"]), features=features,
                       data_path=info["data_path"], video_path=info.get("video_path"),
                       chunks_size=int(info.get("chunks_size", 1000)),
                       total_episodes=int(info.get("total_episodes", 0)),
                       robot_type=info.get("robot_type"))


@dataclass(frozen=True)
class VideoSpan:
    """Where one episode's frames of one camera lie: a file and the time span inside it (seconds)."""

    path: Path
    from_s: float
    to_s: float | None


@dataclass(frozen=True)
class EpisodeSpan:
    """One episode's entry of the index: its ``length`` in frames, its tasks, the data file holding its rows
    (``rows``: its slice of that file's rows; None: the whole file is this episode) and one VideoSpan per camera."""

    index: int
    length: int
    tasks: tuple[str, ...]
    data_file: Path
    rows: tuple[int, int] | None
    videos: dict[str, VideoSpan]

    @property
    def task(self) -> str:
        """The episode's first task: the prompt a replay starts from ("" when it has none)."""
        return self.tasks[0] if self.tasks else ""


def read_episodes(info: DatasetInfo) -> list[EpisodeSpan]:
    """Every episode of the dataset in index order."""
    spans = _episodes_v30(info) if info.version == "v3.0" else _episodes_v21(info)
    return sorted(spans, key=lambda s: s.index)


def _episodes_v30(info: DatasetInfo) -> list[EpisodeSpan]:
    import pyarrow.parquet as pq

    files = sorted((info.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"{info.root / 'meta' / 'episodes'} holds no chunk-*/file-*.parquet: a v3.0 dataset "
                           "indexes its episodes there")
    spans = []
    for file in files:
        wanted = [c for c in pq.read_schema(file).names if not c.startswith("stats/")]
        for row in pq.read_table(file, columns=wanted).to_pylist():
            data = info.root / info.data_path.format(chunk_index=row["data/chunk_index"],
                                                     file_index=row["data/file_index"])
            videos = {}
            for key in info.camera_keys:
                video = info.root / info.video_path.format(video_key=key, chunk_index=row[f"videos/{key}/chunk_index"],
                                                           file_index=row[f"videos/{key}/file_index"])
                videos[key] = VideoSpan(video, float(row[f"videos/{key}/from_timestamp"]),
                                        float(row[f"videos/{key}/to_timestamp"]))
            spans.append(EpisodeSpan(int(row["episode_index"]), int(row["length"]), tuple(row.get("tasks") or ()),
                                     data, (int(row["dataset_from_index"]), int(row["dataset_to_index"])), videos))
    return spans


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DatasetError(f"{path} does not exist: a v2.1 dataset lists its episodes and tasks in meta/*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _episodes_v21(info: DatasetInfo) -> list[EpisodeSpan]:
    spans = []
    for row in _jsonl(info.root / "meta" / "episodes.jsonl"):
        index = int(row["episode_index"])
        chunk = index // info.chunks_size
        data = info.root / info.data_path.format(episode_chunk=chunk, episode_index=index)
        videos = {key: VideoSpan(info.root / info.video_path.format(episode_chunk=chunk, video_key=key,
                                                                    episode_index=index), 0.0, None)
                  for key in info.camera_keys}
        spans.append(EpisodeSpan(index, int(row["length"]), tuple(row.get("tasks") or ()), data, None, videos))
    return spans


def read_tasks(info: DatasetInfo) -> dict[int, str]:
    """task_index -> task string."""
    if info.version == "v2.1":
        return {int(r["task_index"]): str(r["task"]) for r in _jsonl(info.root / "meta" / "tasks.jsonl")}
    import pyarrow.parquet as pq

    path = info.root / "meta" / "tasks.parquet"
    if not path.is_file():
        raise DatasetError(f"{path} does not exist: a v3.0 dataset keeps its tasks there")
    table = pq.read_table(path).to_pydict()
    names = table.get("task") or table.get("__index_level_0__")
    if names is None:
        raise DatasetError(f"{path} has no task column; allowed: the task strings as its index or a 'task' column")
    return {int(i): str(t) for i, t in zip(table["task_index"], names)}
