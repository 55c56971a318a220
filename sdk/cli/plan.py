"""``worldstep plan``: model-predictive planning in a world model, judged by its simulator."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..flags import flag, positive_int
from .checks import RunRecord
from .common import prepare, run_info, summary_file
from .view import closing_on_error, logged, open_from_args
from .view import finish as finish_view


@dataclass
class PlanFlags:
    """``worldstep plan`` (its model flags default to ``--env worldstep/Pusher-v0``)."""

    proposal: str = flag("graded pusher policy whose chunks the planner scores (see "
                         "worldstep.envs.push_policies.graded_policies), or your own noisy policy: module:attr or "
                         "path/to/file.py:attr", default="noisy0.8")
    candidates: int = flag("chunks imagined per window", default=8, type=positive_int)
    approach_weight: float = flag("weight of the effector-to-block distance in the cost", default=0.0)
    observe: str = flag("model: act on imagined frames, the simulator replays; simulator: re-anchor the model on the "
                        "simulator's frame every window (MPC)", default="model", choices=("model", "simulator"))
    windows: int = flag("windows per episode", default=16, type=positive_int)
    seed: int = flag("reset seed", default=0)
    compare: bool = flag("also run the proposal policy alone on the simulator", default=False)
    out: str = flag("mp4: what the planner saw | simulator", default="plan.mp4")
    summary: str | None = flag("JSON summary path (default: --out with .json)", default=None)


def cmd_plan(args: argparse.Namespace) -> int:
    import copy

    from worldstep.envs.push_policies import graded_policies

    from ..evaluation.distributed import action_shape
    from ..planning import BlockToGoal, ModelPredictivePlanner, closed_loop
    from ..policies import make_policy
    from ..policies.user import is_user_spec
    from ..world import make_env

    proposals = {p.name: p for p in graded_policies()}
    if args.proposal not in proposals and not is_user_spec(args.proposal):
        raise ValueError(f"--proposal {args.proposal!r} is invalid; allowed: one of {sorted(proposals)}, "
                         "module:attr or path/to/file.py:attr")
    objective = BlockToGoal(approach_weight=args.approach_weight)
    model, config = prepare(args, max_windows=args.windows)
    shape = action_shape(config)
    if args.proposal not in proposals and shape is not None:  # a user's proposal, loaded before the model
        proposals[args.proposal] = make_policy(args.proposal, shape, seed=args.seed)
    if config.env.simulator is None:
        raise ValueError(f"plan is invalid for config {model!r}: its env.simulator is None; allowed: a config that "
                         "names its simulator (e.g. --env worldstep/Pusher-v0)")
    summary = summary_file(args)
    record = RunRecord(summary, "--summary", **run_info(args, model, config), proposal=args.proposal,
                       candidates=args.candidates, observe=args.observe)
    viewer = open_from_args(args)
    with closing_on_error(viewer), record.guard(f"no video written ({args.out} unchanged)"):
        env = make_env(config, success_fn="none")  # the closed loop judges success (its confirm count)
        try:
            if args.proposal not in proposals:  # only the loaded model knew the action shape
                proposals[args.proposal] = make_policy(args.proposal, env.action_space, seed=args.seed)
            planner = ModelPredictivePlanner(env, copy.deepcopy(proposals[args.proposal]), args.candidates, objective)
            result = closed_loop(logged(env, viewer), planner, seed=args.seed, max_windows=args.windows,
                                 observe=args.observe, video_path=args.out)
            base = None
            if args.compare:
                base = closed_loop(env, copy.deepcopy(proposals[args.proposal]), seed=args.seed,
                                   max_windows=args.windows, observe="simulator")
        finally:
            env.close()
    summary_path = record.finish(**result.to_dict(), base_sim_success=None if base is None else base.sim_success)
    line = (f"{result.episode.video}: planner ({args.candidates} x {args.proposal}, observing the {args.observe}) "
            f"{result.episode.windows} windows; simulator success {result.sim_success}")
    if result.model_success is not None:
        line += f", model success {result.model_success}"
    if base is not None:
        line += f"; {args.proposal} alone on the simulator: success {base.sim_success}"
    print(f"{line}; summary {summary_path}")
    finish_view(viewer)
    return 0
