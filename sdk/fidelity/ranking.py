"""Policy evaluation in the model vs the simulator: calibration, ranking and selection, with intervals.

Every policy runs the same start seeds in both worlds; an episode pair (same policy, same seed) is one
unit of the confusion matrix. Intervals resample the start seeds, one resample shared by all policies,
so the policies' rates stay paired the way they were measured.

- Confusion per policy, by the strict rule: model success x the success of the model episode's own
  chunks replayed in the simulator from the same start (`replay_success`). The false-success rate is
  the share of replay failures that the model calls a success; the missed-success rate the share of
  replay successes that the model calls a failure. The same rates against the simulator's own
  closed-loop episode from the same seed are kept beside them as `paired_seed` (lenient: a policy that
  acts differently on the simulator's frames reaches other states).
- Ranking: Spearman and Pearson of the per-policy rates, over all policies and without the floor ones.
- Selection regret: the simulator success of the best policy minus that of the policy the model rates
  best (ties: the mean over the tied picks, i.e. a uniform random pick).
- Decisions (`decisions`): the precision of the model's successes and MMRV per group; the hazard of false
  success per bin of windows and the block-lost rate over the graded policies' model episodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..measures.intervals import bootstrap, rate_dict
from ..measures.ranks import pearson, spearman
from .decisions import decision_stats, episode_tables, hazard, lost_rate
from .rollouts import EpisodeOutcome


def outcome_table(results: list[EpisodeOutcome], names: list[str], seeds: list[int],
                  field: str = "success") -> np.ndarray:
    """`[P, E]` bool: `field` (`success` or `replay_success`) of each (policy, seed) episode; KeyError when one
    is missing."""
    if field not in ("success", "replay_success"):
        raise ValueError(f"field={field!r} is invalid; allowed: 'success' or 'replay_success'")
    index = {(r.policy, r.episode.seed): r.episode.success if field == "success" else r.replay_success
             for r in results}
    return np.array([[bool(index[(name, seed)]) for seed in seeds] for name in names])


def _false_success(model: np.ndarray, sim: np.ndarray) -> float:
    fails = ~sim
    return float((model & fails).sum() / fails.sum()) if fails.sum() else float("nan")


def _missed_success(model: np.ndarray, sim: np.ndarray) -> float:
    return float((~model & sim).sum() / sim.sum()) if sim.sum() else float("nan")


def _regret(model_rates: np.ndarray, sim_rates: np.ndarray) -> float:
    picks = np.flatnonzero(model_rates == model_rates.max())
    return float(sim_rates.max() - sim_rates[picks].mean())


def _confusion(model: np.ndarray, truth: np.ndarray) -> dict[str, int]:
    return {"model_success_sim_success": int((model & truth).sum()),
            "model_success_sim_failure": int((model & ~truth).sum()),
            "model_failure_sim_success": int((~model & truth).sum()),
            "model_failure_sim_failure": int((~model & ~truth).sum())}


def _judged(model: np.ndarray, truth: np.ndarray, seed: int) -> dict[str, Any]:
    """False- and missed-success rates and episode agreement of `model` against `truth` (`[..., E]` bool),
    episodes resampled."""
    units = model.shape[-1]
    return {
        "false_success_rate": bootstrap(lambda i: _false_success(model[..., i], truth[..., i]), units,
                                        seed=seed).to_dict(),
        "missed_success_rate": bootstrap(lambda i: _missed_success(model[..., i], truth[..., i]), units,
                                         seed=seed).to_dict(),
        "episode_agreement": bootstrap(lambda i: (model[..., i] == truth[..., i]).mean(), units, seed=seed).to_dict(),
    }


def policy_stats(name: str, sim: np.ndarray, model: np.ndarray, replay: np.ndarray, seed: int) -> dict[str, Any]:
    """Rates, bias and confusion of one policy's paired episodes (`[E]` bool each); confusion and the
    false/missed rates by the strict rule (against `replay`), the paired-seed ones beside."""
    units = len(sim)
    return {
        "policy": name,
        "sim_success": rate_dict(sim, seed=seed),
        "model_success": rate_dict(model, seed=seed),
        "replay_success": rate_dict(replay, seed=seed),
        "bias": bootstrap(lambda i: model[i].mean() - sim[i].mean(), units, seed=seed).to_dict(),
        "replay_bias": bootstrap(lambda i: model[i].mean() - replay[i].mean(), units, seed=seed).to_dict(),
        "confusion": _confusion(model, replay),
        **_judged(model, replay, seed),
        "paired_seed": {"confusion": _confusion(model, sim), **_judged(model, sim, seed)},
    }


def group_stats(sim: np.ndarray, model: np.ndarray, replay: np.ndarray, seed: int) -> dict[str, Any]:
    """Ranking, calibration and selection over a group of policies (`[P, E]` bool tables): rates against the
    simulator's closed-loop episodes (how good each policy truly is), false and missed success by the strict
    rule (against `replay`), the paired-seed ones beside."""
    units = sim.shape[1]

    def rates(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return table[:, idx].mean(axis=1)

    return {
        "policies": int(sim.shape[0]),
        "spearman": bootstrap(lambda i: spearman(rates(sim, i), rates(model, i)), units, seed=seed).to_dict(),
        "pearson": bootstrap(lambda i: pearson(rates(sim, i), rates(model, i)), units, seed=seed).to_dict(),
        "mean_abs_rate_error": bootstrap(lambda i: np.abs(rates(model, i) - rates(sim, i)).mean(), units,
                                         seed=seed).to_dict(),
        **_judged(model, replay, seed),
        "paired_seed": _judged(model, sim, seed),
        "selection_regret": bootstrap(lambda i: _regret(rates(model, i), rates(sim, i)), units,
                                      seed=seed).to_dict(),
        **decision_stats(model, replay, lambda i: rates(sim, i), lambda i: rates(model, i), units, seed),
    }


def policy_report(sim_results: list[EpisodeOutcome], model_results: list[EpisodeOutcome], names: list[str],
                  floor: tuple[str, ...], seeds: list[int], seed: int = 0,
                  max_windows: int | None = None) -> dict[str, Any]:
    """Everything the report says about policy evaluation in the model (`max_windows`: the episodes' limit, which
    the hazard's bins cover; None: the longest episode's)."""
    sim = outcome_table(sim_results, names, seeds)
    model = outcome_table(model_results, names, seeds)
    replay = outcome_table(model_results, names, seeds, "replay_success")
    graded = np.array([n not in floor for n in names])
    sim_rates, model_rates = sim.mean(axis=1), model.mean(axis=1)
    kept = np.flatnonzero(graded)
    group = [names[i] for i in kept] if len(kept) > 1 else names
    tables = episode_tables(model_results, group, seeds)
    picks = [names[i] for i in kept[model_rates[kept] == model_rates[kept].max()]] if len(kept) else []
    return {
        "policies": names, "floor": [n for n in names if n in floor], "episodes": len(seeds),
        "per_policy": [policy_stats(n, sim[p], model[p], replay[p], seed + p) for p, n in enumerate(names)],
        "all": group_stats(sim, model, replay, seed),
        "without_floor": group_stats(sim[graded], model[graded], replay[graded], seed) if graded.sum() > 1 else None,
        "model_pick": picks,
        "sim_best": [names[i] for i in kept[sim_rates[kept] == sim_rates[kept].max()]] if len(kept) else [],
        "false_success_hazard": hazard(tables, max_windows or int(tables["windows"].max(initial=1)), seed),
        "block_lost_rate": lost_rate(tables, seed),
    }
