"""Files a run leaves behind, written whole or not at all.

Each output goes to a temporary name in the target's folder and is renamed onto the target when complete
(``os.replace`` is atomic on one filesystem), so an interrupted run never leaves a half-written file, nor
a new file next to a stale one from the previous run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from worldstep.envs.video import partial_path

__all__ = ["check_output_path", "json_safe", "write_json"]


def check_output_path(path: str | os.PathLike, field: str) -> Path:
    """``path`` as a file to write: ValueError naming ``field`` when it is a folder or its parent is a file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{field}={str(path)!r} is invalid: it is a folder; allowed: a file path")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{field}={str(path)!r} is invalid: {str(parent)!r} is a file; allowed: a path in a folder")
    return path


def write_json(path: str | os.PathLike, data: Any, indent: int = 2) -> Path:
    """``data`` as indented strict JSON (NaN and inf become null) at ``path``, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    try:
        partial.write_text(json.dumps(json_safe(data), indent=indent) + "\n")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def json_safe(value: Any) -> Any:
    """``value`` with every NaN and inf replaced by None and numpy scalars by Python's (recursively), so it dumps
    as strict JSON (NaN: undefined, e.g. an object never detected)."""
    if isinstance(value, np.generic):  # np.float32, np.int64, np.bool_: the Python number json writes
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
