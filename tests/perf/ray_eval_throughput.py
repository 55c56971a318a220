"""Episodes per second of `worldstep.evaluate`: local vs Ray with 1 and 2 workers (issue #8's figures).

    python tests/perf/ray_eval_throughput.py --episodes 16 --windows 3 --size 128 --steps 4

Ray is started once; each Ray run includes starting its actors and loading the model on them. Needs the
`dist` extra. Not a pytest module: it measures, it asserts only that the three runs agree episode by episode.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
import worldstep  # noqa: E402
from worldstep.policies import SinePolicy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--size", type=int, default=128, help="frame height and width")
    parser.add_argument("--steps", type=int, default=4, help="denoise steps per window")
    args = parser.parse_args()

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024**2, log_to_driver=False)
    world = worldstep.load("tiny", device="cpu", height=args.size, width=args.size, num_steps=args.steps)
    episodes = [{"seed": i, "max_windows": args.windows} for i in range(args.episodes)]
    policy = SinePolicy(world.action_shape)
    results = {}
    for name, kwargs in [("local", {}), ("ray, 1 worker", {"backend": "ray", "num_workers": 1}),
                         ("ray, 2 workers", {"backend": "ray", "num_workers": 2})]:
        start = time.perf_counter()
        report = worldstep.evaluate(world, policy, episodes, out_dir=f"runs/ray_throughput/{name.replace(' ', '')}",
                                    progress=False, record_video=False, **kwargs)
        wall = time.perf_counter() - start
        results[name] = [(e.windows, e.frames, e.episode_return, e.status) for e in report.episodes]
        print(f"{name:<15} {wall:7.1f} s  {args.episodes / wall:6.2f} episodes/s", flush=True)
    print("same per-episode results:", len({repr(r) for r in results.values()}) == 1)
    ray.shutdown()


if __name__ == "__main__":
    main()
