"""Start states from data: an env reset to a recorded episode's frame ``t``, with its task as the prompt and its
recorded robot state as the starting state, and reproducible draws of (episode, frame) pairs.

``start_options`` turns one pair into ``env.reset`` options: ``image`` (one camera's frame, or for a
multi-camera env a dict camera -> view, camera ``c`` read from ``observation.images.c``), ``prompt`` and,
with ``state=True``, ``state`` (``RobotStateObservation``'s starting state). Views of any size are
cover-cropped into the model's frame (or their camera's slot) by the env, as every first frame is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import StrictBool
from worldstep.engine.settings import NonNegativeInt, StrictModel

from .format import DatasetError
from .reader import RobotDataset


@dataclass(frozen=True)
class StartState:
    """Frame ``frame`` of the episode at position ``episode`` of a dataset."""

    episode: int
    frame: int


def draw_start_states(dataset: RobotDataset, count: int, seed: int, *, room: int = 0) -> list[StartState]:
    """``count`` (episode, frame) pairs drawn from ``seed``: an episode uniformly, then a frame uniformly among those
    with at least ``room`` recorded frames after it. The same seed gives the same pairs."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"count={count!r} is invalid; allowed: a positive integer")
    if not isinstance(room, int) or room < 0:
        raise ValueError(f"room={room!r} is invalid; allowed: an integer >= 0")
    eligible = [i for i, s in enumerate(dataset.spans) if s.length > room]
    if not eligible:
        raise DatasetError(f"no episode of {dataset.root} has more than room={room} frames")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        episode = eligible[int(rng.integers(len(eligible)))]
        out.append(StartState(episode, int(rng.integers(dataset.spans[episode].length - room))))
    return out


def start_options(dataset: RobotDataset, start: StartState, *, cameras: Sequence[str] | None = None,
                  camera: str | None = None, state: bool = False) -> dict[str, Any]:
    """``env.reset`` options starting from ``start``: the frame of ``camera`` (default: the dataset's first), or
    with ``cameras`` (the env's camera names) a dict camera -> view; the episode's task; with ``state`` its
    recorded state row."""
    span = dataset.span(start.episode)
    if not isinstance(start.frame, int) or not 0 <= start.frame < span.length:
        raise ValueError(f"frame={start.frame!r} is invalid for episode {start.episode}; allowed: 0 .. "
                         f"{span.length - 1}")
    if cameras is not None:
        keys = {name: f"observation.images.{name}" for name in cameras}
        missing = [k for k in keys.values() if k not in dataset.camera_keys]
        if missing:
            raise DatasetError(f"cameras {list(cameras)} need video features {missing}; the dataset has "
                               f"{list(dataset.camera_keys)}")
        image: Any = {name: dataset.frames(start.episode, key)[start.frame] for name, key in keys.items()}
    else:
        key = camera or (dataset.camera_keys[0] if dataset.camera_keys else None)
        if key not in dataset.camera_keys:
            raise DatasetError(f"camera {key!r} is not a video feature of {dataset.root}; allowed: "
                               f"{list(dataset.camera_keys)}")
        image = dataset.frames(start.episode, key)[start.frame]
    options: dict[str, Any] = {"image": np.ascontiguousarray(image) if not isinstance(image, dict) else image,
                               "prompt": span.task or None}
    if state:
        if dataset.state_key is None:
            raise DatasetError(f"state=True is invalid: {dataset.root} has no state feature")
        options["state"] = dataset.rows(start.episode)[1][start.frame]
    return {k: v for k, v in options.items() if v is not None}


class DatasetStart(StrictModel):
    """An evaluation episode's recorded start (``EpisodeConfig.start``): frame ``frame`` of episode ``episode`` of
    the LeRobot dataset at ``dataset``; ``camera`` or ``cameras`` and ``state`` as ``start_options`` takes them."""

    dataset: str
    episode: NonNegativeInt
    frame: NonNegativeInt = 0
    camera: str | None = None
    cameras: list[str] | None = None
    state: StrictBool = False

    def options(self) -> dict[str, Any]:
        """The reset options (the dataset is opened, and the episode's frames decoded, here)."""
        return start_options(RobotDataset(self.dataset), StartState(self.episode, self.frame), cameras=self.cameras,
                             camera=self.camera, state=self.state)


def dataset_episodes(root: str, *, starts: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """An evaluation's episode list from a dataset: frame 0 of every episode, or ``starts`` pairs drawn from
    ``seed`` (``draw_start_states``)."""
    source = RobotDataset(root)
    pairs = ([StartState(i, 0) for i in range(source.num_episodes)] if starts is None
             else draw_start_states(source, starts, seed))
    return [{"start": {"dataset": str(source.root), "episode": p.episode, "frame": p.frame}} for p in pairs]
