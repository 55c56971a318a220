"""Read a LeRobot dataset (v3.0 or v2.1) from disk: its index at open, one episode's rows and frames on demand.

``RobotDataset(root)`` reads ``meta/`` only. ``episode(i)`` reads episode ``i``'s action and state rows from
its parquet file (pyarrow, filtered on ``episode_index``) and decodes its frames per camera (PyAV), so a
loop over episodes that lets each one go holds one episode's frames at a time. Nothing is downloaded: a
hub id resolves only to a copy already on disk (``$HF_LEROBOT_HOME/<id>``, or the newest snapshot in the
hub cache).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .format import DatasetError, DatasetInfo, EpisodeSpan, read_episodes, read_info, read_tasks
from .video import decode_span

STATE_KEY = "observation.state"


@dataclass(frozen=True)
class Episode:
    """One recorded episode: ``actions`` ``[T, A]`` and ``state`` ``[T, S]`` (None: the dataset has no state)
    float32, ``frames`` camera key -> ``[T, H, W, 3]`` uint8 (the cameras asked for), ``timestamps`` ``[T]``."""

    index: int
    task: str
    fps: float
    actions: np.ndarray
    state: np.ndarray | None
    frames: dict[str, np.ndarray]
    timestamps: np.ndarray

    @property
    def length(self) -> int:
        return len(self.actions)


def resolve_root(root_or_id: str | os.PathLike) -> Path:
    """A dataset folder from a path, or from a hub id (``owner/name``) already on disk; FileNotFoundError
    naming every place looked in otherwise (nothing is downloaded)."""
    path = Path(root_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(root_or_id)
    places = [path]
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
        lerobot_home = Path(os.environ.get("HF_LEROBOT_HOME", home / "lerobot")).expanduser()
        hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub")).expanduser()
        snapshots = hub / f"datasets--{text.replace('/', '--')}" / "snapshots"
        places += [lerobot_home / text, snapshots]
        if (lerobot_home / text).is_dir():
            return lerobot_home / text
        found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
        if found:
            return found[-1]
    raise FileNotFoundError(f"dataset={text!r} is not on disk (looked in {[str(p) for p in places]}); worldstep "
                            "reads local copies only: download it first, e.g. with huggingface-cli")


class RobotDataset:
    """A LeRobot dataset on disk.

    Args:
        root: the dataset folder, or a hub id whose copy is on disk.
        action_key: the action feature (``action``).
        state_key: the robot-state feature (default ``observation.state`` when the dataset has one, else none).
        cameras: the video features ``episode`` decodes (default: all of them).
    """

    def __init__(self, root: str | os.PathLike, *, action_key: str = "action", state_key: str | None = None,
                 cameras: Sequence[str] | None = None) -> None:
        self.root = resolve_root(root)
        self.info: DatasetInfo = read_info(self.root)
        self.action_key = action_key
        self.info.feature(action_key, "action_key")
        if state_key is None:
            state_key = STATE_KEY if STATE_KEY in self.info.features else None
        else:
            self.info.feature(state_key, "state_key")
        self.state_key = state_key
        if isinstance(cameras, str):
            raise ValueError(f"cameras={cameras!r} is invalid; allowed: a sequence of camera keys, e.g. [{cameras!r}]")
        self.cameras: tuple[str, ...] = self.info.camera_keys if cameras is None else tuple(cameras)
        for key in self.cameras:
            if key not in self.info.camera_keys:
                raise DatasetError(f"camera {key!r} is not a video feature of {self.root}; allowed: "
                                   f"{list(self.info.camera_keys)}")
        self.spans: list[EpisodeSpan] = read_episodes(self.info)
        self.tasks: dict[int, str] = read_tasks(self.info)

    # what the index says
    @property
    def fps(self) -> float:
        return self.info.fps

    @property
    def camera_keys(self) -> tuple[str, ...]:
        return self.info.camera_keys

    @property
    def action_width(self) -> int:
        return self.info.features[self.action_key].width

    @property
    def state_width(self) -> int | None:
        return None if self.state_key is None else self.info.features[self.state_key].width

    @property
    def num_episodes(self) -> int:
        return len(self.spans)

    def span(self, index: int) -> EpisodeSpan:
        """The index entry of the episode at position ``index`` (0 .. num_episodes - 1)."""
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or not 0 <= index < len(self.spans):
            raise ValueError(f"episode={index!r} is invalid; allowed: 0 .. {len(self.spans) - 1}")
        return self.spans[int(index)]

    # one episode
    def rows(self, index: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Episode ``index``'s actions ``[T, A]``, state ``[T, S]`` (or None) and timestamps ``[T]``."""
        import pyarrow.parquet as pq

        span = self.span(index)
        if not span.data_file.is_file():
            raise DatasetError(f"data file {span.data_file} of episode {span.index} does not exist")
        columns = [self.action_key, "timestamp"] + ([self.state_key] if self.state_key else [])
        table = pq.read_table(span.data_file, columns=columns, filters=[("episode_index", "=", span.index)])
        if table.num_rows != span.length:
            raise DatasetError(f"{span.data_file} holds {table.num_rows} rows of episode {span.index}; its index "
                               f"says {span.length}")
        actions = _matrix(table.column(self.action_key), self.action_key, span.data_file)
        state = _matrix(table.column(self.state_key), self.state_key, span.data_file) if self.state_key else None
        return actions, state, table.column("timestamp").to_numpy().astype(np.float64)

    def frames(self, index: int, camera: str) -> np.ndarray:
        """Episode ``index``'s frames of ``camera`` ``[T, H, W, 3]`` uint8."""
        span = self.span(index)
        if camera not in span.videos:
            raise DatasetError(f"camera {camera!r} is not a video feature of {self.root}; allowed: "
                               f"{list(self.info.camera_keys)}")
        video = span.videos[camera]
        return decode_span(video.path, video.from_s, span.length, self.fps)

    def episode(self, index: int) -> Episode:
        """Episode ``index``: its rows and its frames of every camera in ``cameras``."""
        span = self.span(index)
        actions, state, timestamps = self.rows(index)
        frames = {key: self.frames(index, key) for key in self.cameras}
        return Episode(span.index, span.task, self.fps, actions, state, frames, timestamps)

    def iter_episodes(self, indices: Iterable[int] | None = None) -> Iterator[Episode]:
        """Episodes one at a time (the caller holds at most the one it is working on)."""
        for index in range(self.num_episodes) if indices is None else indices:
            yield self.episode(index)


def _matrix(column, key: str, where: Path) -> np.ndarray:
    """A parquet column of fixed-width list rows (or scalars) as ``[T, D]`` float32."""
    import pyarrow as pa

    values = column.combine_chunks()
    if pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type) or pa.types.is_large_list(values.type):
        flat = values.flatten().to_numpy(zero_copy_only=False)
        if len(values) and flat.size % len(values):
            raise DatasetError(f"{where}: column {key!r} has rows of different widths; allowed: one width")
        return flat.reshape(len(values), -1).astype(np.float32)
    return values.to_numpy(zero_copy_only=False).reshape(-1, 1).astype(np.float32)
