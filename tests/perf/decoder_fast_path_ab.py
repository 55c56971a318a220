r"""Before/after of the decoder's CPU fast path (issue #13 section 3), measured side by side in one process.

    python tests/perf/decoder_fast_path_ab.py --arch tiny --size 256 --rounds 20 \
        [--before 4dd0bb5] [--json docs/bench/ab/decoder_fast_path.json]

Two copies of the same bench model (tiny: 256x256, 4 actions, 4 denoise steps, context 4) step the same actions
interleaved, with one intra-op thread: "before" decodes through `engine/vae/perf.py` as it was at commit
`--before` (oneDNN convs only, read from git history), "after" through this tree's (oneDNN convs padded inside
the conv, the fused RMS norm). Prints median wall and process-CPU ms per env step and per decode, their ratios,
and how far apart the frames are (uint8 levels). Not a pytest module: it measures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import worldstep.engine.vae.decoder as decoder_module
from worldstep.bench.archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
from worldstep.bench.machine import describe_machine, load_average
from worldstep.bench.measure import interleave, median, ratio

ROOT = Path(__file__).resolve().parents[2]


def _old_perf(rev: str):
    """`engine/vae/perf.py` at git revision `rev`, imported as a stand-alone module."""
    source = subprocess.run(["git", "show", f"{rev}:engine/vae/perf.py"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout
    path = Path(tempfile.mkdtemp()) / "perf_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("perf_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="tiny")
    parser.add_argument("--size", type=int, default=256, help="frame height and width")
    parser.add_argument("--steps", type=int, default=4, help="denoise steps per window")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--before", default="4dd0bb5", help="git revision of the decoder copy to compare against")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)

    machine = describe_machine()
    arch = bench_arch(args.arch)
    after = load_model(arch, height=args.size, width=args.size)
    current = decoder_module.decoder_copy
    decoder_module.decoder_copy = _old_perf(args.before).decoder_copy  # only while "before" builds its decoder
    try:
        before = load_model(arch, height=args.size, width=args.size)
    finally:
        decoder_module.decoder_copy = current
    knobs = rollout_knobs(arch, args.steps, 4)
    chunks = action_chunks(args.warmup + args.rounds, arch)
    runs = {"before": (before, open_session(before, arch, knobs)), "after": (after, open_session(after, arch, knobs))}
    decode_ms: dict[str, list[float]] = {name: [] for name in runs}
    frames: dict[str, list[np.ndarray]] = {name: [] for name in runs}

    def step(name: str):
        model, session = runs[name]

        def run() -> None:
            r = model.step([session], [chunks[session.window_index]])[0]
            decode_ms[name].append(1e3 * r.timings.decode_s)
            frames[name].append(r.frames)

        return run

    samples = interleave({name: step(name) for name in runs}, rounds=args.rounds, warmup=args.warmup)
    levels = max(int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())
                 for a, b in zip(frames["before"], frames["after"]))
    figures = {
        "arch": args.arch, "size": args.size, "num_steps": args.steps, "before": args.before,
        "ms_per_step": {n: s.median_ms for n, s in samples.items()},
        "cpu_ms_per_step": {n: s.median_cpu_ms for n, s in samples.items()},
        "decode_ms": {n: median(v[args.warmup:]) for n, v in decode_ms.items()},
        "max_uint8_levels_apart": levels, "machine": {**machine, "load_average_end": load_average()},
    }
    figures["speedup"] = ratio(figures["ms_per_step"]["before"], figures["ms_per_step"]["after"])
    figures["cpu_speedup"] = ratio(figures["cpu_ms_per_step"]["before"], figures["cpu_ms_per_step"]["after"])
    figures["decode_speedup"] = ratio(figures["decode_ms"]["before"], figures["decode_ms"]["after"])
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
