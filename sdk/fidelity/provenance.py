"""Where a report's figures come from: the commit, the code and the weights that made them, and the command.

A report states figures that a reader must be able to reproduce, and a sealed range can be read only once,
so the report records exactly which code and checkpoint produced it: the git commit and whether the tree
had uncommitted changes, a SHA-256 over the files of the code that decides the figures (`sdk/fidelity`,
`sdk/planning.py`, `sdk/train`, `sdk/trust`) and over the checkpoint folder, the seed range and the command line.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from worldstep.envs.push_seeds import split_range

SDK = Path(__file__).resolve().parents[1]  # the `worldstep` package folder (sdk/ in the repository)
CODE = ("fidelity", "planning.py", "train", "trust")


def tree_sha256(paths: list[Path], root: Path) -> str:
    """SHA-256 over the relative names and bytes of every file under `paths` (sorted; caches skipped)."""
    digest = hashlib.sha256()
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*"))
                   if f.is_file() and "__pycache__" not in f.parts)
    for f in files:
        digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def _git(*argv: str) -> str | None:
    try:
        done = subprocess.run(["git", *argv], cwd=SDK, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_state() -> dict[str, Any]:
    """The commit and the hash of the code that decides the figures: what a resumed stretch must still run."""
    return {"git_commit": _git("rev-parse", "HEAD"), "code_sha256": tree_sha256([SDK / c for c in CODE], SDK)}


def provenance(checkpoint: Path, split: str, argv: list[str] | None) -> dict[str, Any]:
    """The record `report.json` keeps under `provenance`."""
    seeds = split_range(split)
    status = _git("status", "--porcelain")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "code_sha256": tree_sha256([SDK / c for c in CODE], SDK),
        "code": [f"sdk/{c}" for c in CODE],
        "checkpoint_sha256": tree_sha256([Path(checkpoint)], Path(checkpoint)),
        "seed_range": {"name": seeds.name, "start": seeds.start, "size": seeds.size},
        "command": shlex.join(["python", "-m", "worldstep.fidelity", *(sys.argv[1:] if argv is None else argv)]),
    }
