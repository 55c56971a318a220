"""Each claim a frozen selective rule makes on a fidelity run's records: the window, the block residual that passed
the consistency check, the model's block against the replay's at that window, and whether a block was lost.

    python tools/rule_claims.py docs/fidelity/pusher docs/fidelity/pusher/validation/trust_study/rule.json

The fourth sealed report's account of its 8 false claims comes from this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from worldstep.envs.push_policies import FLOOR
from worldstep.fidelity.trust_study import first_claim, load_rule, model_outcomes, study_episodes
from worldstep.trust.signals import trained_horizon_for


def main(run: str, rule_path: str) -> None:
    rule = load_rule(rule_path)
    report = json.loads((Path(run) / "report.json").read_text())
    max_windows = report["policies"]["max_windows"]  # the run's, as its selective section used
    horizon = trained_horizon_for(report["checkpoint"])  # the checkpoint's worldstep.json
    graded = [o for o in model_outcomes(Path(run)) if o.policy not in FLOOR]
    print("real  window  residual_px  model_vs_replay_block_px  lost_block  policy  seed")
    for outcome, (windows, _, _) in zip(graded, study_episodes(graded, horizon)):
        hit = first_claim(rule, windows, max_windows)
        if hit is None:
            continue
        d = [*outcome.detections, *outcome.continued][hit]
        model, sim = d["model"]["block"], d["sim"]["block"]
        gap = "n/a" if model is None or sim is None else f"{np.hypot(*np.subtract(model, sim)):.1f}"
        lost = any(x["model"]["block"] is None and x["sim"]["block"] is not None for x in outcome.detections)
        print(f"{windows[hit].replay_by_now!s:5} {hit + 1:6d}  {windows[hit].signals.consistency:11.2f}  {gap:>24}  "
              f"{lost!s:10}  {outcome.policy}  {outcome.episode.seed}")


if __name__ == "__main__":
    main(*sys.argv[1:])
