"""Prediction-powered success rates: N model-only episodes, corrected by n paired ones (the same start run in the
model and in the simulator, or on a robot), with a valid 95% interval (PPI, Angelopoulos et al. 2023).

The model's rate over the N episodes is biased; the paired episodes measure that bias (model minus truth), and
subtracting it leaves an unbiased estimate of the true rate whose variance adds the two samples' variances. With
n = 10 a sample variance is often 0 (all ten pairs agree), which would give a zero-width interval: each variance
is taken with one pseudo-observation at the extremes (half weight each, as a Wilson-style floor), which keeps the
intervals' coverage at or above 95% in `tests/test_trust_ppi.py`'s simulations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

Z95 = 1.959964


@dataclass(frozen=True)
class PPIRate:
    """The corrected rate with its 95% interval, both clipped to [0, 1] (`unclipped`: the unbiased estimate, which
    can leave it); `model_rate` (the N episodes alone) and `rectifier` (mean of model minus truth over the pairs)
    are what it is made of."""

    value: float
    ci95: tuple[float, float]
    model_rate: float
    rectifier: float
    n: int
    N: int
    unclipped: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ci95": list(self.ci95)}


def _floored_variance(x: np.ndarray, extremes: tuple[float, float]) -> float:
    """Sample variance of `x` plus one pseudo-observation split between `extremes` (weight 1/2 each)."""
    values = np.concatenate([x, extremes])
    weights = np.concatenate([np.ones(len(x)), [0.5, 0.5]])
    mean = np.average(values, weights=weights)
    return float(np.sum(weights * (values - mean) ** 2) / (weights.sum() - 1))


def _as_outcomes(name: str, values: Sequence, minimum: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or len(arr) < minimum or not np.all(np.isin(arr, (0, 1))):
        raise ValueError(f"{name}={values!r} is invalid; allowed: a sequence of at least {minimum} outcomes, each "
                         "True/False (or 1/0)")
    return arr.astype(float)


def ppi_rate(model: Sequence, paired_model: Sequence, paired_true: Sequence) -> PPIRate:
    """The true success rate from `model` (N model-only outcomes) and n pairs (`paired_model[j]`,
    `paired_true[j]`: the same episode's outcome in the model and in the truth)."""
    f = _as_outcomes("model", model, 1)
    fp = _as_outcomes("paired_model", paired_model, 2)
    y = _as_outcomes("paired_true", paired_true, 2)
    if len(fp) != len(y):
        raise ValueError(f"paired_model and paired_true are invalid: {len(fp)} and {len(y)} outcomes; allowed: the "
                         "same count (one pair per episode)")
    difference = fp - y  # [n] in {-1, 0, 1}
    value = float(f.mean() - difference.mean())
    se = np.sqrt(_floored_variance(f, (0.0, 1.0)) / len(f) + _floored_variance(difference, (-1.0, 1.0)) / len(y))
    low, high = max(0.0, value - Z95 * se), min(1.0, value + Z95 * se)
    clipped = min(1.0, max(0.0, value))  # a rate is in [0, 1]; the unclipped estimate is kept beside it
    return PPIRate(clipped, (float(low), float(high)), float(f.mean()), float(difference.mean()), len(y), len(f),
                   value)


def check_pairs(name: str, pairs: Sequence) -> list[tuple[bool, bool]]:
    """`pairs` as (model, truth) bools; ValueError naming `name` before any work when it is not at least two."""
    try:
        rows = [tuple(p) for p in pairs]
    except TypeError:
        rows = []
    if len(rows) < 2 or any(len(r) != 2 or not all(v in (0, 1) and not isinstance(v, float) for v in r) for r in rows):
        raise ValueError(f"{name}={pairs!r} is invalid; allowed: at least two (model_success, true_success) pairs "
                         "of bools")
    return [(bool(a), bool(b)) for a, b in rows]


def with_corrected_rate(report, pairs: list[tuple[bool, bool]], out_dir: Path | None = None):
    """`report` (an `EvalReport`) with its rate corrected by `pairs`, rewritten into `out_dir/report.json`."""
    from ..outputs import write_json

    ok = [e.success for e in report.episodes if e.status == "ok"]
    if ok:
        report.corrected_success_rate = ppi_rate(ok, [m for m, _ in pairs], [t for _, t in pairs]).to_dict()
        if out_dir is not None and (out_dir / "report.json").exists():
            write_json(out_dir / "report.json", report.to_dict())
    return report
