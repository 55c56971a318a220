"""`python -m worldstep.fidelity.trust_study RUN`: the trust signals of a fidelity run's model episodes, read from
its records alone; the selective rule's precision against its coverage, and the rule fitted there, frozen.

Each model window (the stop's and, in a study run, the `--continue-windows` ones after it) gets the signals
`worldstep.trust` measures online: `horizon` (window over the trained horizon), `consistency` (the block residual:
the model's previous detections stepped by PushSim's rules through the window's chunk, against the block it drew),
`agreement` (share of the `--agreement-forks` forks whose frames agree), `persistence` (windows success has held). A
rule claims an episode's success at the first window (<= the run's `max_windows`) where the model shows success
and every threshold passes; the claim is real when the episode's own chunks replayed in the simulator have shown
success by then. Fitted on validation, never on a sealed range.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from worldstep.envs.push_policies import FLOOR

from ..flags import flag, int_at_least, parse_flags
from ..measures.intervals import wilson
from ..trust.rule import SelectiveRule
from ..trust.signals import TrustSignals
from ..trust.trackers import block_residual
from .journal import Journal
from .records import read_records
from .rollouts import EpisodeOutcome

TRAINED_HORIZON = 8  # the shipped pusher's training clips: 8 windows (its worldstep.json records it)
MIN_PRECISION_LOW = 0.90  # the fit: most coverage whose precision interval stays above this
MIN_COVERAGE = 0.30  # else: the best precision interval among rules covering this share (the target)
NAMED = {"as reported": SelectiveRule(), "window <= trained horizon": SelectiveRule(horizon_max=1.0),
         "block residual <= 2 px": SelectiveRule(consistency_max=2.0),
         "both": SelectiveRule(horizon_max=1.0, consistency_max=2.0),
         "success held 2 windows": SelectiveRule(persistence_min=2),
         "every fork agrees": SelectiveRule(agreement_min=1.0)}
GRID = {"horizon_max": (None, 0.75, 1.0, 1.25, 1.5),
        "consistency_max": (None, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
        "agreement_min": (None, 0.34, 0.67, 1.0),
        "persistence_min": (None, 2, 3)}


@dataclass(frozen=True)
class Window:
    """One model window's signals, whether the model showed success, and whether the replay had by then."""

    signals: TrustSignals
    model_success: bool
    replay_by_now: bool


def first_detections(seed: int) -> dict[str, Any]:
    """The detector's effector and block in the episode's first frame (the start is the seed's scene)."""
    from worldstep.envs.push_sim import PushSimEnv, detect_objects

    obs, _ = PushSimEnv().reset(seed=seed)
    return detect_objects(obs["frames"][0])


def episode_windows(outcome: EpisodeOutcome, first: dict[str, Any], trained_horizon: int | None) -> list[Window]:
    """Every recorded model window of `outcome` (the stop's, then the continued ones) with its signals."""
    rows = [(d, a, d["sim_success"]) for d, a in zip(outcome.detections, outcome.actions)]
    replay = bool(outcome.replay_success)
    for c in outcome.continued:
        replay = replay or c["sim_success"]
        rows.append((c, c["actions"], replay))
    out, previous, streak = [], first, 0
    for w, (d, actions, replay_by_now) in enumerate(rows, start=1):
        model = d["model"]
        streak = streak + 1 if d["model_success"] else 0
        forks = d.get("forks")
        signals = TrustSignals(
            window=w, horizon=None if trained_horizon is None else w / trained_horizon,
            consistency=block_residual(previous["effector"], previous["block"], model["block"], np.asarray(actions)),
            agreement=None if not forks else float(np.mean([f == d["model_success"] for f in forks])),
            persistence=streak)
        out.append(Window(signals, bool(d["model_success"]), bool(replay_by_now)))
        previous = model
    return out


def first_claim(rule: SelectiveRule, windows: list[Window], max_windows: int) -> int | None:
    """The index of the rule's first claim within `max_windows`: the model shows success and every signal passes."""
    return next((i for i, w in enumerate(windows[:max_windows])
                 if w.model_success and rule.failing(w.signals) is None), None)


def claim(rule: SelectiveRule, windows: list[Window], max_windows: int) -> tuple[bool, bool]:
    """(claimed, real): whether the rule claims within `max_windows`, and whether the replay confirms it."""
    hit = first_claim(rule, windows, max_windows)
    return (False, False) if hit is None else (True, windows[hit].replay_by_now)


