"""Compare two policies on the same episodes: same seeds, prompts and first frames, one report each.

    python examples/evaluate_policy.py --episodes 2 --windows 3 --out runs/evaluate_policy
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import worldstep
from worldstep.cli import parse_dataclass_args
from worldstep.policies import RandomPolicy, SinePolicy


@dataclass
class Args:
    """Evaluate a scripted sine policy against a random policy on identical episodes."""

    model: str = "tiny"
    """config name, YAML path or checkpoint folder (tiny is the embedded default)"""
    seed: int = 0
    """seed of the first episode (episode i uses seed + i) and of the random policy"""
    episodes: int = 2
    """episodes per policy"""
    windows: int = 3
    """windows per episode"""
    batched: bool = True
    """run the episodes of a policy together through the batched vector env"""
    brightness_goal: float = 128.0
    """a window succeeds when its mean pixel value exceeds this (a stand-in success detector)"""
    out: str = "runs/evaluate_policy"
    """folder of the reports and videos (one subfolder per policy)"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


if __name__ == "__main__":
    args = parse_dataclass_args(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)

    # one loaded model serves both policies
    overrides = {k: v for k, v in {"num_steps": args.num_steps, "height": args.height, "width": args.width}.items()
                 if v is not None}
    world = worldstep.load(args.model, **overrides)
    prompts = ["A robot arm pushes a block across a table.", "pick up the red cube"]
    episodes = [{"seed": args.seed + i, "prompt": prompts[i % len(prompts)], "max_windows": args.windows}
                for i in range(args.episodes)]

    def bright_enough(frames: np.ndarray) -> bool:
        return float(frames.mean()) > args.brightness_goal

    # evaluate each policy on the same episodes
    policies = {"sine": SinePolicy(world.action_shape), "random": RandomPolicy(world.action_shape, seed=args.seed)}
    reports = {}
    for name, policy in policies.items():
        reports[name] = worldstep.evaluate(world, policy, episodes, success_fn=bright_enough,
                                           out_dir=f"{args.out}/{name}", batched=args.batched, progress=False)

    # compare
    print(f"{'policy':<8} {'success':>8} {'return':>8} {'windows':>8} {'frames/s':>9}")
    for name, report in reports.items():
        summary = report.to_dict()
        fps = summary["total_frames"] / max(summary["total_wall_s"], 1e-9)
        print(f"{name:<8} {report.success_rate:>8.2f} {report.mean_return:>8.2f} "
              f"{summary['mean_windows']:>8.1f} {fps:>9.1f}")
    print(f"reports: {args.out}/<policy>/report.json")
