"""worldstep.fidelity.decisions: precision, MMRV, the hazard of false success and lost blocks, on known cases."""

from __future__ import annotations

import numpy as np
import pytest
from worldstep.episodes import EpisodeResult
from worldstep.fidelity.decisions import episode_tables, hazard, lost_rate, mmrv, precision
from worldstep.fidelity.rollouts import EpisodeOutcome


def test_precision_is_the_share_of_reported_successes_the_replay_confirms():
    model = np.array([True, True, True, False, True])
    replay = np.array([True, False, True, True, False])
    assert precision(model, replay) == pytest.approx(2 / 4)
    assert np.isnan(precision(np.zeros(3, bool), np.ones(3, bool)))


def test_mmrv_weighs_each_swap_by_the_true_gap():
    true = np.array([0.9, 0.5, 0.1])
    assert mmrv(true, true) == 0.0  # same order
    assert mmrv(true, np.array([0.5, 0.9, 0.1])) == pytest.approx((0.4 + 0.4 + 0.0) / 3)  # top two swapped
    assert mmrv(true, true[::-1]) == pytest.approx((0.8 + 0.4 + 0.8) / 3)  # reversed: max gap per policy


def _outcome(policy, seed, windows, success, replay, lost_at=None):
    detections = [{"model": {"block": None if lost_at is not None and w >= lost_at else [1.0, 1.0]},
                   "sim": {"block": [1.0, 1.0]}} for w in range(windows)]
    return EpisodeOutcome(EpisodeResult(index=0, seed=seed, windows=windows, success=success), policy, replay,
                          stop="success" if success else "max_windows", detections=detections)


def test_hazard_counts_false_successes_per_window_at_risk_and_lost_blocks():
    outcomes = [_outcome("a", 1, 2, True, False), _outcome("a", 2, 8, False, False, lost_at=5),
                _outcome("b", 1, 6, True, True), _outcome("b", 2, 7, True, False)]
    tables = episode_tables(outcomes, ["a", "b"], [1, 2])
    bins = hazard(tables, 8)
    # windows 1-4: 2 + 4 + 4 + 4 at risk, one false success (a/1 at window 2); windows 5-8: 0 + 4 + 2 + 3 at
    # risk, one (b/2 at window 7; b/1's success at window 6 is real)
    assert [(b["false_successes"], b["windows_at_risk"]) for b in bins] == [(1, 14), (1, 9)]
    assert bins[0]["value"] == pytest.approx(1 / 14) and bins[1]["value"] == pytest.approx(1 / 9)
    lost = lost_rate(tables)
    assert (lost["lost"], lost["episodes"]) == (1, 4) and lost["value"] == pytest.approx(0.25)
