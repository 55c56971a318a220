"""`python -m worldstep.fidelity.summary REPORT.json`: the report's figures as Markdown tables.

The docs paste this output, so every figure they state comes from a `report.json` and this command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..flags import flag, parse_flags

WINDOWS = (1, 4, 8, 12, 16)


def _ci(entry: dict[str, Any], digits: int = 2) -> str:
    value, (low, high) = entry["value"], entry["ci95"]
    if value is None:
        return "n/a"
    if low is None or high is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _series_cell(series: dict[str, list], w: int, digits: int) -> str:
    value, low, high = series["value"][w], series["low"][w], series["high"][w]
    if value is None:
        return "n/a"
    if low is None or high is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def targets_table(report: dict[str, Any]) -> str:
    rows = ["| target | value [95% interval] | met (on the interval) |", "|---|---|---|"]
    for name, t in report["targets"].items():
        if name == "moved_block_error_below_copy_vae_every_window":
            below = t["windows_with_ci95_below_zero"]
            value = (f"difference < 0 at {sum(v is not None and v < 0 for v in t['value'])}/{len(t['value'])} windows; "
                     f"interval below 0 at windows {below if below else 'none'}")
        else:
            value = str(t["value"]) if isinstance(t["value"], int) else _ci(t, 3)
            if "coverage" in t:
                value += f" at coverage {_ci(t['coverage'], 3)} ({t['real']} real of {t['claimed']} claimed)"
        verdict = "reported" if t["met"] is None else ("yes" if t["met"] else "no")
        if "paired_seed" in t:
            value += f" (paired-seed rule: {_ci(t['paired_seed'], 3)})"
        rows.append(f"| {name} ({t['target']}) | {value} | {verdict} |")
    return "\n".join(rows)


def open_loop_table(report: dict[str, Any]) -> str:
    ol = report["open_loop"]
    windows = [w for w in WINDOWS if w <= ol["windows"]]
    head = "| series, metric | " + " | ".join(f"window {w}" for w in windows) + " |"
    rows = [head, "|---" * (len(windows) + 1) + "|"]
    if "changed_pixel_share" in ol:
        rows.append("| changed pixels (simulator vs its first frame) | "
                    + " | ".join(f"{ol['changed_pixel_share'][w - 1]:.1%}" for w in windows) + " |")
    metrics = (("psnr_db", "PSNR dB", 1), ("ssim", "SSIM", 3), ("object_vanish_rate", "object-vanish rate", 2),
               ("block_vanish_rate", "block-vanish rate", 2), ("moved_block_error_px", "moved-block error px", 1))
    for key, label, digits in metrics:
        for name in ("kv", "kv_shuffled_actions", "copy_first_frame_vae", "vae_reconstruction_ceiling"):
            cells = [_series_cell(ol["series"][name][key], w - 1, digits) for w in windows]
            rows.append(f"| {name}, {label} | " + " | ".join(cells) + " |")
    diff = ol["moved_block_error_kv_minus_copy_vae"]
    rows.append("| kv minus copy_first_frame_vae, moved-block error px | "
                + " | ".join(_series_cell(diff, w - 1, 1) for w in windows) + " |")
    frames = ol["series"]["kv"]["moved_block_frames"]
    rows.append("| frames with a moved block | " + " | ".join(str(frames[w - 1]) for w in windows) + " |")
    return "\n".join(rows)


def policy_table(report: dict[str, Any]) -> str:
    p = report["policies"]
    rows = ["| policy | simulator success | model success | bias | model actions replayed in the simulator | "
            "confusion (model/sim: s/s, s/f, f/s, f/f) |", "|---|---|---|---|---|---|"]
    for q in p["per_policy"]:
        c = q["confusion"]
        counts = (f"{c['model_success_sim_success']}, {c['model_success_sim_failure']}, "
                  f"{c['model_failure_sim_success']}, {c['model_failure_sim_failure']}")
        rows.append(f"| {q['policy']} | {_ci(q['sim_success'])} | {_ci(q['model_success'])} | {_ci(q['bias'])} | "
                    f"{_ci(q['replay_success'])} | {counts} |")
    rows += ["", "Confusion, false and missed success by the strict rule: the model episode's own chunks replayed "
                 "in the simulator; the paired-seed rule (the simulator's own episode from the same seed) beside.",
             "", "| group | Spearman | Pearson | mean abs rate error | false-success rate | missed-success rate | "
                 "false-success rate, paired seed | selection regret |", "|---|---|---|---|---|---|---|---|"]
    for group in ("all", "without_floor"):
        g = p[group]
        paired = _ci(g["paired_seed"]["false_success_rate"]) if "paired_seed" in g else "n/a"
        rows.append(f"| {group} ({g['policies']} policies) | {_ci(g['spearman'])} | {_ci(g['pearson'])} | "
                    f"{_ci(g['mean_abs_rate_error'])} | {_ci(g['false_success_rate'])} | "
                    f"{_ci(g['missed_success_rate'])} | {paired} | {_ci(g['selection_regret'])} |")
    rows.append(f"\nThe model rates best: {', '.join(p['model_pick'])}; the simulator: {', '.join(p['sim_best'])}.")
    if "false_success_hazard" in p:
        rows += ["", decisions_table(p)]
    return "\n".join(rows)


def decisions_table(p: dict[str, Any]) -> str:
    """Precision, MMRV, the per-window hazard of false success and the block-lost rate (`fidelity.decisions`)."""
    rows = ["| group | precision of the model's successes (confirmed / reported) | MMRV |", "|---|---|---|"]
    for group in ("all", "without_floor"):
        g = p[group]
        if g is None or "precision" not in g:
            continue
        prec = g["precision"]
        rows.append(f"| {group} | {_ci(prec)} ({prec['confirmed']} / {prec['reported_successes']}) | "
                    f"{_ci(g['mmrv'])} |")
    lost = p["block_lost_rate"]
    rows += ["", "| windows | false successes | windows at risk | false successes per window at risk |",
             "|---|---|---|---|"]
    rows += [f"| {h['windows'][0]}-{h['windows'][1]} | {h['false_successes']} | {h['windows_at_risk']} | "
             f"{_ci(h, 3)} |" for h in p["false_success_hazard"]]
    rows.append(f"\nBlock lost (the model's frames drop it while the replay shows it): {_ci(lost)} "
                f"({lost['lost']} of {lost['episodes']} graded-policy episodes).")
    return "\n".join(rows)


def selective_table(p: dict[str, Any]) -> str:
    """The frozen rule's claims beside the model's own (`--rule`; Wilson 95% intervals)."""
    rows = ["| claims | claimed | real | precision | coverage of the replay-confirmed successes | recall | "
            "strict false success |", "|---|---|---|---|---|---|---|"]
    for label, key in (("at the rule", "at_rule"), ("as reported (no rule)", "as_reported")):
        q = p["selective"][key]
        wilson = {k: {"value": q[k], "ci95": q[f"{k}_wilson95"]}
                  for k in ("precision", "coverage", "strict_false_success")}
        rows.append(f"| {label} | {q['claimed']} | {q['real']} | {_ci(wilson['precision'])} | "
                    f"{_ci(wilson['coverage'])} | {'n/a' if q['recall'] is None else format(q['recall'], '.2f')} | "
                    f"{_ci(wilson['strict_false_success'], 3)} |")
    rule = p["selective"]["at_rule"]
    rows.append(f"\nRule {rule['rule_sha256'][:12]}: {rule['rule']}.")
    return "\n".join(rows)


def corrected_table(p: dict[str, Any]) -> str:
    """Prediction-powered rates per policy (`--paired n`) against the simulator's."""
    c = p["corrected"]
    rows = [f"Each policy's first {c['paired']} episodes run in both worlds, its other {c['model_only']} in the model "
            "only; the simulator's rate over all of them.", "",
            "| policy | corrected rate [95%] | model rate (all) | simulator rate | interval covers it |",
            "|---|---|---|---|---|"]
    for name, q in c["policies"].items():
        rows.append(f"| {name} | {_ci(q)} | {q['model_rate_all']:.2f} | {q['sim_rate']:.2f} | "
                    f"{'yes' if q['covers_sim_rate'] else 'no'} |")
    w = c["without_floor"]
    error = _ci({"value": w["mean_abs_error"], "ci95": w.get("mean_abs_error_ci95", [None, None])}, 3)
    rho = _ci({"value": w["spearman"], "ci95": w.get("spearman_ci95", [None, None])})
    rows += ["", "| rates (graded policies) | mean abs error | Spearman | intervals covering |", "|---|---|---|---|",
             f"| corrected | {error} | {rho} | {w['intervals_covering']} of {w['policies']} |",
             f"| the model's own | {w['model_only_mean_abs_error']:.3f} | {w['model_only_spearman']:.2f} | n/a |"]
    return "\n".join(rows)