def rule_stats(rule: SelectiveRule, episodes: list[tuple[list[Window], bool, bool]], max_windows: int) -> dict:
    """Selective precision (Wilson 95%), coverage of the replay-confirmed model successes, recall of the replay
    successes and strict false success (claims the replay does not confirm, over the episodes whose replay fails
    by the claim, or by their end without one).
    `episodes`: (windows, reported and confirmed as run, replay success as run)."""
    claims = [claim(rule, w, max_windows) for w, _, _ in episodes]
    claimed = sum(c for c, _ in claims)
    real = sum(r for _, r in claims)
    # the real successes there were to claim: a window where the model shows success and the replay has too
    confirmed = sum(any(x.model_success and x.replay_by_now for x in w[:max_windows]) for w, _, _ in episodes)
    replay = sum(r for _, _, r in episodes)
    # an episode fails when its replay has not shown success by the claim (without a claim: by its end as run)
    failures = sum(not (r if c else run_replay) for (c, r), (_, _, run_replay) in zip(claims, episodes))
    false = sum(c and not r for c, r in claims)
    return {"rule": rule.to_dict(), "rule_sha256": rule.sha256, "claimed": claimed, "real": real,
            "precision": real / claimed if claimed else None, "precision_wilson95": list(wilson(real, claimed)),
            "coverage": real / confirmed if confirmed else None, "coverage_wilson95": list(wilson(real, confirmed)),
            "recall": real / replay if replay else None,
            "strict_false_success": false / failures if failures else None,
            "strict_false_success_wilson95": list(wilson(false, failures))}


def model_outcomes(run: Path) -> list[EpisodeOutcome]:
    """The model episodes of `run`: a run folder's records, else (a stretch cut short) what its journal holds, or
    an `episodes.jsonl.gz` this module exported."""
    if run.is_file():
        with gzip.open(run, "rt") as f:
            return [EpisodeOutcome.from_record(json.loads(line), i) for i, line in enumerate(f) if line.strip()]
    if any((run / "records" / name).exists() for name in ("episodes.jsonl", "episodes.jsonl.gz")):
        return [o for o in read_records(run).episodes if o.replay_success is not None]
    parts = Journal.results(run)
    found = [o for part in parts if isinstance(part, list) for o in part
             if isinstance(o, EpisodeOutcome) and o.replay_success is not None]
    return sorted(found, key=lambda o: (o.episode.seed, o.policy))


def export(outcomes: list[EpisodeOutcome], path: Path) -> None:
    """The model episodes as gzipped JSONL rows (`EpisodeOutcome.to_record`): compact enough to commit."""
    with gzip.open(path, "wt", compresslevel=9) as f:
        for o in outcomes:
            f.write(json.dumps(o.to_record(), separators=(",", ":")) + "\n")


def study_episodes(outcomes: list[EpisodeOutcome], trained_horizon: int | None, floor: bool = False) -> list:
    """(windows, reported-and-confirmed, replay success) per model episode (graded policies only unless
    `floor`)."""
    out = []
    for o in outcomes:
        if o.replay_success is None or (o.policy in FLOOR and not floor):
            continue
        windows = episode_windows(o, first_detections(o.episode.seed), trained_horizon)
        out.append((windows, bool(o.episode.success and o.replay_success), bool(o.replay_success)))
    return out


def fit(episodes: list, max_windows: int) -> tuple[SelectiveRule | None, list[dict], bool]:
    """Every grid rule's stats; the rule with the most coverage whose precision's Wilson low is at least
    `MIN_PRECISION_LOW`, or, when none reaches it, the one with the highest Wilson low among those covering at
    least `MIN_COVERAGE` (the third value says which; None when neither exists)."""
    table = []
    for values in itertools.product(*GRID.values()):
        rule = SelectiveRule(**dict(zip(GRID, values)))
        table.append(rule_stats(rule, episodes, max_windows))
    ok = [t for t in table if t["claimed"] and t["precision_wilson95"][0] >= MIN_PRECISION_LOW]
    best = max(ok, key=lambda t: (t["real"], t["precision_wilson95"][0]), default=None)
    met = best is not None
    if not met:
        wide = [t for t in table if t["claimed"] and (t["coverage"] or 0) >= MIN_COVERAGE]
        best = max(wide, key=lambda t: (t["precision_wilson95"][0], t["real"]), default=None)
    return (None if best is None else SelectiveRule.from_dict(best["rule"])), table, met


