"""A DAgger-style round: the states a world-model loop actually visits, replayed in the simulator.

A policy that acts on a world model's frames drifts into states the simulator-driven data never shows
(the model's frames mislead it, and it keeps pushing from wherever it believes it is). Each graded
policy runs closed loop on a trained world model; its action sequence is then replayed in the
simulator from the same start, and that true clip joins the training data, so the next model learns
what really follows from the actions its own loop produces.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from worldstep.envs.push_sim import PushSimEnv, PushState

from .data import ClipSet

BATCH = 32  # sessions stepped as one batch per window


def model_loop_clips(world, seeds: list[int], steps: int, chunk: int, prompt: str, domain_id: int,
                     knobs) -> ClipSet:
    """One clip per seed: graded policy `i % 8` acts for `steps` actions on `world`'s frames from
    `PushSimEnv.reset(seed)`; the clip is that start and the policy's actions (replayed in the simulator
    when rendered). The model's diffusion noise is seeded by the start seed."""
    from worldstep.fidelity.policies import FLOOR, graded_policies  # lazy: fidelity imports worldstep.train

    graded = [p for p in graded_policies(chunk) if p.name not in FLOOR]
    starts = np.empty((len(seeds), 3, 2), dtype=np.float64)
    actions = np.empty((len(seeds), steps, 2), dtype=np.float32)
    env = PushSimEnv(chunk_size=chunk)
    for lo in range(0, len(seeds), BATCH):
        group = list(range(lo, min(lo + BATCH, len(seeds))))
        agents, sessions, frames = [], [], []
        try:
            for i in group:
                obs, _ = env.reset(seed=int(seeds[i]))
                state: PushState = env.state
                starts[i] = np.stack([state.effector, state.block, state.goal])
                agent = copy.deepcopy(graded[i % len(graded)])  # policies keep per-episode state
                agent.reset(seed=int(seeds[i]))
                agents.append(agent)
                sessions.append(world.open_session(obs["frames"][0], prompt, domain_id, knobs=knobs,
                                                   generator=torch.Generator().manual_seed(int(seeds[i])),
                                                   action_width=2))
                frames.append(obs["frames"])
            for w in range(steps // chunk):
                chunks = [np.asarray(a({"frames": f}), dtype=np.float32) for a, f in zip(agents, frames)]
                results = world.step(sessions, chunks)
                frames = [r.frames for r in results]
                for i, c in zip(group, chunks):
                    actions[i, w * chunk:(w + 1) * chunk] = c
        finally:
            for s in sessions:
                world.close(s)
    return ClipSet(starts, actions, np.asarray(seeds, dtype=np.int64))
