"""The trust study read from fidelity records: signals per recorded window, the rule's claims and their figures, the
fit, and the harness's prediction-powered rates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from worldstep.episodes import EpisodeResult
from worldstep.fidelity.corrected import corrected_section
from worldstep.fidelity.rollouts import EpisodeOutcome
from worldstep.fidelity.trust_study import Window, claim, episode_windows, fit, rule_stats
from worldstep.trust import SelectiveRule, TrustSignals, ppi_rate

STILL = [[0.0, 0.0]] * 4
FIRST = {"effector": [10.0, 10.0], "block": [40.0, 40.0]}


def _window(block, model_success, sim_success, forks=None):
    d = {"model": {"effector": [10.0, 10.0], "block": block}, "sim": {"effector": [10.0, 10.0], "block": [40, 40]},
         "model_success": model_success, "sim_success": sim_success}
    return d if forks is None else {**d, "forks": forks}


def test_signals_per_recorded_window_with_the_continued_ones():
    detections = [_window([40.0, 40.0], False, False, [False, False]), _window([43.0, 44.0], True, False,
                                                                                 [True, False])]
    continued = [{**_window([43.0, 44.0], True, True, [True, True]), "actions": STILL},
                 {**_window(None, False, False, [False, True]), "actions": STILL}]
    outcome = EpisodeOutcome(EpisodeResult(index=0, seed=1, windows=2, success=True), "expert", False,
                             [STILL, STILL], "success", detections, continued)
    windows = episode_windows(outcome, FIRST, trained_horizon=2)
    assert [w.signals.horizon for w in windows] == [0.5, 1.0, 1.5, 2.0]
    assert [w.signals.consistency for w in windows] == [0.0, 5.0, 0.0, float("inf")]  # still actions: no move
    assert [w.signals.persistence for w in windows] == [0, 1, 2, 0]
    assert [w.signals.agreement for w in windows] == [1.0, 0.5, 1.0, 0.5]
    assert [w.replay_by_now for w in windows] == [False, False, True, True]  # cumulative, as replay_success


def _ep(*rows):
    """Windows from (model_success, replay_by_now, consistency) rows; persistence counted."""
    out, streak = [], 0
    for i, (m, r, c) in enumerate(rows, start=1):
        streak = streak + 1 if m else 0
        out.append(Window(TrustSignals(window=i, horizon=i / 8, consistency=c, persistence=streak), m, r))
    return out


def test_the_rule_claims_at_its_first_passing_window_and_the_figures_count_claims():
    real_late = _ep((True, False, 5.0), (True, True, 1.0))  # first success drifts, the held one is real
    false = _ep((False, False, 1.0), (True, False, 4.0))
    real_early = _ep((True, True, 0.5),)
    rule = SelectiveRule(consistency_max=2.0)
    assert claim(rule, real_late, 16) == (True, True) and claim(rule, false, 16) == (False, False)
    assert claim(rule, real_late, 1) == (False, False)  # no claim past the run's windows
    episodes = [(real_late, False, True), (false, False, False), (real_early, True, True)]
    stats = rule_stats(rule, episodes, 16)
    assert (stats["claimed"], stats["real"], stats["precision"], stats["strict_false_success"]) == (2, 2, 1.0, 0.0)
    as_reported = rule_stats(SelectiveRule(), episodes, 16)
    assert as_reported["claimed"] == 3 and as_reported["real"] == 1 and as_reported["strict_false_success"] == 1.0


def test_the_fit_keeps_the_most_coverage_at_the_precision_floor():
    good = [(_ep((True, True, 0.5)), True, True)] * 40
    drift = [(_ep((True, False, 5.0)), False, False)] * 20
    rule, table, met = fit(good + drift, 16)
    stats = rule_stats(rule, good + drift, 16)
    assert met and stats["real"] == 40 and stats["claimed"] == 40 and rule.consistency_max is not None
    assert len(table) > 100
    rule, _, met = fit(drift, 16)
    assert rule is None and not met  # nothing real to claim: no rule


def _runs(table: np.ndarray, names: list[str], seeds: list[int], world: str) -> list[EpisodeOutcome]:
    return [EpisodeOutcome(EpisodeResult(index=0, seed=s, success=bool(table[p, e])), name,
                           None if world == "sim" else False)
            for p, name in enumerate(names) for e, s in enumerate(seeds)]


def test_the_harness_corrects_each_policys_rate_with_its_first_n_episodes():
    rng = np.random.default_rng(0)
    names, seeds = ["a", "b", "idle"], list(range(100, 120))
    sim = rng.random((3, 20)) < np.array([[0.8], [0.3], [0.0]])
    model = sim ^ (rng.random((3, 20)) < 0.2)
    out = corrected_section(_runs(sim, names, seeds, "sim"), _runs(model, names, seeds, "model"), names, ("idle",),
                            seeds, 5)
    expected = ppi_rate(model[1, 5:], model[1, :5], sim[1, :5])
    assert out["policies"]["b"]["value"] == expected.value and out["policies"]["b"]["sim_rate"] == sim[1].mean()
    assert out["without_floor"]["policies"] == 2 and (out["paired"], out["model_only"]) == (5, 15)
    w = out["without_floor"]
    low, high = w["mean_abs_error_ci95"]
    assert 0 <= low <= w["mean_abs_error"] <= high
    assert -1 <= w["spearman_ci95"][0] <= w["spearman_ci95"][1] <= 1
    with pytest.raises(ValueError, match="paired=20"):
        corrected_section([], [], names, ("idle",), seeds, 20)


def _trust_policies(precision=(19, 20), coverage=(19, 40), false=(1, 60), covering=8, error=(0.05, 0.07),
                    rho=(0.95, 0.8)) -> dict:
    from worldstep.measures.intervals import wilson

    at = {"rule": SelectiveRule(persistence_min=3).to_dict(), "rule_sha256": "ab" * 32, "claimed": precision[1],
          "real": precision[0], "precision": precision[0] / precision[1],
          "precision_wilson95": list(wilson(*precision)),
          "coverage": coverage[0] / coverage[1], "coverage_wilson95": list(wilson(*coverage)), "recall": 0.4,
          "strict_false_success": false[0] / false[1], "strict_false_success_wilson95": list(wilson(*false))}
    return {"selective": {"at_rule": at, "as_reported": at},
            "corrected": {"paired": 10, "policies": {}, "without_floor": {
                "mean_abs_error": error[0], "mean_abs_error_ci95": [0.02, error[1]], "intervals_covering": covering,
                "policies": 8, "spearman": rho[0], "spearman_ci95": [rho[1], 1.0]}}}


def test_the_trust_targets_are_judged_on_their_intervals():
    from worldstep.fidelity.report import _trust_targets

    met = {k: t["met"] for k, t in _trust_targets(_trust_policies()).items()}
    assert met == {"selective_precision_at_rule": False, "strict_false_success_at_rule": True,
                   "corrected_mean_abs_error": True, "corrected_spearman": True, "corrected_intervals_covering": True}
    # 19/20 has precision 0.95 but a Wilson low of 0.76: the interval decides; 190/200 meets it (low 0.91)
    assert _trust_targets(_trust_policies(precision=(190, 200), coverage=(190, 400)))[
        "selective_precision_at_rule"]["met"]
    # each violation alone fails its target
    cases = {"selective_precision_at_rule": dict(precision=(190, 200), coverage=(190, 700)),  # coverage 0.27
             "strict_false_success_at_rule": dict(false=(5, 60)),  # 0.083
             "corrected_mean_abs_error": dict(error=(0.05, 0.09)),  # high end above 0.08
             "corrected_spearman": dict(rho=(0.95, 0.6)),
             "corrected_intervals_covering": dict(covering=6)}
    for name, bad in cases.items():
        judged = _trust_targets(_trust_policies(**bad))
        assert not judged[name]["met"], name
        assert all(t["met"] for k, t in judged.items() if k not in (name, "selective_precision_at_rule")), name


def test_the_summary_shows_the_rule_the_corrected_rates_and_their_targets():
    from worldstep.fidelity.report import _trust_targets
    from worldstep.fidelity.summary import corrected_table, selective_table, targets_table

    policies = _trust_policies()
    policies["corrected"]["policies"] = {"expert": {"value": 0.8, "ci95": [0.6, 1.0], "model_rate_all": 0.5,
                                                    "sim_rate": 0.9, "covers_sim_rate": True}}
    policies["corrected"]["model_only"] = 40
    policies["corrected"]["without_floor"].update(model_only_mean_abs_error=0.2, model_only_spearman=0.7)
    text = "\n".join([selective_table(policies), corrected_table(policies),
                      targets_table({"targets": _trust_targets(policies)})])
    assert "| at the rule | 20 | 19 | 0.95 [0.76, 0.99] |" in text
    assert "| expert | 0.80 [0.60, 1.00] | 0.50 | 0.90 | yes |" in text
    assert "| corrected | 0.050 [0.020, 0.070] | 0.95 [0.80, 1.00] | 8 of 8 |" in text
    assert "| corrected_intervals_covering (the 95% intervals cover the simulator's rate for >= 7 of 8 " in text


def test_a_report_with_a_frozen_rule_records_its_hash_and_refuses_an_edited_rule(tmp_path):
    import json

    from worldstep.fidelity.report import main

    rule = SelectiveRule(consistency_max=2.0)
    path = tmp_path / "rule.json"
    path.write_text(json.dumps({**rule.to_dict(), "sha256": rule.sha256}))
    report = main(["--budget", "small", "--threads", "1", "--sections", "policies", "--rule", str(path),
                   "--out", str(tmp_path / "run")])
    assert report["provenance"]["rule_sha256"] == rule.sha256
    selective = report["policies"]["selective"]
    assert selective["at_rule"]["rule_sha256"] == rule.sha256
    assert selective["at_rule"]["claimed"] <= selective["as_reported"]["claimed"]
    assert {"selective_precision_at_rule", "strict_false_success_at_rule"} <= set(report["targets"])
    path.write_text(json.dumps({**rule.to_dict(), "consistency_max": 3.0, "sha256": rule.sha256}))
    with pytest.raises(SystemExit):
        main(["--budget", "small", "--sections", "policies", "--rule", str(path), "--out", str(tmp_path / "x")])


def test_committed_records_are_read_from_their_gzipped_copy(tmp_path):
    import gzip

    from worldstep.fidelity.records import Records, read_records, write_records

    outcome = EpisodeOutcome(EpisodeResult(index=0, seed=7, windows=1, success=True), "expert", True, [STILL],
                             "success", [_window([40.0, 40.0], True, True)])
    write_records(tmp_path, Records(episodes=[outcome]))
    plain = tmp_path / "records" / "episodes.jsonl"
    expected = [o.to_record() for o in read_records(tmp_path).episodes]
    with gzip.open(plain.with_name("episodes.jsonl.gz"), "wt") as f:
        f.write(plain.read_text())
    plain.unlink()
    assert [o.to_record() for o in read_records(tmp_path).episodes] == expected == [outcome.to_record()]


def test_with_a_rule_the_model_loop_planner_stops_on_it(tmp_path):
    import json

    from worldstep.fidelity.report import main

    rule = SelectiveRule(persistence_min=2)
    path = tmp_path / "rule.json"
    path.write_text(json.dumps({**rule.to_dict(), "sha256": rule.sha256}))
    argv = ["--budget", "small", "--threads", "1", "--sections", "policies,planning", "--plan-anchor", "",
            "--rule", str(path), "--out", str(tmp_path / "run")]
    report = main(argv)
    assert report["planning"]["stop_rule_sha256"] == rule.sha256
    assert report["targets"]["planning_lift_model_loop"]["stop_rule_sha256"] == rule.sha256
    rows = [json.loads(r) for r in (tmp_path / "run" / "records" / "planning.jsonl").read_text().splitlines()]
    model = [r for r in rows if r["observe"] == "model"]
    assert model and all(r["stop_rule_sha256"] == rule.sha256 and len(r["window_trust"]) == r["windows"]
                         for r in model)
    for r in model:  # claimed only where the rule's signals passed; the streak alone never stopped it
        claims = [rule.failing(TrustSignals(**t)) is None and seen for t, (seen, _) in
                  zip(r["window_trust"], r["window_success"])]
        assert r["model_success"] == any(claims) and (r["stop"] == "claimed_success") == any(claims)
    assert all(r["stop_rule_sha256"] is None for r in rows if r["observe"] == "simulator")
    horizon = tmp_path / "horizon.json"
    horizon_rule = SelectiveRule(horizon_max=1.0)
    horizon.write_text(json.dumps({**horizon_rule.to_dict(), "sha256": horizon_rule.sha256}))
    with pytest.raises(ValueError, match="trained horizon"):  # the tiny random checkpoint records none
        main([*argv[:-4], "--rule", str(horizon), "--out", str(tmp_path / "h")])


def _outcome(seed: int, success_at: int) -> EpisodeOutcome:
    """A model episode whose frames show success from window `success_at` on, confirmed by its replay."""
    rows = [_window([40.0, 40.0], w >= success_at, w >= success_at) for w in range(1, success_at + 1)]
    return EpisodeOutcome(EpisodeResult(index=0, seed=seed, windows=success_at, success=True), "expert", True,
                          [STILL] * success_at, "success", rows)


def test_the_selective_section_reads_the_horizon_it_is_given(monkeypatch):
    from worldstep.fidelity import trust_study

    monkeypatch.setattr(trust_study, "first_detections", lambda seed: FIRST)
    late = [_outcome(1, 6)]  # success at window 6: past a 4-window horizon, within an 8-window one
    rule = SelectiveRule(horizon_max=1.0)
    assert trust_study.selective_section(late, rule, 16, trained_horizon=8)["at_rule"]["claimed"] == 1
    assert trust_study.selective_section(late, rule, 16, trained_horizon=4)["at_rule"]["claimed"] == 0
    with pytest.raises(ValueError, match="horizon_max needs the checkpoint's trained horizon"):
        trust_study.selective_section(late, rule, 16, trained_horizon=None)
    assert trust_study.selective_section(late, SelectiveRule(), 16, trained_horizon=None)["at_rule"]["claimed"] == 1


@dataclass(frozen=True)
class Task:
    """A journal task (a key hashed from its fields)."""

    seed: int


def test_a_study_reads_the_episodes_of_a_stretch_cut_short(tmp_path):
    from worldstep.fidelity.journal import Journal
    from worldstep.fidelity.trust_study import model_outcomes

    journal = Journal(tmp_path, {"split": "validation"}, resume=False)
    journal.put(Task(2), [_outcome(2, 3)])
    journal.put(Task(1), [_outcome(1, 2), EpisodeOutcome(EpisodeResult(index=0, seed=1), "expert", None)])
    found = model_outcomes(tmp_path)  # no records/ yet: what the journal holds, model episodes only, by seed
    assert [(o.episode.seed, o.episode.windows) for o in found] == [(1, 2), (2, 3)]
