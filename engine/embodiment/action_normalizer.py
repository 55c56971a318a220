"""Raw actions -> the values an embodiment was trained on: an explicit, optional stage before the model.

The diffusers pipeline never normalises; NVIDIA's training did, per embodiment
(`Embodiment.normalization`): quantile (q01/q99 -> [-1, 1]) for AgiBot, Bridge, UMI, hand pose and
RoboMIND-Franka; raw values for DROID, fractal and RoboMIND-UR. The arithmetic is cosmos-framework's
`normalize_action`: `2 (a - q01) / max(q99 - q01, 1e-8) - 1` and `(a - mean) / max(std, 1e-8)`.

Training did not clip, so neither does this by default: a raw value outside the stats' range
(`[q01, q99]` for quantile, `[min, max]` otherwise, when the stats have them) goes through and raises
an `ActionRangeWarning`. With `clip=True` (quantile only) normalised values are clipped to [-1, 1].
Either way the result carries boolean masks and counts an env can put in `info`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .action_stats import ActionStats
from .embodiment import Embodiment, NormalizationKind

EPS = 1e-8  # cosmos-framework's floor on q99 - q01 and on std


class ActionRangeWarning(UserWarning):
    """Raw actions lie outside the range of the statistics they are normalised with."""


@dataclass(frozen=True)
class NormalizedActions:
    """Normalised actions and what happened to them.

    Attributes:
        actions: float32, the shape of the input: the values the model gets.
        outside: bool, same shape: the raw value lay outside the stats' range.
        clipped: bool, same shape: the normalised value was clipped to [-1, 1].
    """

    actions: np.ndarray
    outside: np.ndarray
    clipped: np.ndarray

    @property
    def num_outside(self) -> int:
        return int(self.outside.sum())

    @property
    def num_clipped(self) -> int:
        return int(self.clipped.sum())

    def info(self) -> dict[str, int]:
        """Counts for an env's `info` dict."""
        return {"actions_outside_stats": self.num_outside, "actions_clipped": self.num_clipped}


