"""The ``worldstep`` command: every subcommand's parser, and ``main``, which runs one and turns its errors into
one line and an exit code.

Every command parses its flags into config overrides and calls the SDK. Flags, files and the config are
checked before any model loads (``checks``); an error is one line on stderr naming the flag or key, the
value and the allowed range (exit code 2; 1 for an unexpected failure, with the traceback under
``WORLDSTEP_TRACEBACK=1``). Ctrl-C prints one line, leaves no partial video and writes the summary JSON with
``"status": "interrupted"`` (exit code 130).
"""

from __future__ import annotations

import argparse
import os
import sys

import yaml

from ..episodes import EvaluationFailed
from ..flags import add_flags
from ..serve.cli import add_parser as add_serve_parser
from .checks import RunInterrupted
from .common import add_model_flags, model_and_overrides
from .evaluation import EvalFlags, cmd_eval
from .info import InfoFlags, cmd_info
from .plan import PlanFlags, cmd_plan
from .replay import add_parser as add_replay_parser
from .rollout import RolloutFlags, cmd_rollout
from .stats import StatsFlags, cmd_stats
from .view import add_view_flags

# The studies' commands (train, fidelity, and below bench and export-pushsim) are research: this dispatcher is the
# one product module that names them (tests/test_parts.py), and only hands them the command line.
PASSTHROUGH = ("train", "fidelity")


def _add_passthrough(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    """Listed in `worldstep --help`; `main` hands the rest of the line to the module's own parser."""
    sub.add_parser(name, help=help_text, add_help=False)


def _run_module(name: str, argv: list[str]) -> int:
    if name == "train":
        from ..train import main
    else:
        from ..fidelity.report import main
    main(argv)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="worldstep", description="Drive a video world model like a simulator.")
    parser.add_argument("--version", action="version", version=f"worldstep {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("rollout", help="closed-loop rollout with a policy; writes an mp4 and a JSON summary")
    add_model_flags(p)
    add_flags(p, RolloutFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("eval", help="evaluate a policy on episodes from a YAML file; writes report.json and mp4s")
    add_model_flags(p)
    add_flags(p, EvalFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("plan", help="model-predictive planning in a world model (pusher), judged by its simulator")
    add_model_flags(p)
    p.set_defaults(env="worldstep/Pusher-v0")
    add_flags(p, PlanFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_plan, policy="planner", success=None)

    p = sub.add_parser("info", help="model, device, weights and KV memory plan")
    add_model_flags(p)
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

    from ..bench import add_parser as add_bench_parser
    from ..fidelity.lerobot_export import add_parser as add_export_parser

    add_bench_parser(sub)
    add_serve_parser(sub, add_model_flags, model_and_overrides)
    add_replay_parser(sub, add_view_flags)
    add_export_parser(sub)
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
    except EvaluationFailed as err:
        print(f"worldstep {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 1
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
