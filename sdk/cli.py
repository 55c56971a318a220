"""``worldstep`` command line: ``rollout``, ``eval``, ``plan``, ``info`` and ``bench``.

Every command parses its flags into config overrides and calls the SDK; bad values come back as the
SDK's errors (``ConfigError``/``ValueError`` naming the key, value and allowed range) with exit code 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import inspect
import json
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml
from worldstep.envs.registration import ENV_IDS

DEFAULT_ENV = "worldstep/Tiny-v0"


def _parse_set(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, values read as YAML scalars (``num_steps=2``, ``warm_cache=false``)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} is invalid; allowed: KEY=VALUE, e.g. --set num_steps=2")
        overrides[key] = yaml.safe_load(value) if value else ""
    return overrides


def _model_and_overrides(args: argparse.Namespace, **extra: Any) -> tuple[str, dict[str, Any]]:
    model = args.config or ENV_IDS[args.env][0]
    overrides = _parse_set(args.set)
    for key in ("device", "prompt", "domain_id", "image", "context_frames"):
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    overrides.update({k: v for k, v in extra.items() if v is not None})
    return model, overrides


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--env", default=DEFAULT_ENV, choices=sorted(ENV_IDS),
                       help=f"registered env id whose config to use (default {DEFAULT_ENV})")
    group.add_argument("--config", help="config name (tiny, cosmos3_edge), .yaml path, checkpoint folder or hub id")
    parser.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: the config's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, e.g. --set num_steps=2 --set num_pages=64 (repeatable)")


# --- dataclass flags (examples) ------------------------------------------------------------------


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass body (cleanrl's ``Args`` style)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body, docs = tree.body[0].body, {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = after.value.value
    return docs


def parse_dataclass_args(cls: type, argv: list[str] | None = None):
    """Parse ``--flag value`` pairs into dataclass ``cls``; each field's docstring is its ``--help``.

    ``bool`` fields get ``--flag/--no-flag``; ``X | None`` fields take an ``X`` and default to None.
    """
    parser = argparse.ArgumentParser(description=(cls.__doc__ or "").strip())
    docs, hints = _field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        kind = next((t for t in typing.get_args(kind) if t is not type(None)), kind)  # X | None -> X
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = docs.get(f.name, "") + ("" if default is None else f" (default: {default})")
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=kind, default=default, help=help_text)
    return cls(**vars(parser.parse_args(argv)))


# --- rollout --------------------------------------------------------------------------------------


def cmd_rollout(args: argparse.Namespace) -> int:
    from .evaluate import rollout
    from .policies import make_policy
    from .world import make_env

    model, overrides = _model_and_overrides(args, max_windows=args.windows)
    if args.truth:
        return _rollout_truth(args, model, overrides)
    env = make_env(model, **overrides)
    try:
        policy = make_policy(args.policy, env.action_space, seed=args.seed)
        result = rollout(env, policy, seed=args.seed, max_windows=args.windows, video_path=args.out,
                         progress=not args.quiet)
    finally:
        env.close()
    summary_path = _write_summary(args, model, **vars(result))
    print(f"{result.video}: {result.frames} frames in {result.windows} windows, {result.wall_s:.1f} s "
          f"({result.frames_per_second:.1f} frames/s), return {result.episode_return:g}, "
          f"success {result.success}; summary {summary_path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import copy

    from .fidelity.policies import graded_policies
    from .planning import BlockToGoal, ModelPredictivePlanner, closed_loop
    from .world import make_env

    proposals = {p.name: p for p in graded_policies()}
    if args.proposal not in proposals:
        raise ValueError(f"--proposal {args.proposal!r} is invalid; allowed: one of {sorted(proposals)}")
    model, overrides = _model_and_overrides(args, max_windows=args.windows)
    env = make_env(model, **overrides)
    try:
        planner = ModelPredictivePlanner(env, copy.deepcopy(proposals[args.proposal]), args.candidates,
                                         BlockToGoal(approach_weight=args.approach_weight))
        result = closed_loop(env, planner, seed=args.seed, max_windows=args.windows, observe=args.observe,
                             video_path=args.out)
        base = None
        if args.compare:
            base = closed_loop(env, copy.deepcopy(proposals[args.proposal]), seed=args.seed, max_windows=args.windows,
                               observe="simulator")
    finally:
        env.close()
    figures = {k: v for k, v in vars(result).items() if k != "actions"}
    summary = _write_summary(args, model, **figures, proposal=args.proposal, candidates=args.candidates,
                             actions=[a.tolist() for a in result.actions],
                             base_sim_success=None if base is None else base.sim_success)
    line = (f"{result.video}: planner ({args.candidates} x {args.proposal}, observing the {args.observe}) "
            f"{result.windows} windows; simulator success {result.sim_success}")
    if result.model_success is not None:
        line += f", model success {result.model_success}"
    if base is not None:
        line += f"; {args.proposal} alone on the simulator: success {base.sim_success}"
    print(f"{line}; summary {summary}")
    return 0


def _write_summary(args: argparse.Namespace, model: str, **figures: Any) -> Path:
    """The rollout's JSON summary at ``--summary`` (default: ``--out`` with ``.json``)."""
    summary = {"env": args.env if args.config is None else None, "config": model, "policy": args.policy, **figures}
    path = Path(args.summary) if args.summary else Path(args.out).with_suffix(".json")
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def _rollout_truth(args: argparse.Namespace, model: str, overrides: dict[str, Any]) -> int:
    import gymnasium as gym

    from .policies import make_policy
    from .truth import rollout_with_truth
    from .world import make_env

    if args.image is not None:
        raise ValueError("--truth with --image is invalid; allowed: --truth alone (the simulator sets the first frame)")
    env = make_env(model, **overrides)
    truth = None
    try:
        if env.simulator is None:
            raise ValueError(f"--truth is invalid for config {model!r}: its env.simulator is None; allowed: a config "
                             f"that names its simulator (e.g. --env worldstep/Pusher-v0)")
        truth = gym.make(env.simulator, chunk_size=env.knobs.chunk_size, disable_env_checker=True).unwrapped
        policy = make_policy(args.policy, env.action_space, seed=args.seed)
        result = rollout_with_truth(env, truth, policy, seed=args.seed, max_windows=args.windows,
                                    video_path=args.out, progress=not args.quiet)
    finally:
        env.close()
        if truth is not None:
            truth.close()
    summary_path = _write_summary(args, model, simulator=env.simulator, **vars(result),
                                  mean_psnr_db=result.mean_psnr_db)
    psnr = ", ".join(f"{p:.1f}" for p in result.psnr_db)
    print(f"{result.video}: model | {env.simulator}, {result.frames} frames in {result.windows} windows, "
          f"{result.wall_s:.1f} s; PSNR per window (dB) {psnr}; success model {result.model_success} / "
          f"simulator {result.truth_success}; summary {summary_path}")
    return 0


