"""`python -m worldstep.fidelity`: does the world model tell the truth about the pusher simulator?

Every number carries a 95% bootstrap interval and comes from one seed range (`--split`): `validation`
for development, `test` (sealed) once, for the figures a report states (see `worldstep.envs.push_seeds`).

1. Open loop: held-out clips through the simulator and the model, scored per window (PSNR, SSIM,
   object-vanish rate, block error on frames where the block moved) against controls: shuffled
   actions, the VAE-decoded first frame copied (the fair "nothing moves" control), the raw first
   frame copied, and the VAE round trip of the true clip (the ceiling of any rollout).
2. Policies: graded scripted policies in both worlds from the same starts: success rates, bias,
   confusion, false- and missed-success rates, ranking (with and without the floor policies) and
   the regret of picking the best policy by the model.
3. Planning: `worldstep.planning`'s planner vs its base policy, judged in the simulator.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from worldstep.envs.push_policies import FLOOR, graded_policies
from worldstep.envs.push_seeds import SPLITS, split_range
from worldstep.envs.push_sim import PUSHER_EMBODIMENT

from ..flags import add_flags, flag, from_namespace
from ..outputs import json_safe
from ..recipes.open_loop import RolloutRecipe
from .corrected import corrected_section
from .journal import Journal, StretchSpent
from .lift import lift_summary
from .media import write_media
from .openloop import (
    FrameScores,
    HeldOut,
    changed_pixel_share,
    held_out,
    moved_error_difference,
    score_frames,
    series,
    summarize,
)
from .provenance import provenance
from .ranking import outcome_table, policy_report
from .records import Records, write_records
from .rollouts import sim_episodes
from .tasks import EpisodesTask, OpenLoopTask, PlannerTask, ReconstructTask, run_tasks
from .trust_study import load_rule, selective_section

_PRESETS = {
    "small": {"clips": 2, "windows": 2, "episodes": 2, "policy_windows": 2, "num_steps": 1, "video_clips": 1,
              "plan_episodes": 2, "candidates": 2, "plan_anchor": [2]},
    "full": {"clips": 64, "windows": 16, "episodes": 50, "policy_windows": 16, "num_steps": 4, "video_clips": 3,
             "plan_episodes": 50, "candidates": 8, "plan_anchor": [1, 2, 4, 8, 16]},
}
TINY_64 = {  # the embedded tiny architecture at 64x64, for `--budget small` without a checkpoint
    "transformer": {"hidden_size": 32, "intermediate_size": 64, "head_dim": 16, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "num_hidden_layers": 2, "latent_channel": 4, "latent_patch_size": 2,
                    "patch_latent_dim": 16, "vocab_size": 128, "rope_axes_dim": [4, 2, 2], "hidden_act": "relu2",
                    "qk_norm_for_text": False, "use_und_k_norm_for_gen": True, "action_gen": True, "action_dim": 16,
                    "num_embodiment_domains": 32, "base_fps": 24},
    "vae": {"base_dim": 8, "decoder_base_dim": 8, "z_dim": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
            "temperal_downsample": [False, True, True], "is_residual": True, "in_channels": 12, "out_channels": 12,
            "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4},
    "height": 64, "width": 64, "fps": 24,
}
TARGETS = {"spearman": 0.9, "spearman_low": 0.7, "mean_abs_rate_error": 0.10, "false_success_rate": 0.05,
           "false_success_rate_high": 0.10, "object_vanish_rate_last_window": 0.10, "precision": 0.95,
           "precision_low": 0.90, "selective_coverage": 0.30, "corrected_mean_abs_error": 0.08,
           "corrected_covering_share": 7 / 8}
OBSERVE_CHOICES = ("model", "simulator")
SECTIONS = ("openloop", "policies", "planning")


def _preset(name: str) -> Any:
    return flag(f"override the preset's {name}", default=None)


@dataclass
class FidelityArgs:
    """The report's arguments, one flag each (``worldstep.flags``); ``report.json`` holds them as ``args``."""

    checkpoint: str | None = flag("diffusers-layout folder (default with --budget small: a tiny random one)",
                                  default=None)
    out: str = flag("report folder (JSON, PNGs, mp4)", default="runs/fidelity")
    split: str = flag("seed range: validation (development), test (SEALED: once, for reported figures), or "
                      "test_read .. test_read_4 (earlier sealed ranges, each read once already: "
                      "reproduce their reports)", default="validation", choices=tuple(SPLITS))
    budget: str = flag("preset sizes below", default="full", choices=sorted(_PRESETS))
    clips: int | None = _preset("clips")
    windows: int | None = _preset("windows")
    episodes: int | None = _preset("episodes")
    policy_windows: int | None = _preset("policy_windows")
    num_steps: int | None = _preset("num_steps")
    video_clips: int | None = _preset("video_clips")
    plan_episodes: int | None = _preset("plan_episodes")
    candidates: int | None = _preset("candidates")
    base_policy: str = flag("graded policy the planner proposes from", default="noisy0.8")
    plan_observe: list[str] = flag("planner runs, comma-separated: model (decisions in imagination, simulator "
                                   "replays), simulator (MPC re-anchored on the simulator's frames each window); "
                                   "empty: none", default_factory=lambda: list(OBSERVE_CHOICES))
    plan_anchor: list[int] | None = flag("model-loop planner runs re-anchored on the simulator every k windows, "
                                         "comma-separated (empty: none; default: the preset's)", default=None)
    plan_horizon: int = flag("windows a planner candidate imagines", default=2)
    plan_forks: int = flag("forks (diffusion noises) per planner candidate", default=2)
    confirm_windows: int = flag("a model-loop planner stops once its frames show success this many windows in a "
                                "row", default=2)
    context_frames: int = flag("rollout context_frames (the model's config)", default=4)
    flow_shift: float = flag("rollout flow_shift", default=5.0)
    threads: int = flag("torch threads per process", default=1)
    workers: int = flag("processes for model work (1: inline)", default=1)
    sections: list[str] = flag(f"comma-separated subset of {','.join(SECTIONS)} (development runs; a report runs "
                               "all)", default_factory=lambda: list(SECTIONS))
    resume: bool = flag("continue the run in --out: tasks its journal holds are not run again (refused if an "
                        "argument that decides the results changed)", default=False)
    stop_after_minutes: float = flag("wall time of this stretch: no task starts after it, what finished is kept "
                                     "for --resume, and no report is written (0: run to the end)", default=0.0)
    continue_windows: int = flag("trust study: model episodes go on this many windows past their first success "
                                 "(recorded as `continued`; the outcome stays the stop's)", default=0)
    rule: str | None = flag("a frozen selective rule (rule.json of `worldstep.fidelity.trust_study`): the policies "
                             "section adds the rule's claims, the model-loop planner stops on them (the selective "
                             "stop); its sha256 goes into the provenance", default=None)
    paired: int = flag("prediction-powered rates: each policy's first n episodes are paired (model and simulator "
                       "from the same start), the rest model-only (0: none)", default=0)
    agreement_forks: int = flag("trust study: forks of each model episode's session with other noise seeds, "
                                "stepped every window (0: none)", default=0)


