"""Best-of-N planning: fork the rollout into N candidates, score their futures, continue from the best.

Each window, the current rollout is forked N times (the committed KV pages are shared, not copied); each
candidate tries a perturbed action chunk under its own diffusion noise, a score function rates the
frames it produced, and the best candidate becomes the rollout while the others are closed.

    python examples/best_of_n.py --candidates 3 --windows 4 --out runs/best_of_n.mp4
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import worldstep
from worldstep.cli import parse_dataclass_args
from worldstep.envs import Mp4Writer


@dataclass
class Args:
    """Sample N futures per window from forks of one rollout and keep the best-scoring one."""

    model: str = "tiny"
    """config name, YAML path or checkpoint folder (tiny is the embedded default)"""
    seed: int = 0
    """seed of the reset, the action perturbations and the candidates' noise"""
    windows: int = 4
    """windows to plan"""
    candidates: int = 3
    """futures sampled per window"""
    noise: float = 0.5
    """scale of the action perturbation around the nominal chunk"""
    out: str = "runs/best_of_n.mp4"
    """mp4 of the chosen path"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


def score(frames: np.ndarray) -> float:
    """How blue the last frame is (a stand-in for a task score, e.g. a learned value of the frames)."""
    rgb = frames[-1].astype(np.float32)
    return float((rgb[..., 2] - rgb[..., 0]).mean())


if __name__ == "__main__":
    args = parse_dataclass_args(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)

    # env setup
    overrides = {k: v for k, v in {"num_steps": args.num_steps, "height": args.height, "width": args.width}.items()
                 if v is not None}
    env = worldstep.make_env(args.model, max_windows=args.windows, **overrides)
    obs, _ = env.reset(seed=args.seed)
    nominal = np.zeros(env.action_space.shape, np.float32)

    with Mp4Writer(args.out, env.metadata["render_fps"]) as video:
        video.write(obs["frames"][0])
        for window in range(args.windows):
            # fork N candidates from the current state, each with its own noise seed and actions
            results = []
            for k in range(args.candidates):
                candidate = env.fork(seed=int(rng.integers(2**31)))
                actions = np.clip(nominal + args.noise * rng.standard_normal(nominal.shape), -1, 1).astype(np.float32)
                cand_obs, _, _, _, info = candidate.step(actions)
                results.append((score(cand_obs["frames"]), k, candidate, cand_obs, info))
            pages = env.model.kv.table.num_used_pages
            best_score, best_k, best, obs, info = max(results, key=lambda r: r[0])

            # continue from the best; close the rest (and the pre-fork rollout)
            for _, _, candidate, _, _ in results:
                if candidate is not best:
                    candidate.close()
            env.close()
            env = best
            video.write(obs["frames"])
            print(f"window {window}: scores {[round(r[0], 2) for r in results]} -> candidate {best_k}; "
                  f"{pages} KV pages held by {args.candidates + 1} rollouts sharing their past")
    env.close()
    print(f"video {args.out}")
