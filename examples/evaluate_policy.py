"""Compare two policies on the same episodes: same seeds, prompts and first frames, one report each.

The default model is the trained pusher world model; its config names its simulator (PushSim), so every
window is judged by the simulator's own pixel rule (the block inside the goal ring) and an episode ends
when it succeeds. The push expert acts from the frames it sees; the random policy is the floor.

    python examples/evaluate_policy.py --episodes 2 --windows 12 --out runs/evaluate_policy
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import worldstep
from worldstep.flags import parse_flags
from worldstep.policies import make_policy


@dataclass
class Args:
    """Evaluate PushSim's pixel expert against a random policy on identical world-model episodes."""

    model: str = "pusher"
    """config name, YAML path or checkpoint folder (pusher: the trained model, judged by its simulator)"""
    seed: int = 0
    """seed of the first episode (episode i uses seed + i) and of the random policy"""
    episodes: int = 2
    """episodes per policy"""
    seeds: str = ""
    """comma-separated episode seeds, instead of --seed and --episodes"""
    windows: int = 12
    """windows per episode (an episode ends early when it succeeds)"""
    policies: str = "push,random"
    """comma-separated policies to compare (sine, random, push)"""
    batched: bool = True
    """run the episodes of a policy together through the batched vector env"""
    out: str = "runs/evaluate_policy"
    """folder of the reports and videos (one subfolder per policy)"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


if __name__ == "__main__":
    args = parse_flags(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)

    # one loaded model serves every policy
    overrides = dict(num_steps=args.num_steps, height=args.height, width=args.width)  # None: the config's value
    world = worldstep.load(args.model, **overrides)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed + i for i in range(args.episodes)]
    episodes = [{"seed": seed, "max_windows": args.windows} for seed in seeds]
    judge = "the simulator's pixel judge" if world.config.env.simulator else "none (no simulator: success is 0)"
    print(f"{world}: seeds {seeds}, {args.windows} windows; success judged by {judge}")

    # evaluate each policy on the same episodes (the env's default success judge: its simulator's)
    reports = {}
    for name in args.policies.split(","):
        policy = make_policy(name, world.action_shape, seed=args.seed)
        reports[name] = worldstep.evaluate(world, policy, episodes, out_dir=f"{args.out}/{name}",
                                           batched=args.batched, progress=False)

    # compare
    print(f"{'policy':<8} {'success':>8} {'windows':>8} {'frames/s':>9}")
    for name, report in reports.items():
        summary = report.to_dict()
        print(f"{name:<8} {report.success_rate:>8.2f} {summary['mean_windows']:>8.1f} "
              f"{summary['frames_per_second']:>9.1f}")
    print(f"reports: {args.out}/<policy>/report.json")
