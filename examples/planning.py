"""Model-predictive planning in the pusher world model, judged by the simulator it was trained on.

Each window the planner draws N chunks from a noisy pusher policy, imagines each in a fork of the world
model (forks share the committed KV pages), and executes the chunk whose imagined frames put the block
nearest the goal. PushSim replays every executed chunk: its frames, not the model's, say whether the
block reached the goal. The same policy without planning, acting on the simulator itself, is the
baseline. Seeds come from the validation range (worldstep.envs.push_seeds): use it for experiments.

    python examples/planning.py --episodes 4 --candidates 8 --out runs/planning
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import worldstep
from worldstep.envs.push_policies import graded_policies
from worldstep.envs.push_seeds import VALIDATION
from worldstep.flags import parse_flags
from worldstep.planning import ModelPredictivePlanner, closed_loop


@dataclass
class Args:
    """Planner vs its proposal policy on a few validation episodes of the pusher."""

    model: str = "pusher"
    """config name or checkpoint folder of a model trained on PushSim (its env.simulator)"""
    proposal: str = "noisy0.8"
    """graded pusher policy the planner draws candidate chunks from"""
    candidates: int = 8
    """chunks imagined per window"""
    observe: str = "model"
    """model: the planner acts on imagined frames only; simulator: it re-anchors on the simulator each window"""
    episodes: int = 4
    """episodes, from the first validation seeds"""
    windows: int = 16
    """windows per episode"""
    seed: int = 0
    """seed of Python's and numpy's global generators (episodes are seeded by their start seed)"""
    out: str = "runs/planning"
    """folder for one mp4 per episode (planner's view | simulator)"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""


if __name__ == "__main__":
    args = parse_flags(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)

    # env and policies
    overrides = {} if args.num_steps is None else {"num_steps": args.num_steps}
    env = worldstep.make_env(args.model, max_windows=args.windows, success_fn="none", **overrides)  # closed_loop judges
    proposals = {p.name: p for p in graded_policies(env.action_space.shape[0])}
    base = proposals[args.proposal]
    planner = ModelPredictivePlanner(env, copy.deepcopy(base), args.candidates)
    Path(args.out).mkdir(parents=True, exist_ok=True)

    # episodes: the planner (judged by the simulator's replay) and the base policy on the simulator
    planned, alone = [], []
    for seed in VALIDATION.episode_seeds(args.episodes):
        result = closed_loop(env, planner, seed=seed, max_windows=args.windows, observe=args.observe,
                             video_path=f"{args.out}/plan_{seed}.mp4")
        baseline = closed_loop(env, copy.deepcopy(base), seed=seed, max_windows=args.windows, observe="simulator")
        planned.append(result.sim_success)
        alone.append(baseline.sim_success)
        print(f"seed {seed}: planner {'reached' if result.sim_success else 'missed'} the goal in the simulator "
              f"({result.episode.windows} windows; the model believed {result.model_success}), "
              f"{args.proposal} alone {'reached' if baseline.sim_success else 'missed'} it")
    env.close()
    print(f"simulator success over {args.episodes} episodes: planner {np.mean(planned):.2f}, "
          f"{args.proposal} alone {np.mean(alone):.2f} (worldstep fidelity reports both with intervals)")
