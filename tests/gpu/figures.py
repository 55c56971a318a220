"""What every GPU check shares: its command line, where its figures go, how it compares, how it exits.

Each check runs on CUDA by default and exits 1 when CUDA is missing: a check that measured nothing has
not passed. `--device cpu` (the kit's dry run) runs the same code path at `--tiny` size instead; the
figures then say `"dry_run": true` and compare only what a CPU can run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from worldstep.engine.devices import canonical_device


def parse_args(description: str, argv: list[str] | None = None, extra=None) -> argparse.Namespace:
    """The shared flags; `extra(parser)` adds a check's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (the real check) or cpu (dry run: code paths only)")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the dry run)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu", help="folder for the JSON figures")
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


def resolve_device(args: argparse.Namespace) -> torch.device | None:
    """The device to run on (canonical: ``cuda:<current>``), or None (after saying why) when CUDA was asked for
    and is not there."""
    try:
        return canonical_device(args.device, name="--device")
    except ValueError as err:
        print(f"{err}: nothing checked (use --device cpu for the dry run)", file=sys.stderr)
        return None


def write(out: str | os.PathLike, name: str, doc: dict[str, Any]) -> Path:
    """`<out>/<name>.json`, with the device it ran on; rewritten as a check goes, so a timeout keeps what ran."""
    from worldstep.outputs import write_json

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    doc = {"check": name, "device_name": device, "torch": torch.__version__, **doc}
    return write_json(Path(out) / f"{name}.json", doc, indent=1)


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in float32; inf when either holds a NaN or an inf (never NaN, so `<=` works)."""
    a, b = a.float(), b.float()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    scale = b.abs().max().clamp_min(1e-12)
    return float(((a - b).abs().max() / scale).item())


def within(value: float, bound: float) -> bool:
    """`value <= bound` for a finite value only (a NaN or inf figure never passes)."""
    return math.isfinite(value) and value <= bound


class Timer:
    """Wall seconds of a block, synchronising CUDA around it so queued kernels are counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = canonical_device(device)
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        self._sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