# --- eval -----------------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import evaluate
    from .policies import make_policy
    from .world import load

    data = yaml.safe_load(Path(args.episodes).read_text())
    episodes = data.get("episodes") if isinstance(data, dict) else data
    model, overrides = _model_and_overrides(args)
    ray = {"backend": "ray", "ray_address": args.ray_address, "num_workers": args.workers} if args.ray else {}
    if args.ray:  # the actors load the model; the driver needs only its config
        from .distributed import driver_target

        target, shape = driver_target(model, **overrides)
    else:
        target = load(model, **overrides)
        shape = target.action_shape
    policy = make_policy(args.policy, shape, seed=args.seed)
    report = evaluate(target, policy, episodes, out_dir=args.out_dir, batched=args.batched,
                      batch_size=args.batch_size, seed=args.seed, record_video=not args.no_video,
                      progress=not args.quiet, **ray)
    failed = sum(e.status == "failed" for e in report.episodes)
    print(f"{len(report.episodes)} episodes: success rate {report.success_rate:.2f}, "
          f"mean return {report.mean_return:g}" + (f", {failed} failed" if failed else "")
          + f"; report {Path(args.out_dir) / 'report.json'}")
    return 0


# --- info -----------------------------------------------------------------------------------------


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_info(args: argparse.Namespace) -> int:
    from worldstep.engine.models.cosmos3 import CheckpointNotFoundError

    from .memory import plan, plan_for_world
    from .world import load, resolve_config

    model, overrides = _model_and_overrides(args)
    config = resolve_config(model).with_overrides(**overrides)
    out: dict[str, Any] = {"model": config.model.name, "checkpoint": config.model.checkpoint}
    try:
        world = load(config)
    except CheckpointNotFoundError as err:
        out["loaded"] = False
        out["note"] = f"checkpoint not loaded, plan from model.architecture: {err}"
        memory = plan(config, windows=args.windows, text_tokens=args.text_tokens)
    else:
        spec = world.spec
        out.update(loaded=True, device=str(world.model.device), dtype=str(world.model.dtype).removeprefix("torch."),
                   frame=f"{spec.height}x{spec.width} @ {spec.fps:g} fps", action_dim=spec.action_dim,
                   num_domains=spec.num_domains, chunk_size=config.rollout.chunk_size)
        memory = plan_for_world(world, windows=args.windows)
    out["memory"] = memory.to_dict()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for key, value in out.items():
        if key != "memory":
            print(f"{key:>12}: {value}")
    text = "measured" if memory.text_tokens_measured else "estimated, --text-tokens"
    cfg = "CFG, 2 streams" if memory.streams == 2 else "1 stream"
    context = f"{memory.context_frames} latent frames" if memory.context_frames else "unbounded"
    print("memory plan:")
    print(f"  KV bytes per token      {memory.kv_bytes_per_token} ({_bytes(memory.kv_bytes_per_token)})")
    print(f"  page size               {memory.page_size} tokens = {_bytes(memory.page_bytes)}")
    print(f"  pages                   {memory.num_pages} = {_bytes(memory.pool_bytes)}")
    print(f"  prompt tokens           {memory.text_tokens} ({text})")
    print(f"  tokens per window       {memory.tokens_per_window} ({memory.tokens_per_frame} per latent frame + actions)")
    print(f"  context                 {context}, {cfg}")
    print(f"  pages per episode       {memory.peak_pages_per_episode} at peak over {memory.windows} windows "
          f"({_bytes(memory.peak_pages_per_episode * memory.page_bytes)})")
    print(f"  episodes per pool       {memory.episodes_per_pool}")
    return 0


