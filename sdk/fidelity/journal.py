"""A fidelity run's finished tasks, saved one by one as they finish, so a killed run resumes where it stopped.

A full report is hours of CPU; without this a run wrote its records only at the end and a kill lost them
all. Each task (one policy episode, one planner episode, one group of open-loop clips) is a frozen
dataclass; its result is pickled under a key hashed from the task itself, so `--resume` skips exactly the
tasks already done and, since every task is deterministic on its own, the resumed report equals an
uninterrupted one. `run.json` holds the arguments that decide the results: a resume that changes one is
refused, naming it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

FOLDER = "journal"


class StretchSpent(Exception):
    """The run's wall-time budget (`--stop-after-minutes`) ran out: what finished is in the journal."""


def task_key(task: Any) -> str:
    """A name for `task` that depends only on what it computes (its class and fields)."""
    return hashlib.sha256(pickle.dumps((type(task).__qualname__, task), protocol=4)).hexdigest()[:24]


class Journal:
    """Results of finished tasks under `out/journal/` (one pickle each, written atomically)."""

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
            for f in self.folder.glob("*.pkl"):  # a fresh run never reuses an old run's results
                f.unlink()
        self.folder.mkdir(parents=True, exist_ok=True)
        saved_path.write_text(json.dumps(settings, indent=1))

    def _path(self, task: Any) -> Path:
        return self.folder / f"{task_key(task)}.pkl"

    def has(self, task: Any) -> bool:
        return self._path(task).exists()

    def get(self, task: Any) -> Any:
        return pickle.loads(self._path(task).read_bytes())

    def put(self, task: Any, result: Any) -> None:
        path = self._path(task)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(result, protocol=4))
        tmp.replace(path)  # a kill mid-write leaves no half result behind
