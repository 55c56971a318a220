"""``worldstep eval``: a policy over episodes from a YAML file or a LeRobot dataset's starts, to report.json and
mp4s (locally, batched, or over Ray)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..flags import flag, positive_int
from .checks import RunInterrupted, check_episodes, check_replay_length, success_judge
from .common import POLICY_HELP, SUCCESS_HELP, check_lerobot_out, early_policy, prepare, run_info
from .view import closing_on_error, logged, open_from_args, wants_view
from .view import finish as finish_view


@dataclass
class EvalFlags:
    """``worldstep eval``."""

    episodes: str = flag("YAML: a list of episodes (seed, prompt, domain_id, image, max_windows, start) or a mapping "
                         "with an 'episodes' list; or a LeRobot dataset folder, whose recorded starts are the episodes",
                         positional=True)
    starts: int | None = flag("with a dataset: this many (episode, frame) starts drawn from --seed (default: frame 0 "
                              "of every episode)", default=None, type=positive_int)
    policy: str = flag(POLICY_HELP, default="sine")
    success: str | None = flag(SUCCESS_HELP, default=None, metavar="JUDGE")
    out_dir: str = flag("report and video folder", default="runs/eval")
    batched: bool = flag("step episodes together in one vector env", default=False)
    batch_size: int | None = flag("episodes per batch (default: all)", default=None, type=positive_int)
    seed: int = flag("seed of episodes without one: seed + index", default=0)
    video: bool = flag("write an mp4 per episode (--no-video skips them)", default=True)
    lerobot_out: str | None = flag("also write the episodes as a LeRobot v3.0 dataset in this new folder (not with "
                                   "--ray)", default=None, metavar="DIR")
    quiet: bool = flag("no progress bar", default=False)
    ray: bool = flag("shard episodes over Ray actors, one model each (pip install 'worldstep[dist]')", default=False)
    ray_address: str | None = flag("Ray cluster to join (default: $RAY_ADDRESS, else a new local one)", default=None)
    workers: int = flag("Ray actors with --ray", default=2, type=positive_int)


def cmd_eval(args: argparse.Namespace) -> int:
    from ..policies.builtin import check_policy_spec, make_policy

    check_policy_spec(args.policy)  # before the config and torch load
    from ..evaluation.dispatch import evaluate
    from ..outputs import check_output_path
    from ..world import load, make_env

    path = Path(args.episodes)
    if path.is_dir():  # a LeRobot dataset: its recorded starts are the episodes
        from ..lerobot.start_states import dataset_episodes

        episodes = check_episodes(dataset_episodes(args.episodes, starts=args.starts, seed=args.seed))
    elif not path.is_file():
        raise FileNotFoundError(f"episodes file {args.episodes!r} does not exist")
    else:
        if args.starts is not None:
            raise ValueError("--starts is invalid with an episodes file; allowed: with a LeRobot dataset folder")
        episodes = check_episodes(yaml.safe_load(path.read_text()))
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out-dir={args.out_dir!r} is invalid: it is a file; allowed: a folder")
    check_output_path(out_dir / "report.json", "--out-dir")
    model, config = prepare(args)
    success = success_judge(args.success, config)
    policy = early_policy(args, config)
    longest = max(ep.get("max_windows") or config.env.max_windows for ep in episodes)
    check_replay_length(policy, longest, args.policy)
    if args.lerobot_out is not None and args.ray:
        raise ValueError("--lerobot-out with --ray is invalid; allowed: a local eval")
    check_lerobot_out(args.lerobot_out)
    if wants_view(args) and (args.ray or args.batched):
        raise ValueError("--rerun, --rerun-connect, --rerun-save and --rerun-serve are invalid with --ray or "
                         "--batched; allowed: an eval that steps one episode at a time")
    ray = {"backend": "ray", "ray_address": args.ray_address, "num_workers": args.workers} if args.ray else {}
    if args.ray:  # the actors load the model; the driver needs only its config
        from ..evaluation.distributed import driver_target

        target, shape = driver_target(config)
    else:
        target = load(config)
        shape = target.action_shape
    if policy is None:
        policy = make_policy(args.policy, shape, seed=args.seed)
        check_replay_length(policy, longest, args.policy)
    run = {**run_info(args, model, config), "episodes_file": args.episodes}
    viewer = open_from_args(args)
    logged_env = None
    try:
        with closing_on_error(viewer):
            if viewer is not None:  # evaluate steps this env, logged, episode after episode
                target = logged_env = logged(make_env(target, max_windows=longest, success_fn=success), viewer)
                success = None
            report = evaluate(target, policy, episodes, success_fn=success, out_dir=out_dir, batched=args.batched,
                              batch_size=args.batch_size, seed=args.seed, record_video=args.video,
                              progress=not args.quiet, run_info=run, lerobot_out=args.lerobot_out, **ray)
    except KeyboardInterrupt:
        raise RunInterrupted(f"interrupted; the episodes that finished are in {out_dir / 'report.json'} "
                             '("status": "interrupted")') from None
    finally:
        if logged_env is not None:
            logged_env.close()
    failed = sum(e.status == "failed" for e in report.episodes)
    print(f"{len(report.episodes)} episodes: success rate {report.success_rate:.2f}, "
          f"mean return {report.mean_return:g}" + (f", {failed} failed" if failed else "")
          + f"; report {out_dir / 'report.json'}")
    finish_view(viewer)
    return 0
