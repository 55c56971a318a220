"""``worldstep`` command line: ``rollout``, ``eval``, ``plan``, ``info``, ``stats``, ``bench``, ``train``,
``fidelity``, ``replay`` and ``export-pushsim``.

Every command parses its flags into config overrides and calls the SDK. Flags, files and the config are
checked before any model loads (``cli_checks``); an error is one line on stderr naming the flag or key, the
value and the allowed range (exit code 2; 1 for an unexpected failure, with the traceback under
``WORLDSTEP_TRACEBACK=1``). Ctrl-C prints one line, leaves no partial video and writes the summary JSON with
``"status": "interrupted"`` (exit code 130).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from .cli_checks import (
    RunInterrupted,
    RunRecord,
    check_episodes,
    check_image_flag,
    check_replay_length,
    parse_set,
    success_judge,
    success_name,
)
from .cli_flags import EvalFlags, InfoFlags, ModelFlags, PlanFlags, RolloutFlags, StatsFlags
from .cli_view import add_view_flags, closing_on_error, logged, open_from_args, wants_view
from .cli_view import finish as finish_view
from .flags import add_flags
from .lerobot.cli import add_parsers as add_lerobot_parsers
from .registration import WORLD_MODEL_IDS
from .serve.cli import add_parser as add_serve_parser


def _model_and_overrides(args: argparse.Namespace, **extra: Any) -> tuple[str, dict[str, Any]]:
    model = args.config or WORLD_MODEL_IDS[args.env]
    overrides = parse_set(args.set)
    for key in ("device", "prompt", "embodiment", "domain_id", "image", "context_frames"):
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    overrides.update({k: v for k, v in extra.items() if v is not None})
    return model, overrides


def _prepare(args: argparse.Namespace, **extra: Any):
    """(model, config): the config with every override applied and checked, the device and the first-frame
    image checked; no model is loaded. Commands hand the config itself to the SDK."""
    from .world import check_device, resolve_config

    model, overrides = _model_and_overrides(args, **extra)
    config = resolve_config(model).with_overrides(**overrides)
    if config.model.device != "auto":
        check_device(config.model.device)
    check_image_flag(getattr(args, "image", None))
    return model, config


def _run_info(args: argparse.Namespace, model: str, config) -> dict[str, Any]:
    """What a summary records about the run: enough to repeat it."""
    return {"command": args.command, "env": args.env if args.config is None else None, "config": model,
            "policy": args.policy, "seed": args.seed, "prompt": config.env.prompt, "domain_id": config.env.domain_id,
            "embodiment": config.env.embodiment,
            "image": getattr(args, "image", None), "success_judge": success_name(args.success, config),
            "set": parse_set(args.set)}


def _early_policy(args: argparse.Namespace, config):
    """The policy when the action shape can be read from the config (checks replay files and ``push``'s
    width before loading); None when only the loaded model knows the shape."""
    from .distributed import action_shape
    from .policies import make_policy

    shape = action_shape(config)
    return None if shape is None else make_policy(args.policy, shape, seed=args.seed)


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ModelFlags)


# --- rollout --------------------------------------------------------------------------------------


def cmd_rollout(args: argparse.Namespace) -> int:
    from .local import rollout
    from .policies import make_policy
    from .world import make_env

    if args.truth and args.image is not None:
        raise ValueError("--truth with --image is invalid; allowed: --truth alone (the simulator sets the first frame)")
    if args.truth and args.lerobot_out is not None:
        raise ValueError("--truth with --lerobot-out is invalid; allowed: one of them")
    _check_lerobot_out(args.lerobot_out)
    model, config = _prepare(args, max_windows=args.windows)
    success = success_judge(args.success, config)
    policy = _early_policy(args, config)
    check_replay_length(policy, args.windows, args.policy)
    summary = _summary_path(args)
    if args.truth:
        return _rollout_truth(args, model, config, policy, summary)
    record = RunRecord(summary, "--summary", **_run_info(args, model, config))
    viewer = open_from_args(args)
    with closing_on_error(viewer), record.guard(f"no video written ({args.out} unchanged)"):
        env = logged(make_env(config, success_fn=success), viewer)
        if args.lerobot_out is not None:
            from .lerobot.imagined import RecordLeRobot

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


def _check_lerobot_out(path: str | None) -> None:
    if path is not None and Path(path).exists():
        raise ValueError(f"--lerobot-out={path!r} is invalid: it exists; allowed: a folder that does not exist yet")


def _summary_path(args: argparse.Namespace) -> Path:
    """``--summary``, default ``--out`` with ``.json``; both checked as files to write."""
    from .outputs import check_output_path

    out = check_output_path(args.out, "--out")
    return check_output_path(args.summary if args.summary else out.with_suffix(".json"), "--summary")


def _rollout_truth(args: argparse.Namespace, model: str, config, policy, summary: Path) -> int:
    import gymnasium as gym

    from .policies import make_policy
    from .truth import rollout_with_truth
    from .world import make_env

    if config.env.simulator is None:
        raise ValueError(f"--truth is invalid for config {model!r}: its env.simulator is None; allowed: a config "
                         f"that names its simulator (e.g. --env worldstep/Pusher-v0)")
    if args.success not in (None, "sim"):
        raise ValueError(f"--success {args.success} is invalid with --truth; allowed: sim (both sides are judged "
                         "by the simulator's pixel judge)")
    record = RunRecord(summary, "--summary", **_run_info(args, model, config), simulator=config.env.simulator)
    viewer = open_from_args(args)
    with closing_on_error(viewer), record.guard(f"no video written ({args.out} unchanged)"):
        # the comparison runs every window: success is judged on both sides by rollout_with_truth, not by the env
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
                                        on_truth=None if viewer is None else env.log_truth)
        finally:
            env.close()
            if truth is not None:
                truth.close()
    summary_path = record.finish(**result.to_dict())
    psnr = ", ".join(f"{p:.1f}" for p in result.psnr_db)
    episode = result.episode
    print(f"{episode.video}: model | {config.env.simulator}, {episode.frames} frames in {episode.windows} windows, "
          f"{episode.wall_s:.1f} s; PSNR per window (dB) {psnr}; success model {result.model_success} / "
          f"simulator {result.truth_success}; summary {summary_path}")
    finish_view(viewer)
    return 0


# --- plan -----------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    import copy

    from .fidelity.policies import graded_policies
    from .planning import BlockToGoal, ModelPredictivePlanner, closed_loop
    from .world import make_env

    proposals = {p.name: p for p in graded_policies()}
    if args.proposal not in proposals:
        raise ValueError(f"--proposal {args.proposal!r} is invalid; allowed: one of {sorted(proposals)}")
    objective = BlockToGoal(approach_weight=args.approach_weight)
    model, config = _prepare(args, max_windows=args.windows)
    if config.env.simulator is None:
        raise ValueError(f"plan is invalid for config {model!r}: its env.simulator is None; allowed: a config that "
                         "names its simulator (e.g. --env worldstep/Pusher-v0)")
    summary = _summary_path(args)
    record = RunRecord(summary, "--summary", **_run_info(args, model, config), proposal=args.proposal,
                       candidates=args.candidates, observe=args.observe)
    viewer = open_from_args(args)
    with closing_on_error(viewer), record.guard(f"no video written ({args.out} unchanged)"):
        env = make_env(config, success_fn="none")  # the closed loop judges success (its confirm count)
        try:
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


# --- eval -----------------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import evaluate
    from .outputs import check_output_path
    from .policies import make_policy
    from .world import load, make_env

    path = Path(args.episodes)
    if path.is_dir():  # a LeRobot dataset: its recorded starts are the episodes
        from .lerobot.start_states import dataset_episodes

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
    model, config = _prepare(args)
    success = success_judge(args.success, config)
    policy = _early_policy(args, config)
    longest = max(ep.get("max_windows") or config.env.max_windows for ep in episodes)
    check_replay_length(policy, longest, args.policy)
    if args.lerobot_out is not None and args.ray:
        raise ValueError("--lerobot-out with --ray is invalid; allowed: a local eval")
    _check_lerobot_out(args.lerobot_out)
    if wants_view(args) and (args.ray or args.batched):
        raise ValueError("--rerun, --rerun-connect, --rerun-save and --rerun-serve are invalid with --ray or "
                         "--batched; allowed: an eval that steps one episode at a time")
    ray = {"backend": "ray", "ray_address": args.ray_address, "num_workers": args.workers} if args.ray else {}
    if args.ray:  # the actors load the model; the driver needs only its config
        from .distributed import driver_target

        target, shape = driver_target(config)
    else:
        target = load(config)
        shape = target.action_shape
    if policy is None:
        policy = make_policy(args.policy, shape, seed=args.seed)
        check_replay_length(policy, longest, args.policy)
    run = {**_run_info(args, model, config), "episodes_file": args.episodes}
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


# --- info -----------------------------------------------------------------------------------------


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_info(args: argparse.Namespace) -> int:
    import torch
    from worldstep.engine.models.cosmos3 import CheckpointNotFoundError

    from .memory import plan, plan_for_world, weights_from_architecture, weights_of_world
    from .world import load

    model, config = _prepare(args)
    out: dict[str, Any] = {"model": config.model.name, "checkpoint": config.model.checkpoint}
    try:
        world = load(config)
    except CheckpointNotFoundError as err:
        device = config.model.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        out.update(loaded=False, device=device, note=f"checkpoint not loaded, plan from model.architecture: {err}")
        weights = weights_from_architecture(config)
        memory = plan(config, windows=args.windows, text_tokens=args.text_tokens)
    else:
        spec = world.spec
        out.update(loaded=True, device=str(world.model.device), dtype=str(world.model.dtype).removeprefix("torch."),
                   frame=f"{spec.height}x{spec.width} @ {spec.fps:g} fps", action_dim=spec.action_dim,
                   num_domains=spec.num_domains, chunk_size=config.rollout.chunk_size)
        weights = weights_of_world(world)
        memory = plan_for_world(world, windows=args.windows)
    out["weights"] = None if weights is None else weights.to_dict()
    out["memory"] = memory.to_dict()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for key, value in out.items():
        if key not in ("memory", "weights"):
            print(f"{key:>12}: {value}")
    if weights is not None:
        how = "measured" if weights.measured else "estimated from model.architecture"
        print(f"weights ({weights.dtype}, {how}):")
        print(f"  transformer             {_bytes(weights.transformer_bytes)}")
        print(f"  vae                     {_bytes(weights.vae_bytes)}")
        print(f"  total                   {_bytes(weights.total_bytes)}")
    text = "measured" if memory.text_tokens_measured else "estimated, --text-tokens"
    cfg = "CFG, 2 streams" if memory.streams == 2 else "1 stream"
    context = f"{memory.context_frames} latent frames" if memory.context_frames else "unbounded"
    print("memory plan (KV cache):")
    print(f"  KV bytes per token      {memory.kv_bytes_per_token} ({_bytes(memory.kv_bytes_per_token)})")
    print(f"  page size               {memory.page_size} tokens = {_bytes(memory.page_bytes)}")
    print(f"  pages                   {memory.num_pages} = {_bytes(memory.pool_bytes)}")
    print(f"  prompt tokens           {memory.text_tokens} ({text})")
    print(f"  tokens per window       {memory.tokens_per_window} "
          f"({memory.tokens_per_frame} per latent frame + actions)")
    print(f"  context                 {context}, {cfg}")
    print(f"  pages per episode       {memory.peak_pages_per_episode} at peak over {memory.windows} windows "
          f"({_bytes(memory.peak_pages_per_episode * memory.page_bytes)})")
    print(f"  episodes per pool       {memory.episodes_per_pool}")
    if weights is not None:
        print(f"weights + KV pool         {_bytes(weights.total_bytes + memory.pool_bytes)} on {out['device']}")
    return 0


# --- stats ----------------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace) -> int:
    from worldstep.engine.models.cosmos3.action_stats import STAT_KEYS, ActionStats

    from .action_data import load_array_actions, load_lerobot_actions

    source = Path(args.source)
    if source.suffix in (".npy", ".npz"):
        rows, meta = load_array_actions(source, key=args.key), {"source": str(source)}
    else:
        rows, meta = load_lerobot_actions(source, column=args.column)
    if args.dims is not None:
        start, _, stop = args.dims.partition(":")
        if not (start.isdigit() and stop.isdigit() and int(start) < int(stop) <= rows.shape[1]):
            raise ValueError(f"--dims {args.dims!r} is invalid; allowed: START:STOP with 0 <= START < STOP <= "
                             f"{rows.shape[1]}")
        rows, meta["dims"] = rows[:, int(start):int(stop)], args.dims
    stats = ActionStats.compute(rows, metadata=meta)
    if args.out:
        stats.to_json(args.out)
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
        return 0
    print(f"{stats.metadata['count']} action rows, {stats.width} dimensions, from {source}")
    print("dim " + "".join(f"{k:>12}" for k in STAT_KEYS))
    for d in range(stats.width):
        print(f"{d:>3} " + "".join(f"{float(getattr(stats, k)[d]):>12.5g}" for k in STAT_KEYS))
    if args.out:
        print(f"wrote {args.out}")
    return 0


# --- train and fidelity (their own argument parsers) ---------------------------------------------


PASSTHROUGH = {"train": "worldstep.train", "fidelity": "worldstep.fidelity.report"}


def _add_passthrough(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    """Listed in `worldstep --help`; `main` hands the rest of the line to the module's own parser."""
    sub.add_parser(name, help=help_text, add_help=False)


