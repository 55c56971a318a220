"""A DROID-style closed loop: two cameras in, the commanded robot state tracked, a policy served over the openpi
protocol seeing both images and the state.

    # standalone: a demo servo policy served in a thread on 127.0.0.1
    python examples/droid_two_cameras.py --windows 3
    # against your own openpi-protocol server (it receives openpi's DROID observation keys)
    python examples/droid_two_cameras.py --endpoint ws://gpu-box:8000 --action-mode truncate

The env composes the exterior and wrist views side by side into the model's frame (caption: ``concat_view``)
and splits every generated frame back into ``obs["exterior"]`` and ``obs["wrist"]``; ``obs["state"]`` is the
end-effector pose and gripper the actions command (droid_lerobot's deltas composed in SE(3)), not read from
the pixels. On the tiny random-weight model the frames are noise; the loop, the keys and the state are real.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import worldstep
from worldstep.envs import Mp4Writer, frame_fps
from worldstep.flags import parse_flags
from worldstep.policies.remote import DROID_OBS_KEYS, RemotePolicy
from worldstep.policies.server import PolicyServer


@dataclass
class Args:
    """Drive a two-camera DROID-style world model with a remote policy that sees both images and the state."""

    endpoint: str = ""
    """the policy server (empty: serve the demo servo policy in a thread on a free local port)"""
    model: str = "tiny"
    """config name, YAML path or checkpoint folder (tiny is the embedded default)"""
    seed: int = 0
    """seed of the episode"""
    windows: int = 3
    """windows to roll out"""
    prompt: str = "move the gripper to the cup and close it"
    """task text sent to the policy and used as the world model's prompt"""
    target: str = "0.2,-0.1,0.15"
    """x,y,z the demo servo policy moves the end effector to (metres, the state's frame)"""
    out: str = "runs/droid_two_cameras.mp4"
    """video of both cameras side by side, every frame of the episode"""
    action_mode: str = "exact"
    """how a returned chunk becomes one window: exact, truncate, pad or rechunk"""
    num_steps: int | None = None
    """denoising steps per window (default: the config's)"""
    height: int | None = None
    """frame height, a multiple of 16 (default: the config's)"""
    width: int | None = None
    """frame width, a multiple of 16 (default: the config's)"""


def euler_xyz_to_matrix(euler: np.ndarray) -> np.ndarray:
    """Extrinsic xyz Euler angles (DROID's cartesian_position form) -> rotation matrix, Rz @ Ry @ Rx."""
    (ca, cb, cc), (sa, sb, sc) = np.cos(euler), np.sin(euler)
    rx = np.array([[1, 0, 0], [0, ca, -sa], [0, sa, ca]])
    ry = np.array([[cb, 0, sb], [0, 1, 0], [-sb, 0, cb]])
    rz = np.array([[cc, -sc, 0], [sc, cc, 0], [0, 0, 1]])
    return rz @ ry @ rx


def servo_policy(chunk: int, target: np.ndarray, seen: list[dict]):
    """An openpi-protocol policy: step a quarter of the way to ``target`` per action, in the end effector's frame
    (droid_lerobot's deltas), keep the orientation, close the gripper. It records what it was shown."""

    def infer(obs: dict) -> dict:
        pose = np.asarray(obs["observation/cartesian_position"], np.float64)
        seen.append({"exterior": obs["observation/exterior_image_1_left"].shape,
                     "wrist": obs["observation/wrist_image_left"].shape, "position": pose[:3].round(4).tolist(),
                     "gripper": float(obs["observation/gripper_position"][0])})
        rotation, position = euler_xyz_to_matrix(pose[3:]), pose[:3].copy()
        actions = np.zeros((chunk, 10), np.float32)
        for i in range(chunk):
            step = 0.25 * (target - position)
            actions[i, :3] = rotation.T @ step  # the delta in the end effector's own frame
            actions[i, 3:9] = (1, 0, 0, 0, 1, 0)  # no rotation
            actions[i, 9] = 1.0  # closed
            position = position + step
        return {"actions": actions}

    return infer


def first_views(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A table seen from outside and from the wrist: a gradient with a coloured square (any images will do)."""
    views = {}
    for name, (h, w, _) in shapes.items():
        image = np.zeros((h, w, 3), np.uint8)
        image[..., 0] = np.linspace(40, 200, w, dtype=np.uint8)[None]
        image[..., 2] = np.linspace(200, 40, h, dtype=np.uint8)[:, None]
        y, x = rng.integers(0, h - h // 4), rng.integers(0, w - w // 4)
        image[y:y + h // 4, x:x + w // 4] = (230, 60, 40) if name == "exterior" else (40, 200, 70)
        views[name] = image
    return views


if __name__ == "__main__":
    args = parse_flags(Args)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    target = np.array([float(v) for v in args.target.split(",")])
    if target.shape != (3,):
        raise ValueError(f"--target={args.target!r} is invalid; allowed: three comma-separated numbers x,y,z")

    # the env: two cameras composed side by side, the commanded state tracked from droid_lerobot's deltas
    overrides = dict(num_steps=args.num_steps, height=args.height, width=args.width)  # None: the config's value
    env = worldstep.make_env(args.model, embodiment="droid_lerobot", cameras=("exterior", "wrist"), robot_state=True,
                             prompt=args.prompt, max_windows=args.windows, **overrides)
    chunk = env.action_space.shape[0]
    print(f"observation space: {env.observation_space}")

    # the policy server (the demo servo in this process, or yours) and the remote policy speaking openpi's DROID keys
    server, seen, endpoint = None, [], args.endpoint
    if not endpoint:
        server = PolicyServer(servo_policy(chunk, target, seen),
                              metadata={"policy": "droid-servo-demo"}).start()
        endpoint = server.endpoint
    policy = RemotePolicy(endpoint, env.action_space, obs_keys=DROID_OBS_KEYS, prompt=args.prompt,
                          action_mode=args.action_mode)
    print(f"policy server {endpoint}: {policy.connect()}; keys sent: {sorted(DROID_OBS_KEYS)}")

    # the closed loop
    shapes = {name: env.observation_space[name].shape[1:] for name in ("exterior", "wrist")}
    start = np.array([0.0, 0.0, 0.3, 1, 0, 0, 0, 1, 0, 0.0])  # above the table, identity orientation, gripper open
    def side_by_side(obs: dict) -> np.ndarray:
        return np.concatenate([obs["exterior"], obs["wrist"]], axis=2)  # [chunk, h, 2w, 3]

    try:
        obs, info = env.reset(seed=args.seed, options={"image": first_views(shapes, rng), "state": start})
        with Mp4Writer(args.out, frame_fps(env)) as video:
            video.write(side_by_side(obs)[0])
            for window in range(args.windows):
                actions = policy(obs)
                obs, reward, terminated, truncated, info = env.step(actions)
                video.write(side_by_side(obs))
                state, shown = obs["state"][-1], (seen[-1] if seen else {})
                print(f"window {window}: policy saw exterior {shown.get('exterior')} wrist {shown.get('wrist')} "
                      f"position {shown.get('position')} gripper {shown.get('gripper')}; commanded position "
                      f"{state[:3].astype(float).round(4).tolist()} gripper {state[9]:.2f}; frames exterior "
                      f"{obs['exterior'].shape} wrist {obs['wrist'].shape}")
                if terminated or truncated:
                    break
    finally:
        policy.close()
        env.close()
        if server is not None:
            server.stop()
    distance = float(np.linalg.norm(obs["state"][-1, :3] - target))
    print(f"commanded end effector {distance:.4f} m from the target after {window + 1} windows; video {args.out}")