def frontier(table: list[dict]) -> list[dict]:
    """Precision against coverage: the rules no other beats on both (sorted by coverage)."""
    rows = sorted((t for t in table if t["claimed"]), key=lambda t: (-t["real"], -(t["precision"] or 0)))
    out, best = [], -1.0
    for t in rows:
        if t["precision"] > best:
            out.append(t)
            best = t["precision"]
    return sorted(out, key=lambda t: t["coverage"] or 0)


def lost_block_counts(outcomes: list[EpisodeOutcome]) -> dict[str, int]:
    """False and missed successes of the graded policies, and how many of each had a window where the model's
    frames lost the block while the replay showed it."""
    graded = [o for o in outcomes if o.replay_success is not None and o.policy not in FLOOR]

    def lost(o: EpisodeOutcome) -> bool:
        return any(d["model"]["block"] is None and d["sim"]["block"] is not None for d in o.detections)

    false = [o for o in graded if o.episode.success and not o.replay_success]
    missed = [o for o in graded if not o.episode.success and o.replay_success]
    return {"episodes": len(graded), "false_successes": len(false), "false_with_lost_block": sum(map(lost, false)),
            "missed_successes": len(missed), "missed_with_lost_block": sum(map(lost, missed))}


def load_rule(path: str | Path) -> SelectiveRule:
    """The rule a `rule.json` holds; ValueError when its recorded sha256 does not match its thresholds."""
    data = json.loads(Path(path).read_text())
    recorded = data.pop("sha256", None)
    rule = SelectiveRule.from_dict(data)
    if recorded is not None and recorded != rule.sha256:
        raise ValueError(f"rule sha256 {recorded} does not match its thresholds ({rule.sha256}): the file was edited")
    return rule


def selective_section(model_runs: list[EpisodeOutcome], rule: SelectiveRule, max_windows: int,
                      trained_horizon: int | None) -> dict[str, Any]:
    """The frozen rule's figures on a run's model episodes (graded policies), beside the as-reported ones; the
    horizon signal is the window over the checkpoint's `trained_horizon`."""
    if rule.horizon_max is not None and trained_horizon is None:
        raise ValueError("--rule is invalid: its horizon_max needs the checkpoint's trained horizon "
                         "(trained_horizon_windows in its worldstep.json); allowed: a checkpoint that records it, "
                         "or a rule without horizon_max")
    episodes = study_episodes(model_runs, trained_horizon)
    return {"at_rule": rule_stats(rule, episodes, max_windows),
            "as_reported": rule_stats(SelectiveRule(), episodes, max_windows)}


@dataclass
class StudyArgs:
    """`python -m worldstep.fidelity.trust_study`'s flags."""

    run: str = flag("a fidelity run folder (its records/; a --continue-windows study for persistence)",
                    positional=True)
    out: str = flag("folder for trust.json and rule.json")
    export: bool = flag("also write the model episodes to OUT/episodes.jsonl.gz", default=False)
    max_windows: int = flag("windows a claim may come by (the run's)", default=16, type=int_at_least(1))
    trained_horizon: int = flag("windows the model trained on", default=TRAINED_HORIZON, type=int_at_least(1))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_flags(StudyArgs, argv, prog="python -m worldstep.fidelity.trust_study", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    outcomes = model_outcomes(Path(args.run))
    episodes = study_episodes(outcomes, args.trained_horizon)
    rule, table, met = fit(episodes, args.max_windows)
    as_reported = rule_stats(SelectiveRule(), episodes, args.max_windows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"run": str(args.run), "episodes": len(episodes), "seeds": sorted({o.episode.seed for o in outcomes}),
              "max_windows": args.max_windows,
              "trained_horizon": args.trained_horizon, "lost_block": lost_block_counts(outcomes),
              "fit": f"most real claims with precision Wilson low >= {MIN_PRECISION_LOW}; if none: the highest "
              f"Wilson low among rules with coverage >= {MIN_COVERAGE}", "fit_reached_precision_floor": met,
              "as_reported": as_reported,
              "named": {k: rule_stats(r, episodes, args.max_windows) for k, r in NAMED.items()},
              "frozen_rule": None if rule is None else rule_stats(rule, episodes, args.max_windows),
              "frontier": frontier(table), "grid_rules": len(table)}
    if args.export:
        export(outcomes, out / "episodes.jsonl.gz")
    (out / "trust.json").write_text(json.dumps(result, indent=1))
    if rule is not None:
        (out / "rule.json").write_text(json.dumps({**rule.to_dict(), "sha256": rule.sha256}, indent=1))
    return result


if __name__ == "__main__":
    main()
