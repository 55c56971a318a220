"""The basic action loop: reset a world-model env, step it with action chunks, record every frame.

The default env is the trained pusher model (`worldstep/Pusher-v0`): its actions move the red effector
(dx, dy), so the sine chunks below draw a path you can watch in the video. Any registered world-model id
works (`--env-id worldstep/Tiny-v0` is the random-weight model: the machinery, with noise frames).

    python examples/action_loop.py --windows 8 --out runs/action_loop
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import worldstep  # noqa: F401 - registers the worldstep/* env ids
from worldstep.envs import RecordRollout
from worldstep.flags import parse_flags


@dataclass
class Args:
    """Step a world-model env with a scripted action chunk per window and record the video."""

    env_id: str = "worldstep/Pusher-v0"
    """the registered env id (worldstep/Pusher-v0: the trained pusher model; worldstep/Tiny-v0: random weights)"""
    seed: int = 0
    """seed of the reset (first-frame scene and diffusion noise)"""
    windows: int = 8
    """windows to generate (each is chunk_size frames)"""
    prompt: str | None = None
    """the text prompt (default: the env's config)"""
    domain_id: int | None = None
    """embodiment domain of the action head (default: the env's config)"""
    out: str = "runs/action_loop"
    """folder of the recorded mp4"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


if __name__ == "__main__":
    args = parse_flags(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)

    # env setup: config overrides go straight through gym.make
    overrides = dict(num_steps=args.num_steps, height=args.height, width=args.width)  # None: the config's value
    env = gym.make(args.env_id, max_windows=args.windows, **overrides)
    env = RecordRollout(env, args.out, name_prefix="action_loop")
    chunk, width = env.action_space.shape
    print(f"{args.env_id}: action chunk {chunk}x{width}, frames {env.observation_space['frames'].shape}")

    # the loop: one step = one window of `chunk` frames (None options take the env's defaults)
    obs, info = env.reset(seed=args.seed, options={"prompt": args.prompt, "domain_id": args.domain_id})
    start = time.perf_counter()
    for window in range(args.windows):
        t = window * chunk + np.arange(chunk)[:, None]
        actions = 0.8 * np.sin(2 * np.pi * (t / 32 + np.arange(width) / width)).astype(np.float32)
        obs, reward, terminated, truncated, info = env.step(actions)
        timing, kv = info["timings"], info["kv"]
        print(f"window {info['window_index']}: frames [{info['frame_start']}, {info['frame_end']}) "
              f"denoise {timing.denoise_s:.2f}s decode {timing.decode_s:.2f}s, "
              f"KV pages {kv.pages_in_use} (released tokens {kv.released_tokens})")
        if terminated or truncated:
            break
    elapsed = time.perf_counter() - start
    env.close()
    print(f"{(window + 1) * chunk} frames in {elapsed:.1f}s; video {env.last_video_path}")
