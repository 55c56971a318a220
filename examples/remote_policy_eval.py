"""Evaluate a policy served over the openpi websocket protocol on the embedded default world model.

    # against your own server (openpi's serve_policy.py, or anything speaking the same protocol)
    python examples/remote_policy_eval.py --endpoint ws://gpu-box:8000 --action-mode truncate
    # standalone: start a demo policy server in a thread first
    python examples/remote_policy_eval.py --serve-demo --episodes 2 --windows 3
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import worldstep
from worldstep.flags import parse_flags
from worldstep.policies.remote import RemotePolicy
from worldstep.policies.server import PolicyServer, demo_policy


@dataclass
class Args:
    """Evaluate a remote (websocket) policy on identical, seeded world-model episodes."""

    endpoint: str = "ws://127.0.0.1:8000"
    """the policy server (ignored with --serve-demo, which serves on a free local port)"""
    serve_demo: bool = False
    """start worldstep's demo policy server in a thread and evaluate against it"""
    demo_horizon: int = 6
    """actions the demo server returns per request (use --action-mode to fit them to a window)"""
    model: str = "tiny"
    """config name, YAML path or checkpoint folder (tiny is the embedded default)"""
    seed: int = 0
    """seed of the first episode (episode i uses seed + i)"""
    episodes: int = 2
    """episodes to evaluate"""
    windows: int = 3
    """windows per episode"""
    prompt: str = "push the blue block to the left"
    """task text sent to the policy and used as the world model's prompt"""
    image_key: str = "observation/image"
    """server observation key that receives the latest frame"""
    prompt_key: str = "prompt"
    """server observation key that receives the prompt"""
    image_size: int = 0
    """square size the latest frame is resized to before sending (0: as generated)"""
    action_mode: str = "rechunk"
    """how a returned chunk becomes one window: exact, truncate, pad or rechunk"""
    clip: bool = False
    """clip actions into [-1, 1] instead of failing the episode"""
    timeout_s: float = 30.0
    """seconds to wait for each policy reply before the episode is marked failed"""
    batched: bool = False
    """step the episodes together through the batched vector env (one connection per episode)"""
    out: str = "runs/remote_policy_eval"
    """folder of report.json and the episode videos"""
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

    # the world model
    overrides = dict(num_steps=args.num_steps, height=args.height, width=args.width)  # None: the config's value
    world = worldstep.load(args.model, **overrides)
    chunk_size, action_width = world.action_shape

    # the policy server (a demo one in this process, or yours)
    server = None
    endpoint = args.endpoint
    if args.serve_demo:
        server = PolicyServer(demo_policy(chunk_size, action_width, horizon=args.demo_horizon),
                              metadata={"policy": "worldstep-demo"}).start()
        endpoint = server.endpoint

    # the remote policy: which server keys get the frame and the prompt, and how chunks fit a window
    policy = RemotePolicy(endpoint, world.action_shape, obs_keys={args.image_key: "image", args.prompt_key: "prompt"},
                          prompt=args.prompt, image_size=(args.image_size,) * 2 if args.image_size else None,
                          action_mode=args.action_mode, clip=args.clip, timeout_s=args.timeout_s)
    print(f"policy server {endpoint}: {policy.connect()}")

    # evaluate
    episodes = [{"seed": args.seed + i, "prompt": args.prompt, "max_windows": args.windows}
                for i in range(args.episodes)]
    try:
        report = worldstep.evaluate(world, policy, episodes, out_dir=args.out, batched=args.batched, progress=False)
    finally:
        policy.close()
        if server is not None:
            server.stop()

    # summary
    for e in report.episodes:
        print(f"episode {e.index}: seed {e.seed}, {e.windows} windows, {e.frames} frames, {e.status}"
              + (f" ({e.error.splitlines()[0]})" if e.error else ""))
    print(f"{len(report.episodes)} episodes, {sum(e.status == 'failed' for e in report.episodes)} failed; "
          f"report {args.out}/report.json")
