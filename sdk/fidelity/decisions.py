"""How far a decision made in the model holds: precision, rank violations, the hazard of false success, lost blocks.

These sit beside the strict false-success rate (`ranking`), which counts false successes among real
failures and so hides how many of the model's reported successes are real:

- `precision`: the share of the model's successes that the simulator, replaying the same chunks, confirms.
- `mmrv`: the mean maximum rank violation of SIMPLER and SC3-Eval. For each policy, the largest true-rate gap
  to another policy that the model ranks the other way round; averaged over policies (0: every pair ordered
  as in the simulator; it weighs a swap by how far apart the two policies really are).
- `hazard`: false successes per window at risk, in bins of windows: errors that compound show as a rising
  hazard past the windows training clips cover.
- `block_lost`: the share of model episodes in which the block disappears from the model's frames at some
  window while the replay still shows it (a lost block stays lost and hides false successes).

Intervals resample start seeds, one resample shared by every policy (`stats.bootstrap`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..measures.intervals import bootstrap
from .rollouts import EpisodeOutcome

HAZARD_BIN = 4  # windows per hazard bin (a 16-window episode: 1-4, 5-8, 9-12, 13-16)


def precision(model: np.ndarray, replay: np.ndarray) -> float:
    """Share of model successes (`model` True) that `replay` confirms; NaN when the model reports none."""
    reported = model.sum()
    return float((model & replay).sum() / reported) if reported else float("nan")


def mmrv(true_rates: np.ndarray, model_rates: np.ndarray) -> float:
    """Mean over policies of the largest `|true_i - true_j|` over the policies j the model orders the other way."""
    true_rates, model_rates = np.asarray(true_rates, np.float64), np.asarray(model_rates, np.float64)
    gap = np.abs(true_rates[:, None] - true_rates[None, :])  # [P, P]
    swapped = (model_rates[:, None] < model_rates[None, :]) != (true_rates[:, None] < true_rates[None, :])
    return float((gap * swapped).max(axis=1).mean())


def episode_tables(outcomes: list[EpisodeOutcome], names: list[str], seeds: list[int]) -> dict[str, np.ndarray]:
    """`[P, E]` tables of model episodes: windows run, the window a false success ended it (0: none) and
    whether the block was lost."""
    index = {(o.policy, o.episode.seed): o for o in outcomes}
    shape = (len(names), len(seeds))
    ran, false_at, lost = np.zeros(shape, int), np.zeros(shape, int), np.zeros(shape, bool)
    for p, name in enumerate(names):
        for e, seed in enumerate(seeds):
            o = index[(name, seed)]
            ran[p, e] = o.episode.windows
            if o.episode.success and not o.replay_success:
                false_at[p, e] = o.episode.windows
            lost[p, e] = any(d["model"]["block"] is None and d["sim"]["block"] is not None for d in o.detections)
    return {"windows": ran, "false_at": false_at, "lost": lost}


def hazard(tables: dict[str, np.ndarray], max_windows: int, seed: int = 0) -> list[dict[str, Any]]:
    """Per bin of `HAZARD_BIN` windows: false successes in the bin / episode-windows at risk in the bin."""
    ran, false_at = tables["windows"], tables["false_at"]
    out = []
    for lo in range(1, max_windows + 1, HAZARD_BIN):
        hi = min(lo + HAZARD_BIN - 1, max_windows)
        at_risk = np.clip(ran - lo + 1, 0, hi - lo + 1)  # [P, E] windows each episode ran inside the bin
        events = (false_at >= lo) & (false_at <= hi)

        def rate(i: np.ndarray, events=events, at_risk=at_risk) -> float:
            risk = at_risk[:, i].sum()
            return float(events[:, i].sum() / risk) if risk else float("nan")

        out.append({"windows": [lo, hi], "false_successes": int(events.sum()), "windows_at_risk": int(at_risk.sum()),
                    **bootstrap(rate, ran.shape[1], seed=seed).to_dict()})
    return out


def decision_stats(model: np.ndarray, replay: np.ndarray, true_rates_of, model_rates_of, units: int,
                   seed: int) -> dict[str, Any]:
    """Precision of the model's successes and MMRV over a group, each with its interval."""
    return {
        "precision": {**bootstrap(lambda i: precision(model[:, i], replay[:, i]), units, seed=seed).to_dict(),
                      "reported_successes": int(model.sum()), "confirmed": int((model & replay).sum())},
        "mmrv": bootstrap(lambda i: mmrv(true_rates_of(i), model_rates_of(i)), units, seed=seed).to_dict(),
    }


def lost_rate(tables: dict[str, np.ndarray], seed: int = 0) -> dict[str, Any]:
    """Share of model episodes (all policies of the group) whose block was lost at some window."""
    lost = tables["lost"]
    return {**bootstrap(lambda i: float(lost[:, i].mean()), lost.shape[1], seed=seed).to_dict(),
            "episodes": int(lost.size), "lost": int(lost.sum())}