# --- bench ----------------------------------------------------------------------------------------


def _add_bench(sub: argparse._SubParsersAction) -> None:
    """``worldstep bench`` lives in ``sdk/bench.py`` (``add_parser(subparsers)``); a stub until it lands."""
    if importlib.util.find_spec("worldstep.bench") is not None:
        importlib.import_module("worldstep.bench").add_parser(sub)
        return
    bench = sub.add_parser("bench", help="benchmarks (not available yet)")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=lambda args: _unavailable("bench"))


def _unavailable(name: str) -> int:
    print(f"worldstep {name} is not available yet in this version (sdk/bench.py has not landed).", file=sys.stderr)
    return 2


# --- train and fidelity (their own argument parsers) ---------------------------------------------


PASSTHROUGH = {"train": "worldstep.train", "fidelity": "worldstep.fidelity"}


def _add_passthrough(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    """Listed in `worldstep --help`; `main` hands the rest of the line to the module's own parser."""
    sub.add_parser(name, help=help_text, add_help=False)


def _run_module(module: str, argv: list[str]) -> int:
    importlib.import_module(module).main(argv)
    return 0


# --- parser ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="worldstep", description="Drive a video world model like a simulator.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("rollout", help="closed-loop rollout with a policy; writes an mp4 and a JSON summary")
    _add_model_flags(p)
    p.add_argument("--policy", default="sine", help="sine, random, push (PushSim's pixel expert) or replay:PATH.npy "
                                                    "(default sine)")
    p.add_argument("--windows", type=int, default=8, help="windows to generate (default 8)")
    p.add_argument("--truth", action="store_true",
                   help="step the model's simulator (config env.simulator) with the same actions; the mp4 shows "
                        "model | simulator side by side and the summary holds PSNR per window")
    p.add_argument("--out", default="rollout.mp4", help="mp4 path (default rollout.mp4)")
    p.add_argument("--summary", help="JSON summary path (default: --out with .json)")
    p.add_argument("--seed", type=int, default=0, help="reset seed (default 0)")
    p.add_argument("--prompt", help="text prompt (default: the config's)")
    p.add_argument("--domain-id", dest="domain_id", type=int, help="embodiment domain (default: the config's)")
    p.add_argument("--image", help="first frame image path (default: a drawn tabletop scene)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("eval", help="evaluate a policy on episodes from a YAML file; writes report.json and mp4s")
    p.add_argument("episodes", help="YAML: a list of episodes (seed, prompt, domain_id, image, max_windows) "
                                    "or a mapping with an 'episodes' list")
    _add_model_flags(p)
    p.add_argument("--policy", default="sine", help="sine, random or replay:PATH.npy (default sine)")
    p.add_argument("--out-dir", default="runs/eval", help="report and video folder (default runs/eval)")
    p.add_argument("--batched", action="store_true", help="step episodes together in one vector env")
    p.add_argument("--batch-size", type=int, help="episodes per batch (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of episodes without one: seed + index")
    p.add_argument("--no-video", action="store_true", help="skip the mp4 files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--ray", action="store_true",
                   help="shard episodes over Ray actors, one model each (pip install 'worldstep[dist]')")
    p.add_argument("--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else a new local one)")
    p.add_argument("--workers", type=int, default=2, help="Ray actors with --ray (default 2)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("info", help="model, device and KV memory plan")
    _add_model_flags(p)
    p.add_argument("--windows", type=int, default=32, help="episode length for the plan (default 32)")
    p.add_argument("--context-frames", dest="context_frames", type=int,
                   help="committed latent frames kept in context (default: the config's)")
    p.add_argument("--text-tokens", type=int, default=256,
                   help="prompt tokens assumed when the checkpoint cannot be loaded (default 256)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("plan", help="model-predictive planning in a world model (pusher), judged by its simulator")
    _add_model_flags(p)
    p.set_defaults(env="worldstep/Pusher-v0")
    p.add_argument("--proposal", default="noisy0.8",
                   help="graded pusher policy whose chunks the planner scores (default noisy0.8; see "
                        "worldstep.fidelity.policies.graded_policies)")
    p.add_argument("--candidates", type=int, default=8, help="chunks imagined per window (default 8)")
    p.add_argument("--approach-weight", type=float, default=0.0,
                   help="weight of the effector-to-block distance in the cost (default 0)")
    p.add_argument("--observe", choices=["model", "simulator"], default="model",
                   help="model: act on imagined frames, the simulator replays (default); simulator: re-anchor the "
                        "model on the simulator's frame every window (MPC)")
    p.add_argument("--windows", type=int, default=16, help="windows per episode (default 16)")
    p.add_argument("--seed", type=int, default=0, help="reset seed (default 0)")
    p.add_argument("--compare", action="store_true", help="also run the proposal policy alone on the simulator")
    p.add_argument("--out", default="plan.mp4", help="mp4: what the planner saw | simulator (default plan.mp4)")
    p.add_argument("--summary", help="JSON summary path (default: --out with .json)")
    p.set_defaults(func=cmd_plan, policy="planner")

    _add_bench(sub)
    _add_passthrough(sub, "train", "train a small Cosmos3 world model on simulator clips (resumable; see --help)")
    _add_passthrough(sub, "fidelity", "fidelity report: world model vs simulator, PSNR/SSIM/object error, ranking")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        return _run_module(PASSTHROUGH[argv[0]], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, IndexError, ImportError) as err:
        print(f"worldstep {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
