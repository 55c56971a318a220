"""`worldstep bench <rollout|decode|vector|soak|gpu|profile|view> [--json PATH] [size flags]`.

Flags are generated from the settings dataclasses by `worldstep.flags` (one flag per field, `--num-steps 2`,
lists as `--sizes 1,2,4`), so the CLI holds no bench logic. Tables go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..flags import add_flags, flag, from_namespace
from .results import BenchResult, render_table
from .serve import ServeSettings
from .settings import (
    DecodeSettings,
    GpuSettings,
    ProfileSettings,
    RolloutSettings,
    SoakSettings,
    VectorSettings,
    ViewSettings,
)

_BENCHES: dict[str, tuple[type, str, str]] = {  # name -> (settings, "module:function", help)
    "rollout": (RolloutSettings, "rollout:run_rollout",
                "ms per env step: the diffusers recipe as shipped, with worldstep's kernels, and worldstep kv"),
    "decode": (DecodeSettings, "decode:run_decode",
               "warm streaming decode vs the stateless context re-decode and the whole-clip re-decode"),
    "vector": (VectorSettings, "vector:run_vector", "env steps/s of N batched sessions vs N sessions one by one"),
    "soak": (SoakSettings, "soak:run_soak", "KV pages and RSS over a long bounded-context rollout"),
    "gpu": (GpuSettings, "gpu:run_gpu", "CUDA: Cosmos3-Edge ms per denoise step / commit / decode, MFU, RTF"),
    "profile": (ProfileSettings, "profiling:run_profile", "where a window's time goes (torch.profiler, cProfile)"),
    "view": (ViewSettings, "view:run_view", "RerunLogger's overhead per env step (needs the view extra)"),
    "serve": (ServeSettings, "serve:run_serve", "env steps/s of client processes through `worldstep serve` vs local "
                                                "envs and the vector env; per-step overhead; pages over many cycles"),
}


@dataclass
class BenchFlags:
    """What every bench takes beside its settings."""

    json: str | None = flag("write the figures to PATH", default=None, metavar="PATH")
    quiet: bool = flag("no progress lines on stderr", default=False)
    threads: int | None = flag("torch intra-op threads (default: torch's, the core count)", default=None)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `bench` with its subcommands to a CLI's subparsers; `args.func(args)` runs the bench."""
    bench = subparsers.add_parser("bench", help="measured speed against the alternatives (tables; --json PATH)")
    _fill(bench)
    return bench


def _fill(bench: argparse.ArgumentParser) -> None:
    sub = bench.add_subparsers(dest="bench", required=True)
    for name, (cls, _, text) in _BENCHES.items():
        p = sub.add_parser(name, help=text, description=text)
        add_flags(p, BenchFlags)
        add_flags(p, cls)
        p.set_defaults(func=run_command, bench=name)


def run_command(args: argparse.Namespace) -> int:
    """Run the bench `args.bench`, print its tables and notes, write `--json`."""
    import importlib
    import time

    import torch

    from .machine import load_average
    from .progress import Progress

    cls, target, _ = _BENCHES[args.bench]
    wall, cpu = time.perf_counter(), time.process_time()
    previous = torch.get_num_threads()
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads} is invalid; allowed: an int >= 1")
        torch.set_num_threads(args.threads)
    try:
        settings = from_namespace(cls, args)
        module, function = target.split(":")
        run = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        result: BenchResult = run(settings, Progress(args.bench, quiet=args.quiet))
    finally:
        torch.set_num_threads(previous)
    # process CPU seconds: with --threads 1, about what the run takes on an idle core
    result.machine.update(load_average_end=load_average(), run_wall_s=round(time.perf_counter() - wall, 1),
                          run_cpu_s=round(time.process_time() - cpu, 1))
    print(format_result(result))
    if args.json:
        path = result.write_json(args.json)
        print(f"\nfigures written to {path}")
    return 1 if isinstance(result.results, dict) and result.results.get("errors") else 0  # a section failed


def format_result(result: BenchResult) -> str:
    parts = [render_table(t) for t in result.tables]
    parts += [f"note: {n}" for n in result.notes]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worldstep bench", description="worldstep benchmarks")
    _fill(parser)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"worldstep bench {args.bench}: error: {err}", file=sys.stderr)
        return 2

