r"""Before/after of a restructuring, the two trees side by side in one run.

    python tests/perf/structure_ab.py [--before 24fc7b5] [--rounds 15] [--json docs/bench/ab/structure.json]
    python tests/perf/structure_ab.py --before eeec8ae --json docs/bench/ab/structure_four.json  # the engine loop
                                                                    # in engine/, one step path, the KV by composition

Checks the ``--before`` revision out into a temporary worktree and starts one worker process per tree, each
importing worldstep from its own tree (the editable install's package map pointed at that tree). Each worker
counts, once: worldstep calls per generation layer (`layer_calls.py`, Tiny and Edge shapes) and one Tiny
``env.step``'s distinct worldstep functions and total worldstep calls (`trace_step.py`). Then the rounds
alternate between the workers (before, after, before, ...), so both trees see the same load: each round times
one Tiny ``env.step`` (wall and process CPU) and one batched step of a vector env of 8 Tiny envs, whose Python
overhead is the step's share outside denoise, commit and decode (the ``timings`` the envs report). Prints the
medians and their ratios. Not a pytest module: it measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PERF = Path(__file__).resolve().parent


def worker(tree: str) -> None:
    """Serve one tree: its counts first, then one JSON line of timings per line read from stdin."""
    import __editable___worldstep_0_1_0_finder as finder

    finder.MAPPING.update({"worldstep": f"{tree}/sdk", "worldstep.configs": f"{tree}/configs",
                           "worldstep.engine": f"{tree}/engine", "worldstep.envs": f"{tree}/envs"})
    sys.path.insert(0, str(PERF))
    import gymnasium as gym
    import numpy as np
    import torch
    import worldstep
    from layer_calls import calls_per_layer
    from trace_step import tiny_env, trace_env_step

    torch.set_num_threads(1)
    assert worldstep.__file__.startswith(tree), worldstep.__file__
    env = tiny_env()
    action = np.zeros(env.action_space.shape, env.action_space.dtype)
    calls, folders = [], tuple(f"{tree}/{folder}/" for folder in ("sdk", "envs", "engine"))

    def count(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(folders):
            calls.append(1)

    trace = trace_env_step(env, action)
    sys.setprofile(count)
    env.step(action)
    sys.setprofile(None)
    vec = gym.make_vec("worldstep/Tiny-v0", num_envs=8)
    vec.reset(seed=0)
    vec_action = np.zeros(vec.action_space.shape, vec.action_space.dtype)
    vec.step(vec_action)
    counts = {"layer_calls": {c: calls_per_layer(c)["per_layer"] for c in ("tiny", "edge")},
              "step_functions": trace.functions, "step_calls": len(calls)}
    print(json.dumps(counts), flush=True)
    for _ in sys.stdin:
        wall, cpu = time.perf_counter(), time.process_time()
        _, _, terminated, truncated, _ = env.step(action)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if terminated or truncated:
            env.reset(seed=0)
        _, _, term, trunc, info = vec.step(vec_action)
        t = info["timings"]
        phases = float(np.sum(t["denoise_s"] + t["commit_s"] + t["decode_s"] + t["other_s"]))
        print(json.dumps({"step_ms": 1e3 * wall, "step_cpu_ms": 1e3 * cpu,
                          "overhead_at_8": float(np.sum(t["other_s"])) / phases}), flush=True)
        if (term | trunc).any():
            vec.reset(seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="24fc7b5", help="git revision of the tree to compare against")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    from worldstep.bench.machine import describe_machine, load_average

    machine = describe_machine()
    scratch = Path(tempfile.mkdtemp()) / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(scratch), args.before], cwd=ROOT, check=True,
                   capture_output=True)
    trees = {"before": str(scratch), "after": str(ROOT)}
    procs, counts, samples = {}, {}, {name: [] for name in trees}
    try:
        for name, tree in trees.items():
            procs[name] = subprocess.Popen([sys.executable, __file__, "--worker", tree], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True)
            counts[name] = json.loads(procs[name].stdout.readline())
        for r in range(args.warmup + args.rounds):
            for name, proc in procs.items():
                proc.stdin.write("step\n")
                proc.stdin.flush()
                sample = json.loads(proc.stdout.readline())
                if r >= args.warmup:
                    samples[name].append(sample)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
        subprocess.run(["git", "worktree", "remove", "--force", str(scratch)], cwd=ROOT, check=False)
    medians = {name: {k: statistics.median(s[k] for s in rows) for k in rows[0]} for name, rows in samples.items()}
    result = {"before": args.before, "rounds": args.rounds, "machine": machine, "counts": counts, "medians": medians,
              "step_ms_ratio_before_over_after": medians["before"]["step_ms"] / medians["after"]["step_ms"],
              "step_cpu_ms_ratio_before_over_after": medians["before"]["step_cpu_ms"] / medians["after"]["step_cpu_ms"]}
    machine["load_average_end"] = load_average()
    for name in trees:
        c, m = counts[name], medians[name]
        print(f"{name:6}: calls per layer tiny {c['layer_calls']['tiny']:g}, edge {c['layer_calls']['edge']:g}; "
              f"Tiny env.step {c['step_functions']} functions, {c['step_calls']} calls, {m['step_ms']:.1f} ms "
              f"({m['step_cpu_ms']:.1f} CPU ms); Python overhead at N=8 {100 * m['overhead_at_8']:.2f}%")
    print(f"Tiny env.step, before / after: {result['step_ms_ratio_before_over_after']:.3f}x wall, "
          f"{result['step_cpu_ms_ratio_before_over_after']:.3f}x CPU")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
