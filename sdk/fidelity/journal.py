"""A fidelity run's finished tasks, saved one by one as they finish, so a killed run resumes where it stopped.

A full report is hours of CPU; without this a run wrote its records only at the end and a kill lost them
all. Each task (one policy episode, one planner episode, one group of open-loop clips) is a frozen
dataclass; its result is saved as JSON (episodes as their `to_record` rows, arrays in a `.npz` beside it: no
pickle, so a journal loads nothing but data) under a key hashed from the task itself, so `--resume` skips exactly
the tasks already done and, since every task is deterministic on its own, the resumed report equals an
uninterrupted one. `run.json` holds the arguments that decide the results: a resume that changes one is
refused, naming it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from ..planning import ClosedLoopResult
from .rollouts import EpisodeOutcome

FOLDER = "journal"
RECORD_TYPES = {cls.__name__: cls for cls in (EpisodeOutcome, ClosedLoopResult)}  # saved as their to_record rows


class StretchSpent(Exception):
    """The run's wall-time budget (`--stop-after-minutes`) ran out: what finished is in the journal."""


def task_key(task: Any) -> str:
    """A name for `task` that depends only on what it computes (its class and fields)."""
    return hashlib.sha256(pickle.dumps((type(task).__qualname__, task), protocol=4)).hexdigest()[:24]


def _encode(value: Any, arrays: list[np.ndarray]) -> Any:
    """`value` as JSON data: arrays appended to `arrays` (named by index), episodes as their record rows."""
    if isinstance(value, np.ndarray):
        arrays.append(value)
        return {"array": len(arrays) - 1}
    if type(value).__name__ in RECORD_TYPES and isinstance(value, RECORD_TYPES[type(value).__name__]):
        return {"record": type(value).__name__, "row": _encode(value.to_record(), arrays)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {"dict": {k: _encode(v, arrays) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode(v, arrays) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a task result holds a {type(value).__name__}; allowed: arrays, records, JSON data")


def _decode(data: Any, arrays: Any) -> Any:
    if not isinstance(data, dict):
        return data
    if "record" in data:
        return RECORD_TYPES[data["record"]].from_record(_decode(data["row"], arrays))
    (kind, inner), = data.items()
    if kind == "array":
        return arrays[f"a{inner}"]
    if kind == "dict":
        return {k: _decode(v, arrays) for k, v in inner.items()}
    items = [_decode(v, arrays) for v in inner]
    return tuple(items) if kind == "tuple" else items


class Journal:
    """Results of finished tasks under `out/journal/` (one JSON each, its arrays in a `.npz`; written atomically)."""

    def __init__(self, out: Path, settings: dict[str, Any], resume: bool) -> None:
        self.folder = Path(out) / FOLDER
        saved_path = self.folder / "run.json"
        settings = json.loads(json.dumps(settings))  # what JSON keeps, so a reload compares equal
        if resume and saved_path.exists():
            saved = json.loads(saved_path.read_text())
            changed = sorted(k for k in settings.keys() | saved.keys() if settings.get(k) != saved.get(k))
            if changed:
                spelled = ", ".join(f"{k}: {saved.get(k)!r} -> {settings.get(k)!r}" for k in changed)
                raise ValueError(f"--resume with changed arguments ({spelled}); allowed: the interrupted run's own "
                                 "arguments (or a new --out)")
        elif self.folder.exists():
            for pattern in ("*.json", "*.npz", "*.pkl"):  # a fresh run never reuses an old run's results
                for f in self.folder.glob(pattern):
                    if f.name != "run.json":
                        f.unlink()
        self.folder.mkdir(parents=True, exist_ok=True)
        saved_path.write_text(json.dumps(settings, indent=1))

    def _path(self, task: Any) -> Path:
        return self.folder / f"{task_key(task)}.json"

    def has(self, task: Any) -> bool:
        return self._path(task).exists()

    def get(self, task: Any) -> Any:
        return _read(self._path(task))

    @staticmethod
    def results(out: Path) -> list[Any]:
        """Every result a journal under `out` holds, in file order, without knowing the tasks (a study reads a
        stretch cut short)."""
        return [_read(f) for f in sorted((Path(out) / FOLDER).glob("*.json")) if f.name != "run.json"]

    def put(self, task: Any, result: Any) -> None:
        path, arrays = self._path(task), []
        encoded = _encode(result, arrays)
        text = json.dumps({"arrays": len(arrays), "result": encoded})  # NaN and inf kept: they mean things
        if arrays:
            with open(path.with_suffix(".npz.tmp"), "wb") as f:
                np.savez(f, **{f"a{i}": a for i, a in enumerate(arrays)})
            path.with_suffix(".npz.tmp").replace(path.with_suffix(".npz"))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # written last: a kill mid-write leaves no half result behind


def _read(path: Path) -> Any:
    data = json.loads(path.read_text())
    if not data["arrays"]:
        return _decode(data["result"], {})
    with np.load(path.with_suffix(".npz")) as arrays:
        return _decode(data["result"], arrays)
