"""`python -m worldstep.fidelity.compare BASE=RUN NAME=RUN ...`: choosing weights on the validation range.

Each RUN is a fidelity report folder (`report.json` and `records/`), all made on the same split and seeds. The
table puts the three figures a choice goes by side by side, each with its 95% interval: strict false success
(lower is better), the precision of the model's successes and the imagined-vs-replayed candidate-cost Spearman at
window 1 (higher is better), with the ranking figures beside them for reading only. A candidate is better than
the base on a figure only where the two intervals do not overlap; it ships only when it is better on one of the
three and worse on none ("better figure by figure"). `--outcomes DIR` writes each run's per-episode outcomes as
CSV (no actions, no detections: a few kB where `records/` is MBs), the records a choice is committed with.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..flags import flag, parse_flags

# (key, label, higher is better): the figures a choice goes by
DECIDING = (("false_success", "strict false success, 8 graded policies", False),
            ("precision", "precision of the model's successes", True),
            ("cost_spearman_w1", "imagined vs replayed cost Spearman, window 1", True))
# read beside them, deciding nothing
READ_ONLY = (("spearman", "policy ranking Spearman", True), ("mae", "mean abs success-rate error", False),
             ("vanish_w16", "object vanish, last window", False), ("psnr_w16", "open-loop PSNR dB, last window", True))
EPISODE_COLUMNS = ("world", "policy", "seed", "success", "replay_success", "windows", "stop")
PLANNING_COLUMNS = ("observe", "policy", "seed", "model_success", "sim_success", "windows", "stop")


@dataclass(frozen=True)
class Figure:
    value: float | None
    low: float | None
    high: float | None

    def __str__(self) -> str:
        if self.value is None:
            return "n/a"
        if self.low is None or self.high is None:
            return f"{self.value:.3f}"
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def _figure(entry: dict[str, Any]) -> Figure:
    low, high = entry["ci95"]
    return Figure(entry["value"], low, high)


def figures(report: dict[str, Any]) -> dict[str, Figure]:
    """The deciding and read-only figures of one report (n/a for a section it did not run)."""
    t, none = report["targets"], Figure(None, None, None)
    ol = report.get("open_loop", {}).get("series", {}).get("kv")
    out = {"false_success": _figure(t["false_success_rate_without_floor"]),
           "precision": _figure(t["precision_without_floor"]),
           "spearman": _figure(t["spearman_without_floor"]),
           "mae": _figure(t["mean_abs_rate_error_without_floor"]),
           "vanish_w16": _figure(t["object_vanish_rate_last_window"]) if "object_vanish_rate_last_window" in t
           else none,
           "psnr_w16": Figure(ol["psnr_db"]["value"][-1], ol["psnr_db"]["low"][-1], ol["psnr_db"]["high"][-1])
           if ol else none}
    ranks = report.get("planning", {}).get("model", {}).get("cost_rank_correlation")
    out["cost_spearman_w1"] = Figure(ranks["value"][0], *ranks["ci95"][0]) if ranks and ranks["value"] else none
    return out


def verdict(candidate: Figure, base: Figure, higher_is_better: bool) -> str:
    """"better", "worse" or "overlap" (also when either figure is undefined): by the intervals, never the points."""
    if None in (candidate.low, candidate.high, base.low, base.high):
        return "overlap"
    if candidate.low > base.high:
        return "better" if higher_is_better else "worse"
    if candidate.high < base.low:
        return "worse" if higher_is_better else "better"
    return "overlap"


def ships(verdicts: list[str]) -> bool:
    """Better on at least one deciding figure and worse on none."""
    return "better" in verdicts and "worse" not in verdicts


def _check_comparable(reports: dict[str, dict[str, Any]]) -> None:
    (base_name, base), *others = reports.items()
    for name, report in others:
        for key in ("split", "episode_seeds"):
            if report[key] != base[key]:
                raise ValueError(f"{name}={report[key]!r} ({key}) is invalid beside {base_name}={base[key]!r}: "
                                 "compare runs of one split and one seed range")


def table(reports: dict[str, dict[str, Any]]) -> str:
    """Markdown: one column per run, the first is the base; verdicts and the shipping decision against it."""
    _check_comparable(reports)
    names = list(reports)
    figs = {name: figures(r) for name, r in reports.items()}
    base = figs[names[0]]
    rows = ["| figure (95% interval) | " + " | ".join(f"`{n}`" for n in names) + " |",
            "|---" * (len(names) + 1) + "|"]
    decisions: dict[str, list[str]] = {n: [] for n in names[1:]}
    for key, label, higher in DECIDING + READ_ONLY:
        cells = [str(base[key])]
        for name in names[1:]:
            v = verdict(figs[name][key], base[key], higher)
            if (key, label, higher) in DECIDING:
                decisions[name].append(v)
            cells.append(f"{figs[name][key]} ({v})")
        rows.append(f"| {label}{'' if (key, label, higher) in DECIDING else ' (read only)'} | "
                    + " | ".join(cells) + " |")
    rows.append("| ships instead of the base | – | "
                + " | ".join("**yes**" if ships(decisions[n]) else "no" for n in names[1:]) + " |")
    return "\n".join(rows)


def write_outcomes(run: Path, name: str, out: Path) -> list[Path]:
    """`out/NAME.episodes.csv` and `out/NAME.planning.csv`: one row per episode of the run's records."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, columns in (("episodes", EPISODE_COLUMNS), ("planning", PLANNING_COLUMNS)):
        path = out / f"{name}.{kind}.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            for record in _records(run / "records" / f"{kind}.jsonl"):
                writer.writerow(["" if record.get(c) is None else record.get(c) for c in columns])
        written.append(path)
    return written


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """One record per line, read as it goes (an episodes file holds every chunk and detection: MBs)."""
    if not path.is_file():
        raise ValueError(f"records={str(path)!r} is invalid: the file does not exist (a fidelity run writes it)")
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


@dataclass
class CompareArgs:
    runs: list[str] = flag("NAME=RUN_FOLDER (a fidelity report folder), the base first", positional=True)
    outcomes: str | None = flag("write each run's per-episode outcomes (CSV) to this folder", default=None)


def parse_runs(specs: list[str]) -> dict[str, Path]:
    runs: dict[str, Path] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise ValueError(f"run={spec!r} is invalid; allowed: NAME=FOLDER (a fidelity report folder)")
        if name in runs:
            raise ValueError(f"run={spec!r} is invalid: the name {name!r} is given twice")
        if not (Path(folder) / "report.json").is_file():
            raise ValueError(f"run={spec!r} is invalid: {folder}/report.json does not exist")
        runs[name] = Path(folder)
    if len(runs) < 2:
        raise ValueError(f"runs={specs!r} is invalid; allowed: a base and at least one candidate")
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_flags(CompareArgs, argv, prog="python -m worldstep.fidelity.compare", description=__doc__)
    runs = parse_runs(args.runs)
    print(table({name: json.loads((folder / "report.json").read_text()) for name, folder in runs.items()}))
    if args.outcomes is not None:
        for name, folder in runs.items():
            write_outcomes(folder, name, Path(args.outcomes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