def parse_args(argv: list[str] | None) -> FidelityArgs:
    p = argparse.ArgumentParser(prog="python -m worldstep.fidelity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, FidelityArgs)
    ns = p.parse_args(argv)
    preset = {k: list(v) if isinstance(v, list) else v for k, v in _PRESETS[ns.budget].items()
              if getattr(ns, k) is None}  # the flags given override the preset
    args = from_namespace(FidelityArgs, ns, **preset)
    if args.checkpoint is None and args.budget != "small":
        p.error("--checkpoint is required unless --budget small")
    if any(k < 1 for k in args.plan_anchor):
        p.error(f"--plan-anchor={','.join(map(str, args.plan_anchor))} is invalid; allowed: comma-separated ints >= 1")
    for name in ("clips", "windows", "episodes", "policy_windows", "num_steps", "candidates", "workers", "threads",
                 "plan_horizon", "plan_forks", "confirm_windows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid; allowed: >= 1")
    if args.rule is not None:
        try:
            load_rule(args.rule)
        except (OSError, ValueError, TypeError) as err:
            p.error(f"--rule={args.rule} is invalid ({err}); allowed: a rule.json written by "
                    "worldstep.fidelity.trust_study")
    if args.paired and not 2 <= args.paired < args.episodes:
        p.error(f"--paired={args.paired} is invalid; allowed: 0, or 2 <= n < --episodes ({args.episodes})")
    for name, high in (("continue_windows", None), ("agreement_forks", 98), ("stop_after_minutes", None)):
        value = getattr(args, name)
        if value < 0 or (high is not None and value > high):
            p.error(f"--{name.replace('_', '-')}={value} is invalid; allowed: >= 0"
                    + ("" if high is None else f" and <= {high}"))
    if not 0 <= args.plan_episodes <= args.episodes:
        p.error(f"--plan-episodes={args.plan_episodes} is invalid; allowed: 0..--episodes ({args.episodes}), "
                "the planner is paired with the policies' episodes")
    names = [q.name for q in graded_policies()]
    if args.base_policy not in names:
        p.error(f"--base-policy={args.base_policy!r} is invalid; allowed: one of {names}")
    if not args.sections or any(x not in SECTIONS for x in args.sections):
        p.error(f"--sections={','.join(args.sections)} is invalid; allowed: a non-empty subset of {SECTIONS}")
    if "planning" in args.sections and "policies" not in args.sections:
        p.error("--sections with planning needs policies (the planner is paired with its base policy's episodes)")
    bad = [o for o in args.plan_observe if o not in OBSERVE_CHOICES]
    if bad:
        p.error(f"--plan-observe={','.join(bad)} is invalid; allowed: a comma-separated subset of {OBSERVE_CHOICES}")
    return args


def _resolve(args: FidelityArgs, out: Path) -> tuple[Path, RolloutRecipe]:
    """The checkpoint folder (a tiny random one is built for `--budget small`) and the rollout recipe."""
    from worldstep.engine.config import RolloutKnobs
    from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint

    path = Path(args.checkpoint) if args.checkpoint else out / "tiny-random-checkpoint"
    if args.checkpoint is None and not (path / "model_index.json").exists():
        build_checkpoint(path, TINY_64, seed=0)
        meta = json.loads((path / "worldstep.json").read_text())  # run it with the pusher env (its simulator)
        (path / "worldstep.json").write_text(json.dumps({**meta, "config": "pusher", "domain_id": 0,
                                                         "builtin_embodiments": False,
                                                         "embodiments": [PUSHER_EMBODIMENT]}))
    meta = json.loads((path / "worldstep.json").read_text()) if (path / "worldstep.json").exists() else {}
    knobs = RolloutKnobs(num_steps=args.num_steps, context_frames=args.context_frames, flow_shift=args.flow_shift)
    recipe = RolloutRecipe(prompt=meta.get("prompt", "A robot pushes a block to the goal."),
                           domain_id=int(meta.get("domain_id", 0)), knobs=knobs)
    return path, recipe


# --- tasks ---------------------------------------------------------------------------------------


def _open_loop_tasks(held: HeldOut, group: int = 16) -> list:
    """True and shuffled actions in groups of clips, then the VAE round trip of the true clips."""
    shuffled = np.roll(held.actions, 1, axis=0)  # each clip gets another clip's actions
    tasks = []
    for actions in (held.actions, shuffled):
        for s in range(0, len(held.seeds), group):
            tasks.append(OpenLoopTask(held.first[s:s + group], actions[s:s + group], tuple(held.seeds[s:s + group])))
    return [*tasks, ReconstructTask(np.concatenate([held.first[:, None], held.truth], axis=1))]


def _episode_tasks(args: FidelityArgs, seeds: list[int], num_policies: int) -> list:
    """One task per model episode, so each is saved as it finishes (`Journal`); seed by seed, so a stretch
    cut short has every policy on the same starts."""
    return [EpisodesTask((p,), (s,), args.policy_windows, args.continue_windows, args.agreement_forks)
            for s in seeds for p in range(num_policies)]


def _planner_runs(args: FidelityArgs) -> list[tuple[str, int | None]]:
    """(observe, anchor_every) of every planner run: the plain loops, then the re-anchoring sweep."""
    return [(o, None) for o in args.plan_observe] + [("model", k) for k in args.plan_anchor]


def _planner_tasks(args: FidelityArgs, seeds: list[int], group: int = 10) -> list:
    """With `--rule`, the model loops stop on the rule's claim (the selective stop), the simulator loop as before."""
    rule = None if args.rule is None else load_rule(args.rule)
    return [PlannerTask(args.base_policy, args.candidates, tuple(seeds[s:s + group]), args.policy_windows, observe,
                        anchor, args.plan_horizon, args.plan_forks, args.confirm_windows,
                        rule if observe == "model" else None)
            for observe, anchor in _planner_runs(args) for s in range(0, len(seeds), group)]


# --- sections ------------------------------------------------------------------------------------


def _open_loop_scores(outputs: list, held: HeldOut) -> tuple[dict[str, FrameScores], dict[str, np.ndarray]]:
    """Per-frame scores of each series, and the frames (for the media)."""
    half = (len(outputs) - 1) // 2
    kv = np.concatenate([o[0] for o in outputs[:half]])
    decoded_first = np.concatenate([o[1] for o in outputs[:half]])
    frames = held.truth.shape[1]
    preds = {
        "kv": kv,
        "kv_shuffled_actions": np.concatenate([o[0] for o in outputs[half:2 * half]]),
        "copy_first_frame_vae": np.repeat(decoded_first[:, None], frames, axis=1),
        "copy_first_frame": np.repeat(held.first[:, None], frames, axis=1),
        "vae_reconstruction_ceiling": outputs[-1],
    }
    return {name: score_frames(pred, held) for name, pred in preds.items()}, {"truth": held.truth, **preds}


def _open_loop_section(scores: dict[str, FrameScores], held: HeldOut, chunk: int) -> dict[str, Any]:
    true_p, shuf_p = scores["kv"].psnr.mean(axis=1), scores["kv_shuffled_actions"].psnr.mean(axis=1)
    diff = moved_error_difference(scores["kv"], scores["copy_first_frame_vae"], chunk)
    return {
        "clips": len(held.seeds), "windows": held.truth.shape[1] // chunk, "seeds": [held.seeds[0], held.seeds[-1]],
        "true_beats_shuffled_share": float((true_p > shuf_p).mean()),
        "changed_pixel_share": changed_pixel_share(held, chunk),
        "series": {name: summarize(s, chunk, seed=k) for k, (name, s) in enumerate(scores.items())},
        "moved_block_error_kv_minus_copy_vae": series(diff),
    }


def _policy_section(episodes: list, seeds: list[int], args: FidelityArgs, chunk: int) -> dict[str, Any]:
    policies = graded_policies(chunk)
    sim = [r for r in episodes if r.replay_success is None]
    model = [r for r in episodes if r.replay_success is not None]
    section = policy_report(sim, model, [p.name for p in policies], FLOOR, seeds, max_windows=args.policy_windows)
    section["max_windows"] = args.policy_windows
    if args.rule is not None:
        from ..trust.signals import trained_horizon_for

        horizon = trained_horizon_for(Path(args.checkpoint)) if args.checkpoint else None
        section["selective"] = selective_section(model, load_rule(args.rule), args.policy_windows, horizon)
    if args.paired:
        section["corrected"] = corrected_section(sim, model, [p.name for p in policies], FLOOR, seeds, args.paired)
    return section


def _planning_section(results: list, episodes: list, seeds: list[int], args: FidelityArgs) -> dict[str, Any]:
    sim_runs = [r for r in episodes if r.replay_success is None]
    model_runs = [r for r in episodes if r.replay_success is not None]
    base_sim = outcome_table(sim_runs, [args.base_policy], seeds)[0]
    base_loop = outcome_table(model_runs, [args.base_policy], seeds, "replay_success")[0]
    section = {"base_policy": args.base_policy, "candidates": args.candidates, "episodes": len(seeds),
               "max_windows": args.policy_windows, "horizon": args.plan_horizon, "forks": args.plan_forks,
               "confirm_windows": args.confirm_windows, "anchored": {},
               "stop_rule_sha256": _stop_rule_sha256(results)}
    for observe, anchor in _planner_runs(args):
        by_seed = {r.episode.seed: r for r in results if r.observe == observe and r.anchor_every == anchor}
        planner = np.array([by_seed[s].sim_success for s in seeds])
        entry = lift_summary(planner, base_sim, base_loop if observe == "model" else None)
        if observe == "model":
            entry["planner_model_success"] = float(np.mean([by_seed[s].model_success for s in seeds]))
            entry["stops"] = {k: sum(by_seed[s].stop == k for s in seeds) for k in
                              sorted({by_seed[s].stop for s in seeds})}
            if anchor is None and all(by_seed[s].window_success for s in seeds):  # records before it lack them
                entry["by_confirm_windows"] = _by_confirm_windows([by_seed[s] for s in seeds], args.confirm_windows,
                                                                  base_sim)
        entry["cost_rank_correlation"] = _rank_by_window(
            [by_seed[s].cost_rank_correlation for s in seeds], args.policy_windows)
        if anchor is None:
            section[observe] = entry
        else:
            section["anchored"][str(anchor)] = entry
    return section


def _stop_rule_sha256(results: list) -> str | None:
    """The one rule the model loops stopped on (None: the streak alone); ValueError when they disagree."""
    hashes = {r.stop_rule_sha256 for r in results if r.observe == "model"}
    if len(hashes) > 1:
        raise ValueError(f"planner records stopped on {len(hashes)} rules ({sorted(map(str, hashes))}); allowed: one")
    return next(iter(hashes), None)


def _by_confirm_windows(results: list, confirm_windows: int, base_sim: np.ndarray) -> dict[str, Any]:
    """The same model-loop episodes stopped at every count k <= the run's (`ClosedLoopResult.stopped_at`: the
    loop's choices never depend on k, so one run gives each smaller count's stops exactly)."""
    out = {}
    for k in range(1, confirm_windows + 1):
        stops = [r.stopped_at(k) for r in results]
        believed = np.array([b for _, b, _ in stops])
        sim = np.array([s for _, _, s in stops])
        out[str(k)] = {"believed_stops": int(believed.sum()),
                       "believed_stops_not_confirmed": int((believed & ~sim).sum()),
                       "mean_windows": float(np.mean([w for w, _, _ in stops])), **lift_summary(sim, base_sim, None)}
    return out


def _rank_by_window(per_episode: list[list], windows: int) -> dict[str, list]:
    """Per window: the mean (over episodes that reached it with a defined value) Spearman between imagined and
    simulator-replayed candidate costs, with its 95% interval, and how many episodes it averages."""
    from ..measures.intervals import bootstrap

    out: dict[str, list] = {"value": [], "ci95": [], "episodes": []}
    for w in range(windows):
        values = np.array([e[w] for e in per_episode if len(e) > w and e[w] is not None], dtype=float)
        est = bootstrap(lambda i, v=values: float(v[i].mean()), len(values)) if len(values) else None
        out["value"].append(None if est is None else est.value)
        out["ci95"].append(None if est is None else [est.low, est.high])
        out["episodes"].append(len(values))
    return out


def _target(entry: dict[str, Any], rule: str, met: bool, **extra: Any) -> dict[str, Any]:
    return {**entry, "target": rule, "met": bool(met), **extra}


def _policy_targets(policies: dict[str, Any]) -> dict[str, Any]:
    """Each target judged on its 95% interval, never on the point value alone."""
    group = policies["without_floor"] or policies["all"]
    rho, mae, fsr = group["spearman"], group["mean_abs_rate_error"], group["false_success_rate"]
    prec = group["precision"]
    t = TARGETS
    return {
        "spearman_without_floor": _target(rho, f">= {t['spearman']} with ci95 low >= {t['spearman_low']}",
                                          rho["value"] >= t["spearman"] and rho["ci95"][0] >= t["spearman_low"]),
        "mean_abs_rate_error_without_floor": _target(mae, f"ci95 high <= {t['mean_abs_rate_error']}",
                                                     mae["ci95"][1] <= t["mean_abs_rate_error"]),
        "false_success_rate_without_floor": _target(
            fsr, f"strict rule (the model episode's own chunks replayed in the simulator): <= "
                 f"{t['false_success_rate']} with ci95 high <= {t['false_success_rate_high']}",
            fsr["value"] <= t["false_success_rate"] and fsr["ci95"][1] <= t["false_success_rate_high"],
            paired_seed=group["paired_seed"]["false_success_rate"]),
        "precision_without_floor": _target(
            prec, f"share of the model's successes its own chunks replayed confirm: >= {t['precision']} with ci95 "
                  f"low >= {t['precision_low']}",
            prec["value"] >= t["precision"] and prec["ci95"][0] >= t["precision_low"]),
    }


def _trust_targets(policies: dict[str, Any]) -> dict[str, Any]:
    """The frozen rule's selective precision and strict false success, and the prediction-powered rates' error,
    coverage and ranking: the same thresholds as the model's own figures, judged on their intervals."""
    t, out = TARGETS, {}
    if "selective" in policies:
        at = policies["selective"]["at_rule"]
        low, coverage = at["precision_wilson95"][0], at["coverage"]
        out["selective_precision_at_rule"] = _target(
            {"value": at["precision"], "ci95": at["precision_wilson95"]},
            f">= {t['precision']} with ci95 low >= {t['precision_low']} at coverage >= {t['selective_coverage']} of "
            f"the replay-confirmed successes (rule {at['rule_sha256'][:12]})",
            at["precision"] is not None and at["precision"] >= t["precision"] and low >= t["precision_low"]
            and coverage is not None and coverage >= t["selective_coverage"],
            coverage={"value": coverage, "ci95": at["coverage_wilson95"]}, claimed=at["claimed"], real=at["real"])
        fsr = at["strict_false_success"]
        out["strict_false_success_at_rule"] = _target(
            {"value": fsr, "ci95": at["strict_false_success_wilson95"]},
            f"<= {t['false_success_rate']} with ci95 high <= {t['false_success_rate_high']}",
            fsr is not None and fsr <= t["false_success_rate"]
            and at["strict_false_success_wilson95"][1] <= t["false_success_rate_high"])
    if "corrected" in policies:
        c = policies["corrected"]["without_floor"]
        n = policies["corrected"]["paired"]
        if "mean_abs_error_ci95" in c:  # reports before these intervals judge nothing here
            out["corrected_mean_abs_error"] = _target(
                {"value": c["mean_abs_error"], "ci95": c["mean_abs_error_ci95"]},
                f"prediction-powered rates, n = {n} paired: ci95 high <= {t['corrected_mean_abs_error']}",
                c["mean_abs_error_ci95"][1] <= t["corrected_mean_abs_error"])
            out["corrected_spearman"] = _target(
                {"value": c["spearman"], "ci95": c["spearman_ci95"]},
                f"prediction-powered rates: >= {t['spearman']} with ci95 low >= {t['spearman_low']}",
                c["spearman"] >= t["spearman"] and c["spearman_ci95"][0] >= t["spearman_low"])
        need = int(np.ceil(t["corrected_covering_share"] * c["policies"]))
        out["corrected_intervals_covering"] = _target(
            {"value": c["intervals_covering"], "ci95": [None, None]},
            f"the 95% intervals cover the simulator's rate for >= {need} of {c['policies']} policies",
            c["intervals_covering"] >= need)
    return out


def _open_loop_targets(open_loop: dict[str, Any]) -> dict[str, Any]:
    vanish = open_loop["series"]["kv"]["object_vanish_rate"]
    diff = open_loop["moved_block_error_kv_minus_copy_vae"]
    below = [i + 1 for i, h in enumerate(diff["high"]) if h is not None and np.isfinite(h) and h < 0]
    limit = TARGETS["object_vanish_rate_last_window"]
    return {
        "object_vanish_rate_last_window": _target({"value": vanish["value"][-1],
                                                   "ci95": [vanish["low"][-1], vanish["high"][-1]]},
                                                  f"ci95 high <= {limit}", vanish["high"][-1] <= limit),
        "moved_block_error_below_copy_vae_every_window": {
            "value": diff["value"], "target": "kv - copy_first_frame_vae: ci95 high < 0 at every window",
            "met": bool(len(below) == len(diff["value"])),
            "windows_without_moved_frames": [i + 1 for i, v in enumerate(diff["value"])
                                             if v is None or not np.isfinite(v)],
            "windows_with_ci95_below_zero": below},
    }


def _targets(open_loop: dict[str, Any] | None, policies: dict[str, Any] | None,
             planning: dict[str, Any]) -> dict[str, Any]:
    """The targets that the sections run can judge; `met` from each target's interval."""
    out = {}
    if policies is not None:
        out.update(_policy_targets(policies))
        out.update(_trust_targets(policies))
    if open_loop is not None:
        out.update(_open_loop_targets(open_loop))
    if "model" in planning:
        lift, rule = planning["model"]["lift"], planning.get("stop_rule_sha256")
        stop = f"stopping on rule {rule[:12]} (the selective stop)" if rule else "stopping on the streak"
        out["planning_lift_model_loop"] = _target(lift, f"ci95 low > 0, the model loop {stop}", lift["ci95"][0] > 0,
                                                  stop_rule_sha256=rule)
    if "simulator" in planning:  # reported beside, not a target
        out["planning_lift_mpc_on_simulator"] = {**planning["simulator"]["lift"], "target": "reported",
                                                 "met": None}
    return out


def sections(records: Records, args: FidelityArgs, chunk: int) -> dict[str, Any]:
    """Every figure of the report, from the run's records alone (`worldstep.fidelity.recompute` calls it too)."""
    report: dict[str, Any] = {}
    open_loop, policies, planning = None, None, {}
    if records.scores:
        held = held_out(records.clip_seeds, args.windows * chunk)
        open_loop = report["open_loop"] = _open_loop_section(records.scores, held, chunk)
    seeds = split_range(args.split).episode_seeds(args.episodes)
    if records.episodes:
        policies = report["policies"] = _policy_section(records.episodes, seeds, args, chunk)
        if records.plans and args.plan_observe:
            planning = report["planning"] = _planning_section(records.plans, records.episodes,
                                                              seeds[: args.plan_episodes], args)
    report["targets"] = _targets(open_loop, policies, planning)
    return json_safe(report)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the report and write `report.json`, PNG charts and a side-by-side mp4 into `--out`."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    path, recipe = _resolve(args, out)
    print(f"fidelity: {path} -> {out} ({args.workers} worker(s), split {args.split}); simulating held-out clips",
          file=sys.stderr)
    chunk = recipe.chunk_size
    seeds = split_range(args.split)
    episode_seeds = seeds.episode_seeds(args.episodes)
    held = held_out(seeds.clip_seeds(args.clips), args.windows * chunk)
    open_tasks = _open_loop_tasks(held) if "openloop" in args.sections else []
    episode_tasks = _episode_tasks(args, episode_seeds, len(graded_policies())) if "policies" in args.sections else []
    plan_seeds = episode_seeds[: args.plan_episodes]
    plan_tasks = _planner_tasks(args, plan_seeds) if "planning" in args.sections and plan_seeds else []
    _check_stop_rule(plan_tasks, path)
    journal = Journal(out, _journal_settings(args, path), args.resume)
    deadline = time.monotonic() + 60 * args.stop_after_minutes if args.stop_after_minutes else None
    try:
        outputs = run_tasks(path, args.threads, args.workers, recipe, plan_tasks + episode_tasks + open_tasks,
                            max_windows=args.policy_windows, journal=journal, deadline=deadline)
    except StretchSpent as stop:
        print(f"fidelity: --stop-after-minutes spent, {stop}; continue with the same command and --resume",
              file=sys.stderr)
        return {"stopped": str(stop), "journal": str(journal.folder)}
    plan_out = outputs[: len(plan_tasks)]
    episode_out = outputs[len(plan_tasks): len(plan_tasks) + len(episode_tasks)]
    records = Records(clip_seeds=held.seeds if open_tasks else [])
    videos = None
    if open_tasks:
        records.scores, videos = _open_loop_scores(outputs[len(plan_tasks) + len(episode_tasks):], held)
    if episode_tasks:
        by_policy = sorted(zip(episode_tasks, episode_out), key=lambda te: te[0].policy_ids)  # stable: seeds kept
        records.episodes = sim_episodes(graded_policies(chunk), episode_seeds, args.policy_windows, chunk) + [
            r for _, part in by_policy for r in part]
        records.plans = [r for part in plan_out for r in part]
    files = write_records(out, records)
    report = {"checkpoint": str(path), "split": args.split, "args": asdict(args), "settings": recipe.to_dict(),
              "episode_seeds": [episode_seeds[0], episode_seeds[-1]],
              "provenance": {**provenance(path, args.split, argv),
                             **({"rule_sha256": load_rule(args.rule).sha256} if args.rule else {})},
              **sections(records, args, chunk)}
    report["files"] = files + write_media(out, report.get("open_loop"), report.get("policies"), videos,
                                          args.video_clips)
    report["seconds"] = time.perf_counter() - start
    (out / "report.json").write_text(json.dumps(json_safe(report), indent=2))
    return report


def _check_stop_rule(plan_tasks: list, checkpoint: Path) -> None:
    """Refuse, before any work, a selective stop that needs a trained horizon the checkpoint does not record."""
    from ..trust.signals import trained_horizon_for

    rules = {t.stop_rule for t in plan_tasks if t.stop_rule is not None}
    if any(r.horizon_max is not None for r in rules) and trained_horizon_for(checkpoint) is None:
        raise ValueError(f"--rule is invalid for checkpoint {str(checkpoint)!r}: the rule's horizon_max needs the "
                         "checkpoint's trained horizon (trained_horizon_windows in its worldstep.json); allowed: a "
                         "checkpoint that records it, or a rule without horizon_max")


# Arguments a resumed run may change: they set how this stretch runs or what is drawn, not what is computed.
STRETCH_ARGS = ("out", "workers", "resume", "stop_after_minutes", "sections", "video_clips", "paired", "rule")


def _journal_settings(args: FidelityArgs, checkpoint: Path) -> dict[str, Any]:
    """What decides the results: the arguments, the rule's thresholds (the planner stops on them), the weights, and
    the commit and code the run started at (a stretch at another commit, or with edited code, is refused)."""
    from .provenance import code_state, tree_sha256

    kept = {k: v for k, v in asdict(args).items() if k not in STRETCH_ARGS}
    return {**kept, "checkpoint_sha256": tree_sha256([checkpoint], checkpoint),
            "rule_sha256": None if args.rule is None else load_rule(args.rule).sha256, **code_state()}
