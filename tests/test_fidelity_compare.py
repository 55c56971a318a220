"""Choosing weights on validation (`worldstep.fidelity.compare`): verdicts come from intervals, a candidate ships
only when better on one deciding figure and worse on none, runs of different seeds are refused, and the per-episode
outcomes are the records' own rows."""

from __future__ import annotations

import csv
import json

import pytest
from worldstep.fidelity.compare import Figure, main, parse_runs, ships, table, verdict


def _entry(value, low, high):
    return {"value": value, "ci95": [low, high]}


def _report(false_success, precision, cost_w1, seeds=(20_000_000, 20_000_049)):
    return {"split": "validation", "episode_seeds": list(seeds),
            "targets": {"false_success_rate_without_floor": _entry(*false_success),
                        "precision_without_floor": _entry(*precision),
                        "spearman_without_floor": _entry(0.9, 0.7, 0.95),
                        "mean_abs_rate_error_without_floor": _entry(0.1, 0.08, 0.15),
                        "object_vanish_rate_last_window": _entry(0.0, 0.0, 0.0)},
            "open_loop": {"series": {"kv": {"psnr_db": {"value": [20.0], "low": [19.0], "high": [21.0]}}}},
            "planning": {"model": {"cost_rank_correlation": {"value": [cost_w1[0]], "ci95": [list(cost_w1[1:])]}}}}


def test_verdicts_come_from_the_intervals_not_the_points():
    base = Figure(0.5, 0.4, 0.6)
    assert verdict(Figure(0.7, 0.61, 0.8), base, higher_is_better=True) == "better"
    assert verdict(Figure(0.7, 0.59, 0.8), base, higher_is_better=True) == "overlap"  # a better point is not enough
    assert verdict(Figure(0.7, 0.61, 0.8), base, higher_is_better=False) == "worse"
    assert verdict(Figure(0.2, 0.1, 0.3), base, higher_is_better=False) == "better"
    assert verdict(Figure(None, None, None), base, higher_is_better=True) == "overlap"
    assert ships(["better", "overlap", "overlap"]) and not ships(["better", "worse", "overlap"])
    assert not ships(["overlap"] * 3)


def test_the_table_ships_only_what_is_better_figure_by_figure():
    base = _report((0.17, 0.12, 0.23), (0.51, 0.41, 0.61), (0.45, 0.2, 0.6))
    better = _report((0.05, 0.02, 0.09), (0.70, 0.62, 0.80), (0.5, 0.3, 0.7))  # better twice, overlap once
    mixed = _report((0.05, 0.02, 0.09), (0.30, 0.20, 0.39), (0.5, 0.3, 0.7))  # better once, worse once
    rows = table({"shipped": base, "good": better, "mixed": mixed}).splitlines()
    assert rows[0] == "| figure (95% interval) | `shipped` | `good` | `mixed` |"
    precision = next(r for r in rows if r.startswith("| precision"))
    assert "0.700 [0.620, 0.800] (better)" in precision and "0.300 [0.200, 0.390] (worse)" in precision
    assert rows[-1] == "| ships instead of the base | – | **yes** | no |"
    read_only = [r for r in rows if "(read only)" in r]
    assert len(read_only) == 4  # shown beside, deciding nothing


def test_runs_of_different_seeds_or_bad_names_are_refused(tmp_path):
    base = _report((0.17, 0.12, 0.23), (0.51, 0.41, 0.61), (0.45, 0.2, 0.6))
    other = _report((0.17, 0.12, 0.23), (0.51, 0.41, 0.61), (0.45, 0.2, 0.6), seeds=(40_000_000, 40_000_049))
    with pytest.raises(ValueError, match="episode_seeds"):
        table({"a": base, "b": other})
    (tmp_path / "run").mkdir()
    with pytest.raises(ValueError, match="NAME=FOLDER"):
        parse_runs(["just_a_folder", "b=x"])
    with pytest.raises(ValueError, match="report.json does not exist"):
        parse_runs([f"a={tmp_path / 'run'}", f"b={tmp_path / 'run'}"])
    (tmp_path / "run" / "report.json").write_text(json.dumps(base))
    with pytest.raises(ValueError, match="given twice"):
        parse_runs([f"a={tmp_path / 'run'}", f"a={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match="at least one candidate"):
        parse_runs([f"a={tmp_path / 'run'}"])


def test_outcomes_are_one_row_per_recorded_episode(tmp_path, capsys):
    episodes = [{"world": "model", "policy": "expert", "seed": 20_000_000 + i, "success": i % 2 == 0,
                 "replay_success": i % 3 == 0, "windows": 8, "stop": "success", "actions": [[0.0]] * 8,
                 "detections": [{}] * 8} for i in range(5)]
    planning = [{"observe": "model", "policy": "plan8", "seed": 20_000_000, "model_success": True,
                 "sim_success": None, "windows": 11, "stop": "believed_success", "actions": []}]
    for name, precision in (("base", (0.5, 0.4, 0.6)), ("cand", (0.9, 0.85, 0.95))):
        run = tmp_path / name
        (run / "records").mkdir(parents=True)
        (run / "report.json").write_text(json.dumps(_report((0.1, 0.05, 0.15), precision, (0.4, 0.1, 0.6))))
        (run / "records" / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
        (run / "records" / "planning.jsonl").write_text("".join(json.dumps(p) + "\n" for p in planning))
    assert main([f"base={tmp_path / 'base'}", f"cand={tmp_path / 'cand'}", "--outcomes", str(tmp_path / "out")]) == 0
    assert "| ships instead of the base | – | **yes** |" in capsys.readouterr().out
    with (tmp_path / "out" / "cand.episodes.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["seed"]) for r in rows] == [e["seed"] for e in episodes]
    assert [r["replay_success"] for r in rows] == [str(e["replay_success"]) for e in episodes]
    assert "actions" not in rows[0]
    with (tmp_path / "out" / "base.planning.csv").open() as f:
        plan = list(csv.DictReader(f))
    assert plan == [{"observe": "model", "policy": "plan8", "seed": "20000000", "model_success": "True",
                     "sim_success": "", "windows": "11", "stop": "believed_success"}]
