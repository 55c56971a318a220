"""`python -m worldstep.fidelity.demo_seed`: pick `make demo`'s seed by a stated rule, on the validation range.

The rule: the first validation seed where the demo's own command (`worldstep rollout --env
worldstep/Pusher-v0 --policy push --windows 16 --seed S --truth`) ends in success on both sides, the
world model's frames and the simulator's. Beside it, the share of the first `--seeds` validation seeds
where the two sides agree, so the demo is shown next to how often it is representative. The sealed
test range is never used here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
from worldstep.envs.push_seeds import VALIDATION

from ..flags import flag, parse_flags, positive_int
from ..measures.intervals import rate_dict


@dataclass
class DemoSeedArgs:
    config: str = flag("model config or checkpoint folder", default="pusher")
    seeds: int = flag("validation seeds for the agreement rate", default=50, type=positive_int)
    windows: int = flag("windows per episode, as make demo runs", default=16)
    out: str = flag("JSON with every seed's verdicts", default="runs/demo_seed.json")


def main(argv: list[str] | None = None) -> dict:
    import worldstep
    from worldstep.policies import make_policy
    from worldstep.truth import rollout_with_truth

    args = parse_flags(DemoSeedArgs, argv, prog="python -m worldstep.fidelity.demo_seed", description=__doc__)
    # as `worldstep rollout --truth` makes it: success is judged on both sides by rollout_with_truth every
    # window (the env's own judge is off); each world stops at its own first success
    env = worldstep.make_env(args.config, max_windows=args.windows, success_fn="none")
    inner = env.unwrapped
    truth = gym.make(inner.simulator, chunk_size=inner.knobs.chunk_size, disable_env_checker=True).unwrapped
    rows = []
    try:
        for seed in VALIDATION.episode_seeds(args.seeds):
            policy = make_policy("push", env.action_space, seed=seed)
            r = rollout_with_truth(env, truth, policy, seed=seed, max_windows=args.windows)
            rows.append({"seed": seed, "model_success": r.model_success, "simulator_success": r.truth_success,
                         "model_success_window": r.model.success_window,
                         "simulator_success_window": r.simulator.success_window, "mean_psnr_db": r.mean_psnr_db})
    finally:
        env.close()
        truth.close()
    agree = np.array([r["model_success"] == r["simulator_success"] for r in rows])
    both = [r["seed"] for r in rows if r["model_success"] and r["simulator_success"]]
    result = {"rule": "first validation seed where make demo's command succeeds in the model and the simulator",
              "demo_seed": both[0] if both else None, "agreement": rate_dict(agree),
              "both_succeed": rate_dict(np.array([r["model_success"] and r["simulator_success"] for r in rows])),
              "seeds": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"demo seed {result['demo_seed']}; model and simulator agree on {int(agree.sum())}/{len(agree)} validation "
          f"seeds ({result['agreement']['value']:.2f}, 95% interval {result['agreement']['ci95']}); {args.out}")
    return result


if __name__ == "__main__":
    main()