def planning_table(report: dict[str, Any]) -> str:
    plan = report.get("planning") or {}
    if not plan:
        return "(no planning section)"
    rows = [f"Base policy {plan['base_policy']}, {plan['candidates']} candidates per window, {plan['episodes']} "
            f"episodes of <= {plan['max_windows']} windows.", "",
            "| loop | planner, simulator success | base policy on the simulator | lift | base policy in the same "
            "loop | lift over it |", "|---|---|---|---|---|---|"]
    for observe in ("model", "simulator"):
        if observe not in plan:
            continue
        q = plan[observe]
        loop = q.get("base_model_loop_sim_success")
        over = q.get("lift_over_model_loop_base")
        rows.append(f"| {observe} | {_ci(q['planner_sim_success'])} | {_ci(q['base_sim_success'])} | {_ci(q['lift'])} "
                    f"| {_ci(loop) if loop else 'n/a'} | {_ci(over) if over else 'n/a'} |")
    for k, q in plan.get("anchored", {}).items():
        rows.append(f"| model, re-anchored on the simulator every {k} windows | {_ci(q['planner_sim_success'])} | "
                    f"{_ci(q['base_sim_success'])} | {_ci(q['lift'])} | n/a | n/a |")
    counts = plan.get("model", {}).get("by_confirm_windows")
    if counts:
        rows += ["", "The same model-loop episodes stopped at each confirmation count k (from the run's per-window "
                     "beliefs; the loop's choices never depend on k):", "",
                 "| k | stopped on believed success | of those, not a success in the simulator | mean windows | "
                 "planner, simulator success | lift |", "|---|---|---|---|---|---|"]
        rows += [f"| {k} | {q['believed_stops']} | {q['believed_stops_not_confirmed']} | {q['mean_windows']:.1f} | "
                 f"{_ci(q['planner_sim_success'])} | {_ci(q['lift'])} |" for k, q in counts.items()]
    if "model" in plan and "cost_rank_correlation" in plan["model"]:
        ranks = plan["model"]["cost_rank_correlation"]["value"]
        rows += ["", "Spearman between imagined and simulator-replayed candidate costs, model loop, per window: "
                 + ", ".join("n/a" if v is None else f"{v:.2f}" for v in ranks)]
    return "\n".join(rows)


