"""Closed loop: a controller that looks at each window's frames and steers toward a target.

The controller finds the red end-effector and the blue block in the latest frame (colour centroids) and
commands a velocity from one to the other; the world model renders the consequence, which the controller
sees next window. With the embedded tiny model the frames are noise (random weights), so the tracked
positions wander; point ``--model`` at a trained checkpoint to watch it push the block.

    python examples/closed_loop_sim.py --windows 8 --out runs/closed_loop.mp4
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
    """Run a colour-tracking controller in closed loop with a world model."""

    model: str = "tiny"
    """config name, YAML path or checkpoint folder (tiny is the embedded default)"""
    seed: int = 0
    """reset seed"""
    windows: int = 8
    """windows to run"""
    gain: float = 2.0
    """proportional gain from pixel offset (fraction of the frame) to commanded velocity"""
    success_distance: float = 0.05
    """the episode succeeds when effector and block are closer than this fraction of the frame"""
    out: str = "runs/closed_loop.mp4"
    """mp4 of every frame the loop saw"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


def centroid(frame: np.ndarray, channel: int) -> np.ndarray:
    """(row, col) centroid, as fractions of the frame, of the pixels where `channel` dominates."""
    rgb = frame.astype(np.float32)
    weight = np.clip(rgb[..., channel] - rgb.mean(axis=-1), 0, None) ** 2 + 1e-6
    rows, cols = np.indices(frame.shape[:2])
    return np.array([(weight * rows).sum(), (weight * cols).sum()]) / weight.sum() / np.array(frame.shape[:2])


class TrackingController:
    """Policy: velocity (d_row, d_col) toward the block in action dims 0-1, the other dims at rest."""

    def __init__(self, chunk_size: int, action_width: int, gain: float) -> None:
        self.chunk_size, self.action_width, self.gain = chunk_size, action_width, gain
        self.last = None

    def reset(self, seed: int | None = None) -> None:
        self.last = None

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        frame = obs["frames"][-1]
        effector, block = centroid(frame, 0), centroid(frame, 2)
        self.last = (effector, block)
        actions = np.zeros((self.chunk_size, self.action_width), np.float32)
        actions[:, :2] = np.clip(self.gain * (block - effector), -1, 1)
        return actions


def reached(frames: np.ndarray, distance: float) -> bool:
    """Success detector: the effector and block centroids of the last frame are within `distance`."""
    return bool(np.linalg.norm(centroid(frames[-1], 0) - centroid(frames[-1], 2)) < distance)


if __name__ == "__main__":
    args = parse_dataclass_args(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)

    # env setup
    overrides = {k: v for k, v in {"num_steps": args.num_steps, "height": args.height, "width": args.width}.items()
                 if v is not None}
    env = worldstep.make_env(args.model, max_windows=args.windows,
                             success_fn=lambda frames: reached(frames, args.success_distance), **overrides)
    chunk, width = env.action_space.shape
    controller = TrackingController(chunk, width, args.gain)

    # the closed loop: frames -> controller -> actions -> world model -> frames
    controller.reset()
    obs, _ = env.reset(seed=args.seed)
    with Mp4Writer(args.out, env.metadata["render_fps"]) as video:
        video.write(obs["frames"][0])
        for _ in range(args.windows):
            actions = controller(obs)
            effector, block = controller.last
            obs, reward, terminated, truncated, info = env.step(actions)
            video.write(obs["frames"])
            print(f"window {info['window_index']}: effector {effector.round(2)} block {block.round(2)} "
                  f"command {actions[0, :2].round(2)} reward {reward:g}")
            if terminated or truncated:
                break
    env.close()
    print(f"{'reached the block' if terminated else 'did not reach the block'}; video {args.out}")
