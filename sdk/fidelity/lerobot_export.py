"""PushSim episodes as a LeRobot dataset (``worldstep export-pushsim``): the fidelity harness's held-out clips, or
the pixel expert's episodes. A study's export, built on the product's dataset writer (``worldstep.lerobot``).

``source="clips"`` (default): clip ``s`` is the one the fidelity report scores open loop
(``worldstep.fidelity.openloop.held_out``): the start ``PushSimEnv.reset(seed=s)``, its actions drawn from
``np.random.default_rng(s)`` (steered towards the block, or smooth random), seeds from a split's clip seeds.
``source="expert"``: PushSim's pixel expert (``--policy push``) acting from ``PushSimEnv.reset(seed=s)``, seeds
from the split's episode seeds. Seeds come from ``worldstep.envs.push_seeds`` (default ``validation``). Episode
``i`` holds the ``1 + steps`` simulator frames (64x64, ``observation.image``, at PushSim's 24 fps), the ``steps``
actions (the last frame repeats the last one), ``observation.state`` (effector, block and goal centres, 6 numbers)
and the pusher's prompt as its task.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from worldstep.envs.push_seeds import SPLITS
from worldstep.flags import add_flags, flag, positive_int

from ..lerobot.writer import DatasetWriter

PROMPT = "A robot pushes a block to the goal."
CHUNK = 4  # the pusher model's window


def expert_episode(seed: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PushSim's pixel expert from ``reset(seed=seed)`` for ``steps`` actions (fewer when it succeeds first):
    frames ``[1 + T, 64, 64, 3]``, states ``[1 + T, 6]`` and actions ``[T, 2]``."""
    from worldstep.envs.push_sim import PushSimEnv
    from worldstep.policies import make_policy
    from worldstep.train.data import rollout_states

    env = PushSimEnv(chunk_size=CHUNK)
    obs, _ = env.reset(seed=seed)
    start = np.stack([env.state.effector, env.state.block, env.state.goal])
    policy = make_policy("push", env.action_space, seed=seed)
    policy.reset(seed)
    frames, actions = [obs["frames"][0]], []
    for _ in range(steps // CHUNK):
        chunk = np.asarray(policy(obs), dtype=np.float32)
        obs, _, terminated, _, _ = env.step(chunk)
        frames += list(obs["frames"])
        actions.append(chunk)
        if terminated:
            break
    env.close()
    actions = np.concatenate(actions)
    states = np.stack([np.concatenate([s.effector, s.block, s.goal]) for s in rollout_states(start, actions)])
    return np.stack(frames), states.astype(np.float32), actions


def export_pushsim(root: str | os.PathLike, episodes: int, steps: int, *, split: str = "validation",
                   codec: str = "h264", offset: int = 0, crf: int = 30, pix_fmt: str = "yuv420p",
                   source: str = "clips") -> tuple[Path, list[int]]:
    """Write ``episodes`` clips of ``steps`` actions (clip seeds ``offset ..`` of ``split``); returns the folder
    and the clip seeds. ``codec``, ``crf``, ``pix_fmt``: see ``DatasetWriter`` (``crf=0, pix_fmt="yuv444p"``
    keeps the frames within rounding of the colour conversion)."""
    from worldstep.envs.push_seeds import CLIP_OFFSET, split_range
    from worldstep.envs.push_sim import FRAME_FPS

    from .openloop import held_out

    for name, value in (("episodes", episodes), ("steps", steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid; allowed: a positive integer")
    if source not in ("clips", "expert"):
        raise ValueError(f"source={source!r} is invalid; allowed: 'clips' or 'expert'")
    if source == "expert" and steps % CHUNK:
        raise ValueError(f"steps={steps} is invalid for the expert; allowed: a multiple of its chunk, {CHUNK}")
    seeds = split_range(split).seeds(episodes, offset=(CLIP_OFFSET if source == "clips" else 0) + offset)
    with DatasetWriter(root, fps=int(FRAME_FPS), cameras={"observation.image": (64, 64)}, action_width=2,
                       state_width=6, codec=codec, robot_type="pushsim", crf=crf,
                       pix_fmt=pix_fmt) as writer:
        for seed in seeds:  # one episode at a time
            if source == "clips":
                clip = held_out([seed], steps)
                frames = np.concatenate([clip.first, clip.truth[0]])  # [1 + steps, 64, 64, 3]
                states = np.concatenate([clip.start, clip.states[0]]).reshape(1 + steps, 6)
                actions = clip.actions[0]
            else:
                frames, states, actions = expert_episode(seed, steps)
            actions = np.concatenate([actions, actions[-1:]])
            writer.add_episode(frames={"observation.image": frames}, actions=actions,
                               state=states.astype(np.float32), task=PROMPT, success=None)
    return Path(root), seeds


@dataclass
class ExportFlags:
    """``worldstep export-pushsim``."""

    out: str = flag("dataset folder to create", metavar="DIR")
    episodes: int = flag("episodes to export", default=20, type=positive_int)
    steps: int = flag("actions per episode", default=32, type=positive_int)
    split: str = flag("seed range (worldstep.envs.push_seeds): validation, test or a read one (test_read, "
                      "test_read_2, test_read_3, test_read_4)", default="validation", choices=tuple(SPLITS))
    codec: str = flag("video codec", default="h264", choices=("h264", "av1"))
    crf: int = flag("encoder quality, 0 .. 51 (LeRobot's default: 30)", default=30)
    pix_fmt: str = flag("yuv420p (LeRobot's) or yuv444p (full-resolution colour)", default="yuv420p",
                        choices=("yuv420p", "yuv444p"))
    source: str = flag("clips: the fidelity harness's held-out open-loop clips (clip seeds); expert: PushSim's pixel "
                       "expert from the split's episode seeds", default="clips", choices=("clips", "expert"))


def cmd_export(args: argparse.Namespace) -> int:
    root, seeds = export_pushsim(args.out, args.episodes, args.steps, split=args.split, codec=args.codec,
                                 crf=args.crf, pix_fmt=args.pix_fmt, source=args.source)
    print(json.dumps({"dataset": str(root), "clip_seeds": seeds}))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``export-pushsim`` to ``worldstep``'s subcommands."""
    p = sub.add_parser("export-pushsim", help="PushSim's held-out open-loop clips, or its expert's episodes, as a "
                                              "LeRobot v3.0 dataset")
    add_flags(p, ExportFlags)
    p.set_defaults(func=cmd_export)
