"""Rank agreement: Pearson r and Spearman rho (ties share the mean rank), as the planner's score check and the
fidelity ranking use them."""

from __future__ import annotations

import numpy as np


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), as Spearman's rho needs."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=np.float64)
    for value in np.unique(x):
        tie = x == value
        ranks[tie] = ranks[tie].mean()
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r; NaN when either side is constant."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rho (Pearson on average ranks); NaN when either side is constant."""
    return pearson(_ranks(np.asarray(x)), _ranks(np.asarray(y)))
