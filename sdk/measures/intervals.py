"""Estimates with 95% intervals: a percentile bootstrap over the units that were sampled (episodes, clips).

Every interval resamples the independent units of the experiment with replacement: start seeds for
episodes (one resample shared by every policy, so paired comparisons keep their pairing) and clips for
open-loop scores. A success rate's bootstrap interval collapses to a point at 0/n or n/n, so rates also
carry the Wilson score interval, which does not.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A statistic on the whole sample and its 95% percentile-bootstrap interval (NaN: undefined)."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float | list[float]]:
        return {"value": self.value, "ci95": [self.low, self.high]}

    def __str__(self) -> str:
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]"


def bootstrap(statistic: Callable[[np.ndarray], float], units: int, resamples: int = RESAMPLES,
              seed: int = 0, strata: Sequence[int] | None = None) -> Estimate:
    """`statistic(indices)` on all `units` and on `resamples` resamples of them with replacement.

    `strata` (sizes summing to `units`, in index order) resamples each stratum within itself, so a design
    that fixed how many units each part has (n paired episodes beside N model-only ones) keeps it.
    Resamples where the statistic is undefined (NaN, e.g. a correlation of a constant) are left out of
    the interval; when more than half are, the interval is NaN.
    """
    return bootstraps(lambda idx: [statistic(idx)], units, resamples, seed, strata)[0]


def bootstraps(statistics: Callable[[np.ndarray], Sequence[float]], units: int, resamples: int = RESAMPLES,
               seed: int = 0, strata: Sequence[int] | None = None) -> list[Estimate]:
    """`bootstrap` for several statistics computed together from each resample (one pass when they share work)."""
    if units < 1:
        raise ValueError(f"units={units} is invalid; allowed: >= 1")
    sizes = [units] if strata is None else [int(s) for s in strata]
    if any(s < 1 for s in sizes) or sum(sizes) != units:
        raise ValueError(f"strata={strata!r} is invalid; allowed: sizes >= 1 that sum to units ({units})")
    starts = np.cumsum([0, *sizes[:-1]])
    rng = np.random.default_rng(seed)

    def resample() -> np.ndarray:
        return np.concatenate([start + rng.integers(size, size=size) for start, size in zip(starts, sizes)])

    values = np.asarray(statistics(np.arange(units)), dtype=np.float64)
    draws = np.array([statistics(resample()) for _ in range(resamples)], dtype=np.float64).reshape(resamples, -1)
    tail = (1 - LEVEL) / 2 * 100
    out = []
    for value, column in zip(values, draws.T):
        finite = column[np.isfinite(column)]
        if len(finite) < resamples / 2:
            out.append(Estimate(float(value), float("nan"), float("nan")))
            continue
        low, high = np.percentile(finite, [tail, 100 - tail])
        out.append(Estimate(float(value), float(low), float(high)))
    return out


def nanmean(x: np.ndarray, axis=None) -> np.ndarray:
    """Mean ignoring NaNs, NaN (no warning) where nothing is left."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def mean_estimate(values: np.ndarray, seed: int = 0) -> Estimate:
    """Mean of `values` `[N]` over units (NaN-aware) with its bootstrap interval: `bootstrap` of the mean,
    vectorised (the same resamples, drawn as one `[resamples, N]` index array)."""
    values = np.asarray(values, dtype=np.float64)
    units = len(values)
    if units < 1:
        raise ValueError(f"units={units} is invalid; allowed: >= 1")
    draws = nanmean(values[np.random.default_rng(seed).integers(units, size=(RESAMPLES, units))], axis=1)
    finite = draws[np.isfinite(draws)]
    value = float(nanmean(values))
    if len(finite) < RESAMPLES / 2:
        return Estimate(value, float("nan"), float("nan"))
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return Estimate(value, float(low), float(high))


def per_window_estimates(values: np.ndarray, seed: int = 0) -> list[Estimate]:
    """`[N, W]` per-unit scores -> one mean estimate per window, resampling the N units."""
    values = np.asarray(values, dtype=np.float64)
    rng_seeds = np.random.default_rng(seed).integers(2**31, size=values.shape[1])
    return [mean_estimate(values[:, w], seed=int(s)) for w, s in enumerate(rng_seeds)]


def wilson(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a binomial rate."""
    if trials < 1:
        return float("nan"), float("nan")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def rate_dict(outcomes: np.ndarray, seed: int = 0) -> dict[str, float | int | list[float]]:
    """A success rate of boolean `outcomes` `[N]`: value, bootstrap ci95, Wilson interval and counts."""
    outcomes = np.asarray(outcomes, dtype=bool)
    est = mean_estimate(outcomes.astype(np.float64), seed=seed)
    return {**est.to_dict(), "wilson95": list(wilson(int(outcomes.sum()), len(outcomes))),
            "successes": int(outcomes.sum()), "episodes": len(outcomes)}
