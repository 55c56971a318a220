"""PushSim's held-out open-loop clips as a LeRobot dataset: the fidelity harness's clips, on disk.

Clip ``s`` is the one the fidelity report scores open loop (``worldstep.fidelity.openloop.held_out``): the start
``PushSimEnv.reset(seed=s)``, its actions drawn from ``np.random.default_rng(s)`` (steered towards the block, or
smooth random), seeds from a split's clip seeds (``worldstep.fidelity.seeds``; default ``validation``). Episode
``i`` holds the ``1 + steps`` simulator frames (64x64, ``observation.image``, at PushSim's 24 fps), the
``steps`` actions (the last frame repeats the last one), ``observation.state`` (effector, block and goal
centres, 6 numbers) and the pusher's prompt as its task; ``seed`` in the episode index records the clip seed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .writer import DatasetWriter

PROMPT = "A robot pushes a block to the goal."


def export_pushsim(root: str | os.PathLike, episodes: int, steps: int, *, split: str = "validation",
                   codec: str = "h264", offset: int = 0, crf: int = 30,
                   pix_fmt: str = "yuv420p") -> tuple[Path, list[int]]:
    """Write ``episodes`` clips of ``steps`` actions (clip seeds ``offset ..`` of ``split``); returns the folder
    and the clip seeds. ``codec``, ``crf``, ``pix_fmt``: see ``DatasetWriter`` (``crf=0, pix_fmt="yuv444p"``
    keeps the frames within rounding of the colour conversion)."""
    from worldstep.envs.push_sim import FRAME_FPS
    from worldstep.fidelity.openloop import held_out
    from worldstep.fidelity.seeds import CLIP_OFFSET, split_range

    for name, value in (("episodes", episodes), ("steps", steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid; allowed: a positive integer")
    seeds = split_range(split).seeds(episodes, offset=CLIP_OFFSET + offset)
    with DatasetWriter(root, fps=int(FRAME_FPS), cameras={"observation.image": (64, 64)}, action_width=2,
                       state_width=6, codec=codec, robot_type="pushsim", crf=crf,
                       pix_fmt=pix_fmt) as writer:
        for seed in seeds:  # one clip at a time
            clip = held_out([seed], steps)
            frames = np.concatenate([clip.first, clip.truth[0]])  # [1 + steps, 64, 64, 3]
            states = np.concatenate([clip.start, clip.states[0]]).reshape(1 + steps, 6)
            actions = np.concatenate([clip.actions[0], clip.actions[0][-1:]])
            writer.add_episode(frames={"observation.image": frames}, actions=actions,
                               state=states.astype(np.float32), task=PROMPT, success=None)
    return Path(root), seeds
