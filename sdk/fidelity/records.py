"""Per-unit records of a fidelity run: every figure of `report.json` is a function of them.

A run writes three JSONL files into `records/` beside its report: `openloop.jsonl` (per clip and series,
the per-frame scores), `episodes.jsonl` (per policy episode in each world: seed, policy, the chunks it
chose, both outcomes, why it stopped, per-window detections) and `planning.jsonl` (per planner episode).
`python -m worldstep.fidelity.recompute OUT` rebuilds the report's sections from them alone and checks
them against `report.json`.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..planning import ClosedLoopResult
from .openloop import FrameScores
from .rollouts import EpisodeOutcome

FOLDER = "records"
SCORE_FIELDS = ("psnr", "ssim", "effector_error", "block_error", "moved")


@dataclass
class Records:
    """What a run measured, unit by unit: open-loop scores per series (`[clips, frames]` each) for clips
    `clip_seeds`, policy episodes in both worlds, planner episodes (`worldstep.planning.ClosedLoopResult`)."""

    clip_seeds: list[int] = field(default_factory=list)
    scores: dict[str, FrameScores] = field(default_factory=dict)
    episodes: list[EpisodeOutcome] = field(default_factory=list)
    plans: list[Any] = field(default_factory=list)


def _nan_to_none(values: np.ndarray) -> list:
    return [None if (isinstance(v, float) and not np.isfinite(v)) else v for v in values.tolist()]


def write_records(out: Path, records: Records) -> list[str]:
    """Write the JSONL files (atomically each) and return their paths."""
    folder = out / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[str]] = {"openloop.jsonl": [], "episodes.jsonl": [], "planning.jsonl": []}
    for name, s in records.scores.items():
        for c, seed in enumerate(records.clip_seeds):
            row = {"series": name, "seed": int(seed)}
            row.update({f: _nan_to_none(np.asarray(getattr(s, f)[c])) for f in SCORE_FIELDS})
            lines["openloop.jsonl"].append(json.dumps(row))
    for e in records.episodes:
        world = "simulator" if e.replay_success is None else "model"
        lines["episodes.jsonl"].append(json.dumps({"world": world, **e.to_record()}))
    for p in records.plans:
        row = p.to_record()
        row["actions"] = [np.asarray(a, dtype=np.float32).round(5).tolist() for a in p.actions]
        lines["planning.jsonl"].append(json.dumps(row))
    paths = []
    for name, rows in lines.items():
        tmp, path = folder / f".{name}.tmp", folder / name
        tmp.write_text("".join(r + "\n" for r in rows))
        tmp.replace(path)
        paths.append(str(path))
    return paths


def _read(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file, or of its gzipped copy (`NAME.jsonl.gz`, as committed records are kept)."""
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        with gzip.open(path.with_name(path.name + ".gz"), "rt") as f:
            return [json.loads(line) for line in f if line.strip()]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def read_records(out: Path) -> Records:
    """The records a run wrote into `out/records/`."""
    folder = out / FOLDER
    records = Records()
    rows = _read(folder / "openloop.jsonl")
    for name in dict.fromkeys(r["series"] for r in rows):
        mine = [r for r in rows if r["series"] == name]
        if not records.clip_seeds:
            records.clip_seeds = [r["seed"] for r in mine]
        arrays = {f: np.array([[np.nan if v is None else v for v in r[f]] for r in mine], dtype=float)
                  for f in SCORE_FIELDS}
        arrays["moved"] = arrays["moved"].astype(bool)
        records.scores[name] = FrameScores(**arrays)
    records.episodes = [EpisodeOutcome.from_record(r, i) for i, r in enumerate(_read(folder / "episodes.jsonl"))]
    records.plans = [ClosedLoopResult.from_record(r, i) for i, r in enumerate(_read(folder / "planning.jsonl"))]
    return records
