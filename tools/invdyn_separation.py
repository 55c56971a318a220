"""Does the pusher's own inverse dynamics separate consistent windows from inconsistent ones (docs/trust.md)?

The shipped pusher was trained in forward dynamics only, so its action head's inverse dynamics is untrained. On
validation seeds (envs/push_seeds.py) each episode steps random actions for a few windows, on the model and,
with the same seed and actions, on PushSim. Per window the `InverseDynamicsTracker` residual is measured against
the commanded actions (consistent) and against other random actions (inconsistent), on the model's frames and on
the simulator's. AUROC is the chance an inconsistent window scores above a consistent one (0.5: no separation);
Spearman relates the model windows' residual to `PushTracker`'s block residual (the drift the issue measured).

Usage: ``python tools/invdyn_separation.py [--episodes 8] [--windows 4] [--id-steps 4]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def auroc(consistent: list[float], inconsistent: list[float]) -> float:
    """P(inconsistent > consistent), ties counted half."""
    a, b = np.asarray(consistent)[:, None], np.asarray(inconsistent)[None, :]
    return float(np.mean((b > a) + 0.5 * (b == a)))


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def main() -> None:
    import worldstep
    from worldstep.envs.push_seeds import VALIDATION
    from worldstep.envs.push_sim import PushSimEnv
    from worldstep.trust import InverseDynamicsTracker, PushTracker

    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--id-steps", type=int, default=4)
    args = parser.parse_args()

    env = worldstep.make_env("pusher", max_windows=args.windows)
    tracker = InverseDynamicsTracker.for_env(env, num_steps=args.id_steps)
    scores = {key: [] for key in ("model_consistent", "model_inconsistent", "sim_consistent", "sim_inconsistent")}
    drift = []
    for seed in VALIDATION.episode_seeds(args.episodes):
        rng = np.random.default_rng(seed)
        sim = PushSimEnv(chunk_size=env.unwrapped.knobs.chunk_size)
        model_frames = env.reset(seed=seed)[0]["frames"][-1]
        sim_frames = sim.reset(seed=seed)[0]["frames"][-1]
        for _ in range(args.windows):
            actions = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
            other = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
            model_obs, sim_obs = env.step(actions)[0]["frames"], sim.step(actions)[0]["frames"]
            for name, previous, frames in (("model", model_frames, model_obs), ("sim", sim_frames, sim_obs)):
                scores[f"{name}_consistent"].append(tracker.residual(previous, frames, actions))
                scores[f"{name}_inconsistent"].append(tracker.residual(previous, frames, other))
            block = PushTracker().residual(model_frames, model_obs, actions)
            drift.append(np.nan if block is None else min(block, 64.0))
            model_frames, sim_frames = model_obs[-1], sim_obs[-1]
    env.close()
    kept = [i for i, d in enumerate(drift) if np.isfinite(d)]
    report = {
        "episodes": args.episodes, "windows": args.windows, "id_steps": args.id_steps,
        "seeds": f"{VALIDATION.start}..{VALIDATION.start + args.episodes - 1}",
        **{f"mean_{k}": round(float(np.mean(v)), 4) for k, v in scores.items()},
        "auroc_model": round(auroc(scores["model_consistent"], scores["model_inconsistent"]), 3),
        "auroc_sim": round(auroc(scores["sim_consistent"], scores["sim_inconsistent"]), 3),
        "spearman_vs_block_drift": round(spearman([scores["model_consistent"][i] for i in kept],
                                                  [drift[i] for i in kept]), 3),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
