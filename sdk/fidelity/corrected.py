"""Prediction-powered success rates in the fidelity report (`--paired n`): each policy's model rate over its
N - n model-only episodes, corrected by its first n episodes run in both worlds from the same start
(`worldstep.trust.ppi_rate`), against the simulator's rate over all N: the error, how many intervals cover it,
and the ranking the corrected rates give, beside the same figures of the model's own rates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..flags import flag, int_at_least
from ..measures.intervals import Estimate, bootstraps
from ..measures.ranks import spearman
from ..trust.ppi import ppi_rate
from .ranking import outcome_table

# each resample recomputes every graded policy's PPI rate: 1,000 keep the section to about a second
RESAMPLES_PPI = 1000


def corrected_section(sim_runs: list, model_runs: list, names: list[str], floor: tuple[str, ...], seeds: list[int],
                      n: int) -> dict[str, Any]:
    """Per policy the corrected rate (n paired, N - n model-only) and the simulator's; the summary over the
    policies outside `floor`."""
    if not 2 <= n < len(seeds):
        raise ValueError(f"paired={n} is invalid; allowed: 2 <= paired < episodes ({len(seeds)})")
    sim = outcome_table(sim_runs, names, seeds)  # [P, E]
    model = outcome_table(model_runs, names, seeds)
    per_policy = {}
    for p, name in enumerate(names):
        rate = ppi_rate(model[p, n:], model[p, :n], sim[p, :n])
        per_policy[name] = {**rate.to_dict(), "sim_rate": float(sim[p].mean()),
                            "model_rate_all": float(model[p].mean()),
                            "covers_sim_rate": bool(rate.ci95[0] <= sim[p].mean() <= rate.ci95[1])}
    graded = [name for name in names if name not in floor]
    true = np.array([per_policy[k]["sim_rate"] for k in graded])
    corrected = np.array([per_policy[k]["value"] for k in graded])
    raw = np.array([per_policy[k]["model_rate_all"] for k in graded])
    rows = [names.index(k) for k in graded]
    error, rho = _resampled(model[rows], sim[rows], n)
    return {"paired": n, "model_only": len(seeds) - n, "paired_seeds": [seeds[0], seeds[n - 1]],
            "policies": per_policy,
            "without_floor": {"mean_abs_error": float(np.abs(corrected - true).mean()),
                              "mean_abs_error_ci95": [error.low, error.high],
                              "intervals_covering": int(sum(per_policy[k]["covers_sim_rate"] for k in graded)),
                              "policies": len(graded), "spearman": float(spearman(corrected, true)),
                              "spearman_ci95": [rho.low, rho.high],
                              "model_only_mean_abs_error": float(np.abs(raw - true).mean()),
                              "model_only_spearman": float(spearman(raw, true))}}


def _resampled(model: np.ndarray, sim: np.ndarray, n: int) -> tuple[Estimate, Estimate]:
    """The corrected rates' mean absolute error and Spearman against the simulator's rates, with 95% intervals
    from resampling the start seeds (one resample shared by every policy; the n paired starts and the N - n
    model-only ones each within themselves, as the design fixed them). `model`, `sim`: `[P, E]` outcomes."""
    def error_and_rho(idx: np.ndarray) -> tuple[float, float]:
        pairs, rest = idx[idx < n], idx[idx >= n]
        corrected = np.array([ppi_rate(m[rest], m[pairs], s[pairs]).value for m, s in zip(model, sim)])
        true = sim[:, idx].mean(axis=1)
        return float(np.abs(corrected - true).mean()), float(spearman(corrected, true))

    error, rho = bootstraps(error_and_rho, model.shape[1], RESAMPLES_PPI, strata=(n, model.shape[1] - n))
    return error, rho


@dataclass
class CorrectedArgs:
    """`python -m worldstep.fidelity.corrected`'s flags."""

    run: str = flag("a fidelity run folder (report.json and records/)", positional=True)
    paired: int = flag("episodes per policy run in both worlds (the first n)", default=10, type=int_at_least(1))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """`python -m worldstep.fidelity.corrected RUN --paired n`: the section from a run's records alone."""
    import json
    from pathlib import Path

    from worldstep.envs.push_policies import FLOOR, graded_policies
    from worldstep.envs.push_seeds import range_of

    from ..flags import parse_flags
    from .records import read_records

    args = parse_flags(CorrectedArgs, argv, prog="python -m worldstep.fidelity.corrected", description=__doc__)
    run = Path(args.run)
    report = json.loads((run / "report.json").read_text())
    seeds = range_of(report["episode_seeds"][0]).episode_seeds(report["args"]["episodes"])
    episodes = read_records(run).episodes
    section = corrected_section([r for r in episodes if r.replay_success is None],
                                [r for r in episodes if r.replay_success is not None],
                                [q.name for q in graded_policies()], FLOOR, seeds, args.paired)
    print(json.dumps(section, indent=1))
    return section


if __name__ == "__main__":
    main()
