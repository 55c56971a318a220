"""Prediction-powered success rates: unbiased, with 95% intervals that cover the true rate (checked by simulation
with a fixed seed), and the model's own rate is shown not to."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.trust import ppi_rate

# (true rate, P(model success | true failure), P(model failure | true success)): a model that over-reports,
# one that under-reports, and one nearly always right
SCENARIOS = ((0.6, 0.3, 0.1), (0.5, 0.0, 0.4), (0.3, 0.05, 0.05), (0.9, 0.5, 0.05))


def _draw(rng, rate: float, false_success: float, missed: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    truth = rng.random(size) < rate
    model = np.where(truth, rng.random(size) >= missed, rng.random(size) < false_success)
    return model, truth


def _coverage(estimate, scenario, repeats: int = 1500, N: int = 40, n: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    rate = scenario[0]
    hits, errors = [], []
    for _ in range(repeats):
        model, truth = _draw(rng, *scenario, N + n)
        value, (low, high) = estimate(model[:N], model[N:], truth[N:])
        hits.append(low <= rate <= high)
        errors.append(value - rate)
    return float(np.mean(hits)), float(np.mean(errors))


def _ppi(model, paired_model, paired_true):
    r = ppi_rate(model, paired_model, paired_true)
    assert r.ci95[0] <= r.value <= r.ci95[1] and 0 <= r.value <= 1
    return r.unclipped, r.ci95


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_corrected_rates_are_unbiased_and_their_intervals_cover(scenario):
    coverage, bias = _coverage(_ppi, scenario)
    assert coverage >= 0.94, (scenario, coverage)
    assert abs(bias) < 0.015, (scenario, bias)


def test_the_models_own_rate_fails_the_same_check():
    """The check above can fail: the model-only rate (a Wilson-width interval, no pairs used) misses."""
    def model_only(model, paired_model, paired_true):
        p = float(np.mean(np.concatenate([model, paired_model])))
        half = 1.96 * np.sqrt(p * (1 - p) / 50)
        return p, (p - half, p + half)

    coverage, bias = _coverage(model_only, SCENARIOS[1])
    assert coverage < 0.5 and abs(bias) > 0.1


def test_pairs_that_all_agree_still_give_an_interval_and_inputs_are_checked():
    r = ppi_rate([True] * 30 + [False] * 10, [True] * 5 + [False] * 5, [True] * 5 + [False] * 5)
    assert r.value == 0.75 and r.rectifier == 0.0 and r.ci95[1] - r.ci95[0] > 0.2 and (r.n, r.N) == (10, 40)
    with pytest.raises(ValueError, match="paired_model and paired_true"):
        ppi_rate([True], [True, False], [True, False, True])
    with pytest.raises(ValueError, match="paired_true=.*True/False"):
        ppi_rate([True], [True, False], [2, 0])
    with pytest.raises(ValueError, match="model="):
        ppi_rate([], [True, False], [True, False])


def test_evaluate_reports_the_rate_corrected_by_paired_outcomes(world, tmp_path):  # noqa: F811
    import json

    import worldstep
    from worldstep.policies import SinePolicy

    every = lambda frames: True  # noqa: E731 - every window a success in the model
    pairs = [(True, True), (True, False), (True, False), (True, True)]
    report = worldstep.evaluate(world, SinePolicy(world.action_shape), 3, out_dir=tmp_path, success_fn=every,
                                record_video=False, progress=False, paired_outcomes=pairs)
    saved = json.loads((tmp_path / "report.json").read_text())["corrected_success_rate"]
    assert report.success_rate == 1.0 and saved["value"] == 0.5 and saved["rectifier"] == 0.5
    assert (saved["n"], saved["N"]) == (4, 3) and saved["ci95"][0] < 0.5 < saved["ci95"][1]
    with pytest.raises(ValueError, match="paired_outcomes="):
        worldstep.evaluate(world, SinePolicy(world.action_shape), 1, out_dir=tmp_path / "bad",
                           paired_outcomes=[(True, 0.5), (True, True)])
    assert not (tmp_path / "bad").exists()  # refused before any work