def render(report: dict[str, Any]) -> str:
    parts = [f"Split `{report['split']}`, episode seeds {report['episode_seeds'][0]}..{report['episode_seeds'][1]}, "
             f"checkpoint `{report['checkpoint']}`, {report['seconds'] / 60:.0f} min.", "", "### Targets", "",
             targets_table(report)]
    if "open_loop" in report:
        parts += ["", "### Open loop (mean over clips [95% interval])", "", open_loop_table(report)]
    if "policies" in report:
        parts += ["", "### Policies", "", policy_table(report)]
        if "selective" in report["policies"]:
            parts += ["", "### The frozen rule's claims", "", selective_table(report["policies"])]
        if "corrected" in report["policies"]:
            parts += ["", "### Prediction-powered rates", "", corrected_table(report["policies"])]
    if "planning" in report:
        parts += ["", "### Planning", "", planning_table(report)]
    return "\n".join(parts) + "\n"


@dataclass
class SummaryArgs:
    report: str = flag("a report.json written by worldstep fidelity", positional=True)


def main(argv: list[str] | None = None) -> str:
    args = parse_flags(SummaryArgs, argv, prog="python -m worldstep.fidelity.summary", description=__doc__)
    text = render(json.loads(Path(args.report).read_text()))
    print(text)
    return text


if __name__ == "__main__":
    main()
