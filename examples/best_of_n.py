"""Best-of-N planning: fork the rollout into N candidates, score their futures, continue from the best.

Each window, the current rollout is forked N times (the committed KV pages are shared, not copied); each
candidate tries a random action chunk under its own diffusion noise, a score function rates the frames it
produced, and the best candidate becomes the rollout while the others are closed. On the trained pusher
model the score is how close the effector got to the block (PushSim's colour detector on the imagined
frames), so the chosen path heads for the block without any controller.

    python examples/best_of_n.py --candidates 4 --windows 4 --out runs/best_of_n.mp4
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import worldstep
from worldstep.envs import Mp4Writer, fork_env, frame_fps
from worldstep.envs.push_sim import detect_objects
from worldstep.flags import parse_flags


@dataclass
class Args:
    """Sample N futures per window from forks of one rollout and keep the best-scoring one."""

    model: str = "pusher"
    """config name, YAML path or checkpoint folder (pusher: the trained model)"""
    seed: int = 0
    """seed of the reset, the candidate actions and the candidates' noise"""
    windows: int = 4
    """windows to plan"""
    candidates: int = 4
    """futures sampled per window"""
    out: str = "runs/best_of_n.mp4"
    """mp4 of the chosen path"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


def distance(frames: np.ndarray) -> float | None:
    """Pixels between effector and block in the last frame (None when either is not seen)."""
    found = detect_objects(frames[-1])
    if found["effector"] is None or found["block"] is None:
        return None
    return float(np.linalg.norm(found["block"] - found["effector"]))


def score(frames: np.ndarray) -> float:
    """Higher is better: minus the effector-block distance (-inf when the frames show neither)."""
    d = distance(frames)
    return -np.inf if d is None else -d


if __name__ == "__main__":
    args = parse_flags(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)

    # env setup
    overrides = dict(num_steps=args.num_steps, height=args.height, width=args.width)  # None: the config's value
    env = worldstep.make_env(args.model, max_windows=args.windows, success_fn="none", **overrides)
    obs, _ = env.reset(seed=args.seed)
    start = distance(obs["frames"])
    print(f"start: effector-block distance {start if start is None else round(start, 1)} px")

    with Mp4Writer(args.out, frame_fps(env)) as video:
        video.write(obs["frames"][0])
        for window in range(args.windows):
            # fork N candidates from the current state, each with its own noise seed and actions
            results = []
            for k in range(args.candidates):
                candidate = fork_env(env, seed=int(rng.integers(2**31)))  # inside make_env's wrappers
                actions = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
                cand_obs, _, _, _, info = candidate.step(actions)
                results.append((score(cand_obs["frames"]), k, candidate, cand_obs))
            pages = env.unwrapped.model.kv.num_used_pages
            best_score, best_k, best, obs = max(results, key=lambda r: r[0])

            # continue from the best; close the rest (and the pre-fork rollout)
            for _, _, candidate, _ in results:
                if candidate is not best:
                    candidate.close()
            env.close()
            env = best
            video.write(obs["frames"])
            print(f"window {window}: scores {[round(r[0], 1) for r in results]} -> candidate {best_k}; "
                  f"{pages} KV pages held by {args.candidates + 1} rollouts sharing their past")
    env.close()
    end = distance(obs["frames"])
    if start is None or end is None:
        print(f"cannot see the effector and the block in the frames (random weights? try --model pusher); "
              f"video {args.out}")
    else:
        print(f"effector-block distance {start:.1f} -> {end:.1f} px; video {args.out}")
