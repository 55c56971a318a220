"""Does a dataset fit the embodiment a model runs? Every mismatch, named, before any model work starts."""

from __future__ import annotations

from collections.abc import Sequence

from .format import DatasetError
from .reader import RobotDataset


def check_fits(dataset: RobotDataset, *, fps: float, action_width: int, chunk: int,
               cameras: Sequence[str] = (), episodes: Sequence[int] | None = None) -> None:
    """A DatasetError listing each way ``dataset`` does not fit: its fps, its action width, a camera key it lacks,
    an episode (of ``episodes``, default all) shorter than one window (the first frame and ``chunk`` more)."""
    problems = []
    if abs(dataset.fps - fps) > 1e-6:
        problems.append(f"fps: the dataset records {dataset.fps:g} frames per second; the embodiment runs at {fps:g}")
    if dataset.action_width != action_width:
        problems.append(f"action width: the dataset's {dataset.action_key!r} rows have {dataset.action_width} "
                        f"numbers; the embodiment takes {action_width}")
    for key in cameras:
        if key not in dataset.camera_keys:
            problems.append(f"camera key: {key!r} is not a video feature of the dataset; it has "
                            f"{list(dataset.camera_keys)}")
    spans = dataset.spans if episodes is None else [dataset.span(i) for i in episodes]
    short = [(s.index, s.length) for s in spans if s.length < chunk + 1]
    if short:
        listed = ", ".join(f"{i} ({n} frames)" for i, n in short[:10]) + (" ..." if len(short) > 10 else "")
        problems.append(f"episode length: {len(short)} episode(s) are shorter than one window ({chunk + 1} frames: "
                        f"the first and {chunk} more): {listed}")
    if problems:
        raise DatasetError(f"dataset {dataset.root} does not fit the embodiment:\n- " + "\n- ".join(problems))