class ActionNormalizer:
    """Normalise raw actions with per-dimension statistics.

    Args:
        kind: `quantile`, `meanstd` or `none` (a `NormalizationKind` or its value).
        stats: `ActionStats` with q01/q99 (quantile) or mean/std (meanstd); optional for `none`
            (then only used to warn about values outside `[min, max]`).
        clip: clip normalised values to [-1, 1] (quantile only). Default False, as in training.
        width: when given, the stats must be this wide (the embodiment's raw width).
    """

    def __init__(self, kind: NormalizationKind | str, stats: ActionStats | None = None, *, clip: bool = False,
                 width: int | None = None):
        try:
            self.kind = NormalizationKind(kind)
        except ValueError:
            raise ValueError(f"kind={kind!r} is invalid; allowed: {[k.value for k in NormalizationKind]}") from None
        if not isinstance(clip, bool):
            raise ValueError(f"clip={clip!r} is invalid; allowed: True or False")
        if clip and self.kind is not NormalizationKind.QUANTILE:
            raise ValueError(f"clip=True is invalid with kind={self.kind.value!r}; allowed: clip with 'quantile' "
                             "only (its target range is [-1, 1])")
        if stats is not None and not isinstance(stats, ActionStats):
            raise ValueError(f"stats of type {type(stats).__name__} are invalid; allowed: ActionStats or None")
        needs = {NormalizationKind.QUANTILE: ("q01", "q99"), NormalizationKind.MEAN_STD: ("mean", "std")}
        needed = needs.get(self.kind, ())
        if needed and (stats is None or not stats.has(*needed)):
            got = "none" if stats is None else [k for k in ("q01", "q99", "mean", "std") if stats.has(k)]
            raise ValueError(f"kind={self.kind.value!r} needs stats with {list(needed)}; got {got}")
        if width is not None and stats is not None and stats.width != width:
            raise ValueError(f"stats are {stats.width} wide but the actions are {width} wide; allowed: stats of "
                             f"width {width} (ActionStats.select picks dimensions)")
        self.stats = stats
        self.clip = clip
        self.width = width if width is not None else (stats.width if stats is not None else None)

    @classmethod
    def for_embodiment(cls, embodiment: Embodiment, stats: ActionStats | None = None, *,
                       clip: bool = False) -> ActionNormalizer:
        """The normaliser an embodiment was trained with; a ValueError when that is unpublished."""
        if embodiment.normalization is None:
            raise ValueError(f"embodiment {embodiment.describe()} has no published normalisation; allowed: "
                             "ActionNormalizer(kind, stats) with the kind you know")
        return cls(embodiment.normalization, stats, clip=clip, width=embodiment.raw_width)

    # --- the stage --------------------------------------------------------------------------------

    def range(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Per-dimension raw range the stats vouch for, or None when they give none."""
        s = self.stats
        if s is None:
            return None
        if self.kind is NormalizationKind.QUANTILE:
            return s.q01, s.q99
        return (s.min, s.max) if s.has("min", "max") else None

    def __call__(self, raw: Any) -> NormalizedActions:
        """Normalise `[..., D]` raw actions (finite numbers); returns float32 values and masks."""
        actions = self._check(raw)
        bounds = self.range()
        if bounds is None:
            outside = np.zeros(actions.shape, bool)
        else:
            outside = (actions < bounds[0]) | (actions > bounds[1])
        if outside.any():
            dims = sorted(set(np.nonzero(outside)[-1].tolist()))
            label = "[q01, q99]" if self.kind is NormalizationKind.QUANTILE else "[min, max]"
            what = "clipped to [-1, 1]" if self.clip else "passed through unclipped, as in training"
            warnings.warn(f"{int(outside.sum())} raw action values lie outside the stats' {label} in dimensions "
                          f"{dims}; {what}", ActionRangeWarning, stacklevel=2)
        out = self._forward(actions)
        clipped = np.zeros(actions.shape, bool)
        if self.clip:
            clipped = (out < -1.0) | (out > 1.0)
            out = np.clip(out, -1.0, 1.0)
        return NormalizedActions(actions=out.astype(np.float32), outside=outside, clipped=clipped)

    def denormalize(self, normalized: Any) -> np.ndarray:
        """Model-space values back to raw actions (clipped values come back at the range's edge)."""
        x = self._check(normalized)
        s = self.stats
        if self.kind is NormalizationKind.QUANTILE:
            return (0.5 * (x + 1.0) * (s.q99 - s.q01) + s.q01).astype(np.float32)
        if self.kind is NormalizationKind.MEAN_STD:
            return (x * s.std + s.mean).astype(np.float32)
        return x.copy()

    def _forward(self, x: np.ndarray) -> np.ndarray:
        s = self.stats
        if self.kind is NormalizationKind.QUANTILE:
            return 2.0 * (x - s.q01) / np.maximum(s.q99 - s.q01, np.float32(EPS)) - 1.0
        if self.kind is NormalizationKind.MEAN_STD:
            return (x - s.mean) / np.maximum(s.std, np.float32(EPS))
        return x.copy()

    def _check(self, values: Any) -> np.ndarray:
        array = np.asarray(values)
        if array.dtype.kind not in "fiu" or array.dtype == np.bool_:
            raise ValueError(f"actions dtype {array.dtype} is invalid; allowed: numbers")
        if array.ndim < 1 or (self.width is not None and array.shape[-1] != self.width):
            allowed = f"[..., {self.width}]" if self.width is not None else "[..., D]"
            raise ValueError(f"actions shape {array.shape} is invalid; allowed: {allowed}")
        if not np.all(np.isfinite(array)):
            raise ValueError("actions contain NaN or inf; allowed: finite values")
        return array.astype(np.float32)

    def __repr__(self) -> str:
        return f"ActionNormalizer(kind={self.kind.value!r}, width={self.width}, clip={self.clip})"
