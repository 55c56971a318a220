"""A world-model episode next to its simulator's truth: same start, same actions, frames side by side.

For a model trained on a simulator (its config's ``env.simulator``), the world-model env resets to the
simulator's first frame for the same seed; ``rollout_with_truth`` then feeds every action chunk the policy
chooses from the *model's* frames to both envs, so the video and the per-window PSNR show exactly where
the model's imagination and the simulator part ways.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm
from worldstep.envs.video import Mp4Writer

from .fidelity.metrics import psnr
from .policies import Policy

__all__ = ["TruthComparison", "rollout_with_truth", "side_by_side"]


@dataclass
class TruthComparison:
    """One episode in the model and the simulator; ``psnr_db[k]`` is window k's mean per-frame PSNR (the
    metric of ``worldstep fidelity``)."""

    seed: int
    windows: int = 0
    frames: int = 0
    psnr_db: list[float] = field(default_factory=list)
    model_success: bool = False
    """success judged from the model's frames by the simulator's pixel judge (``success_from_frames``)"""
    truth_success: bool = False
    """success judged from the simulator's frames by the same judge"""
    wall_s: float = 0.0
    video: str | None = None

    @property
    def mean_psnr_db(self) -> float:
        return float(np.mean(self.psnr_db)) if self.psnr_db else float("nan")


def side_by_side(left: np.ndarray, right: np.ndarray, scale: int = 4, gap: int = 2) -> np.ndarray:
    """``(T, H, W, 3)`` frames joined left | right with a white gap, upscaled ``scale``x (nearest)."""
    bar = np.full((*left.shape[:2], gap, 3), 255, np.uint8)
    joined = np.concatenate([left, bar, right], axis=2)
    return joined.repeat(scale, axis=1).repeat(scale, axis=2)


def rollout_with_truth(env: gym.Env, truth: gym.Env, policy: Policy, *, seed: int = 0, max_windows: int = 8,
                       video_path: str | os.PathLike | None = None, scale: int = 4,
                       progress: bool = False) -> TruthComparison:
    """Closed loop on the model (the policy sees the model's frames); the simulator replays each chunk.

    The episode runs ``max_windows`` windows or until the model env ends it. ``env`` must reset to the
    simulator's first frame for ``seed`` (a model env made with ``simulator``). Success on both sides is the
    simulator's pixel judge ``success_from_frames`` when it has one (goal from the simulator's first frame).
    """
    if getattr(env.unwrapped, "simulator", None) is None:
        raise ValueError("env is invalid; allowed: a world-model env made with a `simulator` "
                         "(config env.simulator, e.g. worldstep/Pusher-v0)")
    start = time.perf_counter()
    result = TruthComparison(seed=seed)
    policy.reset(seed)
    obs, info = env.reset(seed=seed)
    truth_obs, _ = truth.reset(seed=info.get("scene_seed", seed))
    if truth_obs["frames"].shape != obs["frames"].shape:
        raise ValueError(f"truth frames {truth_obs['frames'].shape} are invalid; allowed: the model env's "
                         f"frame shape {obs['frames'].shape} (same chunk size and frame size)")
    judge = getattr(truth.unwrapped, "success_from_frames", None)
    first = truth_obs["frames"][0]
    writer = None if video_path is None else Mp4Writer(video_path, env.metadata["render_fps"])
    bar = tqdm(total=max_windows, desc="rollout+truth", unit="window", disable=not progress)
    try:
        if writer is not None:
            writer.write(side_by_side(obs["frames"][:1], truth_obs["frames"][:1], scale))
            result.video = str(writer.path)
        for _ in range(max_windows):
            actions = policy(obs)
            obs, _, terminated, truncated, info = env.step(actions)
            truth_obs, *_ = truth.step(actions)
            result.windows += 1
            result.frames += len(obs["frames"])
            result.psnr_db.append(float(psnr(obs["frames"], truth_obs["frames"]).mean()))
            if judge is not None:
                result.model_success = result.model_success or bool(judge(first, obs["frames"]))
                result.truth_success = result.truth_success or bool(judge(first, truth_obs["frames"]))
            if writer is not None:
                writer.write(side_by_side(obs["frames"], truth_obs["frames"], scale))
            bar.update(1)
            if terminated or truncated:
                break
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    result.wall_s = time.perf_counter() - start
    return result
