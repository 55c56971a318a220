"""Per-dimension statistics of raw actions, in cosmos-framework's normalizer-stats JSON format.

cosmos-framework (`cosmos_framework/data/generator/action/normalizer_stats/*.json`, read by
`action_normalization.load_action_stats`) stores one list per statistic, one value per action
dimension: `{"q01": [...], "q99": [...]}` for most embodiments, optionally `mean`, `std`, `min`,
`max`; some files nest the lists under `"global"` / `"global_raw"` next to a `"metadata"` object
(the LIBERO file). worldstep reads both layouts and writes the flat one with every statistic plus a
`"metadata"` object, which both of cosmos-framework's loaders accept (they ignore unknown keys).

Quantiles are `numpy.quantile` with linear interpolation over every action row; `std` is the
population standard deviation (ddof 0).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

STAT_KEYS = ("q01", "q99", "mean", "std", "min", "max")


@dataclass(frozen=True)
class ActionStats:
    """Per-dimension statistics, each a float32 `[D]` array or None when the source lacks it."""

    q01: np.ndarray | None = None
    q99: np.ndarray | None = None
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    min: np.ndarray | None = None
    max: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        width = None
        for key in STAT_KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            array = np.asarray(value, dtype=np.float64)
            if array.ndim != 1 or array.size == 0:
                raise ValueError(f"stats {key} has shape {array.shape}; allowed: one value per action dimension")
            if not np.all(np.isfinite(array)):
                raise ValueError(f"stats {key} contains NaN or inf; allowed: finite values")
            if width is not None and array.size != width:
                raise ValueError(f"stats {key} has {array.size} values but the others have {width}; allowed: "
                                 "one width for every statistic")
            width = array.size
            object.__setattr__(self, key, array.astype(np.float32))
        if width is None:
            raise ValueError(f"stats hold none of {list(STAT_KEYS)}; allowed: at least q01/q99 or mean/std")
        for lo, hi in (("q01", "q99"), ("min", "max")):
            a, b = getattr(self, lo), getattr(self, hi)
            if (a is None) != (b is None):
                raise ValueError(f"stats have {lo if a is not None else hi} without {hi if a is not None else lo}; "
                                 "allowed: both or neither")
            if a is not None and np.any(a > b):
                dims = np.flatnonzero(a > b).tolist()
                raise ValueError(f"stats {lo} > {hi} in dimensions {dims}; allowed: {lo} <= {hi}")
        if self.std is not None and np.any(self.std < 0):
            raise ValueError("stats std is negative; allowed: std >= 0")
        if (self.mean is None) != (self.std is None):
            raise ValueError("stats have one of mean/std without the other; allowed: both or neither")
        if not isinstance(self.metadata, dict):
            raise ValueError(f"stats metadata={self.metadata!r} is invalid; allowed: a dict")

    @property
    def width(self) -> int:
        return next(getattr(self, k).size for k in STAT_KEYS if getattr(self, k) is not None)

    def has(self, *keys: str) -> bool:
        return all(getattr(self, k) is not None for k in keys)

    def select(self, dims: slice | list[int]) -> ActionStats:
        """The statistics of some dimensions (UMI's file is 20-wide; its single arm uses the first 10)."""
        picked = {k: getattr(self, k)[dims] for k in STAT_KEYS if getattr(self, k) is not None}
        return ActionStats(**picked, metadata=dict(self.metadata))

    # --- computing --------------------------------------------------------------------------------

    @classmethod
    def compute(cls, actions: np.ndarray, metadata: Mapping[str, Any] | None = None) -> ActionStats:
        """Statistics of `[N, D]` action rows (or `[..., D]`, flattened to rows)."""
        array = np.asarray(actions)
        if array.dtype.kind not in "fiu" or array.dtype == np.bool_:
            raise ValueError(f"actions dtype {array.dtype} is invalid; allowed: numbers")
        if array.ndim < 2 or array.shape[-1] < 1:
            raise ValueError(f"actions shape {array.shape} is invalid; allowed: [N, D] (or [..., D]) with D >= 1")
        rows = array.reshape(-1, array.shape[-1]).astype(np.float64)
        if rows.shape[0] < 2:
            raise ValueError(f"{rows.shape[0]} action rows are too few for statistics; allowed: >= 2")
        if not np.all(np.isfinite(rows)):
            raise ValueError("actions contain NaN or inf; allowed: finite values")
        q01, q99 = np.quantile(rows, [0.01, 0.99], axis=0)
        meta = {"count": int(rows.shape[0]), "quantiles": "numpy.quantile, linear", "std": "population (ddof 0)",
                **(metadata or {})}
        return cls(q01=q01, q99=q99, mean=rows.mean(0), std=rows.std(0), min=rows.min(0), max=rows.max(0),
                   metadata=meta)

    # --- JSON -------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], key: str | None = None) -> ActionStats:
        """Flat (`{"q01": [...], ...}`) or nested under `key` (`"global"` when present and no key given)."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"stats must be a JSON object, got {type(raw).__name__}")
        metadata = raw.get("metadata", {})
        if key is not None or "global" in raw:
            key = key or "global"
            block = raw.get(key)
            if not isinstance(block, Mapping):
                nested = [k for k, v in raw.items() if isinstance(v, Mapping) and k != "metadata"]
                raise ValueError(f"stats block {key!r} is missing; allowed: one of {nested or ['(flat file)']}")
            raw = block
        stats = {k: raw[k] for k in STAT_KEYS if k in raw}
        return cls(**stats, metadata=dict(metadata) if isinstance(metadata, Mapping) else {})

    @classmethod
    def from_json(cls, path: str | os.PathLike, key: str | None = None) -> ActionStats:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"action stats file {path} does not exist")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON: {err}") from None
        try:
            return cls.from_dict(raw, key)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: [float(x) for x in getattr(self, k)]
                               for k in STAT_KEYS if getattr(self, k) is not None}
        if self.metadata:
            out["metadata"] = self.metadata
        return out

    def to_json(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActionStats):
            return NotImplemented
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if a is None or b is None or not np.array_equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # mutable arrays inside
