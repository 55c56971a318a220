"""Planning lift: what choosing actions in the world model buys in the simulator, with paired intervals.

The planner and its base policy run from the same start seeds; the lift is the planner's simulator
success rate minus the base policy's, resampling seeds in pairs. Two bases are reported: the base
policy acting on the simulator itself (what the planner must beat to be worth running) and the same
policy acting on the world model's frames with its chunks replayed in the simulator (the planner's own
information, without the search).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..measures.intervals import bootstrap, rate_dict


def lift_summary(planner: np.ndarray, base_sim: np.ndarray, base_model_loop: np.ndarray | None,
                 seed: int = 0) -> dict[str, Any]:
    """Rates and paired lifts of `[E]` bool simulator outcomes over the same seeds."""
    planner, base_sim = np.asarray(planner, bool), np.asarray(base_sim, bool)
    out = {
        "planner_sim_success": rate_dict(planner, seed=seed),
        "base_sim_success": rate_dict(base_sim, seed=seed),
        "lift": bootstrap(lambda i: planner[i].mean() - base_sim[i].mean(), len(planner), seed=seed).to_dict(),
    }
    if base_model_loop is not None:
        base_model_loop = np.asarray(base_model_loop, bool)
        out["base_model_loop_sim_success"] = rate_dict(base_model_loop, seed=seed)
        out["lift_over_model_loop_base"] = bootstrap(lambda i: planner[i].mean() - base_model_loop[i].mean(),
                                                     len(planner), seed=seed).to_dict()
    return out
