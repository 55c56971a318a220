"""``worldstep rollout``: one closed-loop episode with a policy, to an mp4 and a JSON summary (``--truth``: next to
the simulator)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..flags import flag, positive_int
from .checks import RunRecord, check_replay_length, success_judge
from .common import POLICY_HELP, SUCCESS_HELP, check_lerobot_out, early_policy, prepare, run_info, summary_file
from .view import closing_on_error, logged, open_from_args
from .view import finish as finish_view


@dataclass
class RolloutFlags:
    """``worldstep rollout``."""

    policy: str = flag(POLICY_HELP, default="sine")
    windows: int = flag("windows to generate", default=8, type=positive_int)
    success: str | None = flag(SUCCESS_HELP, default=None, metavar="JUDGE")
    truth: bool = flag("step the model's simulator (config env.simulator) with the same actions; the mp4 shows "
                       "model | simulator side by side and the summary holds PSNR per window; each world is judged "
                       "by the simulator's pixel rule and stops at its own first success", default=False)
    run_on: bool = flag("with --truth: run every window past a success (the summary still gives each world's first "
                        "success window and its final state)", default=False)
    out: str = flag("mp4 path", default="rollout.mp4")
    summary: str | None = flag("JSON summary path (default: --out with .json)", default=None)
    lerobot_out: str | None = flag("also write the episode as a LeRobot v3.0 dataset in this new folder",
                                   default=None, metavar="DIR")
    seed: int = flag("reset seed", default=0)
    prompt: str | None = flag("text prompt (default: the config's)", default=None)
    embodiment: str | None = flag("embodiment name, e.g. droid_lerobot (the table in docs/embodiments.md; default: the "
                                  "config's)", default=None)
    domain_id: int | None = flag("action-head domain (default: the config's)", default=None)
    image: str | None = flag("first frame image path (default: the simulator's scene for --seed, else a drawn "
                             "tabletop scene)", default=None)
    quiet: bool = flag("no progress bar", default=False)


def cmd_rollout(args: argparse.Namespace) -> int:
    from ..policies.builtin import check_policy_spec, make_policy

    check_policy_spec(args.policy)  # before the config and torch load
    from ..evaluation.local import rollout
    from ..world import make_env

    if args.truth and args.image is not None:
        raise ValueError("--truth with --image is invalid; allowed: --truth alone (the simulator sets the first frame)")
    if args.run_on and not args.truth:
        raise ValueError("--run-on without --truth is invalid; allowed: --truth --run-on")
    if args.truth and args.lerobot_out is not None:
        raise ValueError("--truth with --lerobot-out is invalid; allowed: one of them")
    check_lerobot_out(args.lerobot_out)
    model, config = prepare(args, max_windows=args.windows)
    success = success_judge(args.success, config)
    policy = early_policy(args, config)
    check_replay_length(policy, args.windows, args.policy)
    summary = summary_file(args)
    if args.truth:
        return _rollout_truth(args, model, config, policy, summary)
    record = RunRecord(summary, "--summary", **run_info(args, model, config))
    viewer = open_from_args(args)
    with closing_on_error(viewer), record.guard(f"no video written ({args.out} unchanged)"):
        env = logged(make_env(config, success_fn=success), viewer)
        if args.lerobot_out is not None:
            from ..lerobot.imagined import RecordLeRobot

            env = RecordLeRobot(env, args.lerobot_out)
        try:
            if policy is None:
                policy = make_policy(args.policy, env.action_space, seed=args.seed)
                check_replay_length(policy, args.windows, args.policy)
            result = rollout(env, policy, seed=args.seed, max_windows=args.windows, video_path=args.out,
                             progress=not args.quiet, on_window=record.window_done)
            if args.lerobot_out is not None:
                env.finish()
        finally:
            env.close()
    summary_path = record.finish(**result.to_dict())
    print(f"{result.video}: {result.frames} frames in {result.windows} windows, {result.wall_s:.1f} s "
          f"({result.frames_per_second:.1f} frames/s), return {result.episode_return:g}, "
          f"success {result.success}; summary {summary_path}")
    finish_view(viewer)
    return 0


def _rollout_truth(args: argparse.Namespace, model: str, config, policy, summary: Path) -> int:
    import gymnasium as gym

    from ..policies import make_policy
    from ..truth import rollout_with_truth
    from ..world import make_env

    if config.env.simulator is None:
        raise ValueError(f"--truth is invalid for config {model!r}: its env.simulator is None; allowed: a config "
                         f"that names its simulator (e.g. --env worldstep/Pusher-v0)")
    if args.success not in (None, "sim"):
        raise ValueError(f"--success {args.success} is invalid with --truth; allowed: sim (both sides are judged "
                         "by the simulator's pixel judge)")
    record = RunRecord(summary, "--summary", **run_info(args, model, config), simulator=config.env.simulator)
    viewer = open_from_args(args)
    with closing_on_error(viewer), record.guard(f"no video written ({args.out} unchanged)"):
        # rollout_with_truth judges both worlds by the simulator's pixel rule and stops each at its success
        model_env = make_env(config, success_fn="none")
        env = logged(model_env, viewer)
        truth = None
        try:
            truth = gym.make(model_env.unwrapped.simulator, chunk_size=model_env.unwrapped.knobs.chunk_size,
                             disable_env_checker=True).unwrapped
            if policy is None:
                policy = make_policy(args.policy, env.action_space, seed=args.seed)
                check_replay_length(policy, args.windows, args.policy)
            result = rollout_with_truth(env, truth, policy, seed=args.seed, max_windows=args.windows,
                                        video_path=args.out, progress=not args.quiet, on_window=record.window_done,
                                        on_truth=None if viewer is None else env.log_truth, run_on=args.run_on)
        finally:
            env.close()
            if truth is not None:
                truth.close()
    summary_path = record.finish(**result.to_dict())
    psnr = ", ".join(f"{p:.1f}" for p in result.psnr_db)
    episode = result.episode
    print(f"{episode.video}: model | {config.env.simulator}, {episode.frames} frames in {episode.windows} windows, "
          f"{episode.wall_s:.1f} s; PSNR per window (dB) {psnr}; {_verdict('model', result.model)}, "
          f"{_verdict('simulator', result.simulator)}; summary {summary_path}")
    finish_view(viewer)
    return 0


def _verdict(name: str, world) -> str:
    """A world's record in words: when it first succeeded and where it ended."""
    first = "never succeeded" if world.success_window is None else f"first success at window {world.success_window}"
    return f"{name} {first}, final state {'success' if world.final_success else 'not a success'}"