def _run_module(name: str, argv: list[str]) -> int:
    importlib.import_module(PASSTHROUGH[name]).main(argv)
    return 0


# --- parser ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="worldstep", description="Drive a video world model like a simulator.")
    parser.add_argument("--version", action="version", version=f"worldstep {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("rollout", help="closed-loop rollout with a policy; writes an mp4 and a JSON summary")
    _add_model_flags(p)
    add_flags(p, RolloutFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("eval", help="evaluate a policy on episodes from a YAML file; writes report.json and mp4s")
    _add_model_flags(p)
    add_flags(p, EvalFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("plan", help="model-predictive planning in a world model (pusher), judged by its simulator")
    _add_model_flags(p)
    p.set_defaults(env="worldstep/Pusher-v0")
    add_flags(p, PlanFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_plan, policy="planner", success=None)

    p = sub.add_parser("info", help="model, device, weights and KV memory plan")
    _add_model_flags(p)
    add_flags(p, InfoFlags)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "stats", help="per-dimension action statistics (q01, q99, mean, std, min, max) for ActionNormalizer",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Arm embodiments (DROID, Bridge, fractal, UMI) take 10 numbers per step: the end-effector motion\n"
               "dT = T_t^-1 T_t+1 as translation (3) + the first two rotation columns (6), then the gripper;\n"
               "worldstep.action_data.relative_pose_actions builds them from absolute 4x4 poses.")
    add_flags(p, StatsFlags)
    p.set_defaults(func=cmd_stats)

    from .bench import add_parser as add_bench_parser

    add_bench_parser(sub)
    add_serve_parser(sub, _add_model_flags, _model_and_overrides)
    add_lerobot_parsers(sub, add_view_flags)
    _add_passthrough(sub, "train", "train a small Cosmos3 world model on simulator clips (resumable; see --help)")
    _add_passthrough(sub, "fidelity", "fidelity report: world model vs simulator, PSNR/SSIM/object error, ranking")
    return parser


# Errors a user can fix from the message alone: flags, files, config keys and values (exit code 2).
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
               ImportError, IndexError, yaml.YAMLError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        return _run_module(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RunInterrupted as err:
        print(f"worldstep {args.command}: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"worldstep {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if os.environ.get("WORLDSTEP_TRACEBACK"):
            raise
        user_error = isinstance(err, USER_ERRORS)
        hint = "" if user_error else " (unexpected; set WORLDSTEP_TRACEBACK=1 to see the traceback)"
        print(f"worldstep {args.command}: error: {_one_line(err)}{hint}", file=sys.stderr)
        return 2 if user_error else 1


def _one_line(err: BaseException) -> str:
    """The error's message on one line (a config error with several problems joins them with '; ')."""
    text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return text if isinstance(err, (ValueError, TypeError, FileNotFoundError)) else f"{type(err).__name__}: {text}"


if __name__ == "__main__":
    sys.exit(main())
