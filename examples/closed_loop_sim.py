"""Closed loop: a controller that looks at each window's frames and steers the effector to the block.

The controller finds the red effector and the blue block in the latest frame (PushSim's colour detector,
positions in pixels as (x, y) = (column, row)) and commands a velocity from one to the other; the world
model renders the consequence, which the controller sees next window. The default model is the trained
`pusher` world model; `--model worldstep/PushSim-v0` runs the same loop in the simulator it was trained on.
On the random-weight `tiny` model the frames are noise: the controller sees no effector and says so.

    python examples/closed_loop_sim.py --windows 6 --out runs/closed_loop.mp4
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import worldstep
from worldstep.envs import Mp4Writer, frame_fps
from worldstep.envs.push_sim import detect_objects
from worldstep.flags import parse_flags


@dataclass
class Args:
    """Run a colour-tracking controller in closed loop with a world model (or its simulator)."""

    model: str = "pusher"
    """config name, YAML path or checkpoint folder (pusher: the trained model; tiny: random weights), or a
    simulator's gymnasium id (worldstep/PushSim-v0)"""
    seed: int = 0
    """reset seed (the pusher model starts from PushSim's scene for this seed)"""
    windows: int = 6
    """windows to run"""
    gain: float = 0.5
    """commanded velocity per pixel of offset between effector and block (clipped to [-1, 1])"""
    reach_px: float = 11.0
    """the effector has reached the block when their centres are this close on both axes (PushSim: an 8 px
    effector touches a 12 px block at 10 px)"""
    out: str = "runs/closed_loop.mp4"
    """mp4 of every frame the loop saw"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


def locate(frame: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(effector, block) centres as (x, y) pixels, None where the colour is not in the frame."""
    found = detect_objects(frame)
    return found["effector"], found["block"]


def reached(effector: np.ndarray | None, block: np.ndarray | None, reach_px: float) -> bool:
    """Both seen, and their centres within ``reach_px`` on both axes."""
    return effector is not None and block is not None and bool(np.all(np.abs(block - effector) <= reach_px))


class TrackingController:
    """Policy: velocity (dx, dy) toward the block in action dims 0-1 (PushSim's convention), the rest at rest."""

    def __init__(self, chunk_size: int, action_width: int, gain: float) -> None:
        self.chunk_size, self.action_width, self.gain = chunk_size, action_width, gain

    def reset(self, seed: int | None = None) -> None:
        pass

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        effector, block = locate(obs["frames"][-1])
        actions = np.zeros((self.chunk_size, self.action_width), np.float32)
        if effector is not None and block is not None:
            actions[:, :2] = np.clip(self.gain * (block - effector), -1, 1)  # (x, y), as the simulator reads it
        return actions


def fmt(point: np.ndarray | None) -> str:
    return "unseen" if point is None else f"({point[0]:.1f}, {point[1]:.1f})"


if __name__ == "__main__":
    args = parse_flags(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)

    # env setup: a world model by config, or a registered simulator by id
    overrides = dict(num_steps=args.num_steps, height=args.height, width=args.width)  # None: the config's value
    if args.model in gym.registry and args.model not in worldstep.registration.WORLD_MODEL_IDS:
        env = gym.make(args.model, max_episode_steps=args.windows)
    else:
        env = worldstep.make_env(args.model, max_windows=args.windows, success_fn="none", **overrides)
    chunk, width = env.action_space.shape
    controller = TrackingController(chunk, width, args.gain)

    # the closed loop: frames -> controller -> actions -> world model -> frames
    controller.reset()
    obs, _ = env.reset(seed=args.seed)
    effector, block = locate(obs["frames"][-1])
    print(f"start: effector {fmt(effector)} block {fmt(block)}")
    done = reached(effector, block, args.reach_px)
    with Mp4Writer(args.out, frame_fps(env)) as video:
        video.write(obs["frames"][0])
        window = 0
        while not done and window < args.windows:
            actions = controller(obs)
            obs, reward, terminated, truncated, info = env.step(actions)
            video.write(obs["frames"])
            effector, block = locate(obs["frames"][-1])
            done = reached(effector, block, args.reach_px)
            print(f"window {window}: command {actions[0, :2].round(2)} -> effector {fmt(effector)} "
                  f"block {fmt(block)}")
            window += 1
            if terminated or truncated:
                break
    env.close()
    if effector is None or block is None:
        outcome = "cannot see the effector and the block in the frames (random weights? try --model pusher)"
    elif done:
        outcome = f"reached the block in {window} windows"
    else:
        outcome = f"did not reach the block in {window} windows"
    print(f"{outcome}; video {args.out}")
