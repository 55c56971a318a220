"""A DAgger-style round: the states a world-model loop actually visits, replayed in the simulator.

A policy that acts on a world model's frames drifts into states the simulator-driven data never shows
(the model's frames mislead it, and it keeps pushing from wherever it believes it is). Each graded
policy runs closed loop on a trained world model; its action sequence is then replayed in the
simulator from the same start, and that true clip joins the training data, so the next model learns
what really follows from the actions its own loop produces. ``model_loop`` also keeps the latents the
model committed on the way, so training can show the model its own context (``self_forcing``).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from worldstep.envs.push_policies import FLOOR, graded_policies
from worldstep.envs.push_sim import PushSimEnv, PushState

from .data import ClipSet

BATCH = 32  # sessions stepped as one batch per window


def model_loop_clips(world, seeds: list[int], steps: int, chunk: int, prompt: str, domain_id: int,
                     knobs) -> ClipSet:
    """One clip per seed: graded policy `i % 8` acts for `steps` actions on `world`'s frames from
    `PushSimEnv.reset(seed)`; the clip is that start and the policy's actions (replayed in the simulator
    when rendered). The model's diffusion noise is seeded by the start seed."""
    return model_loop(world, seeds, steps, chunk, prompt, domain_id, knobs)[0]


def model_loop(world, seeds: list[int], steps: int, chunk: int, prompt: str, domain_id: int, knobs,
               actors: list | None = None, keep_frames: bool = False
               ) -> tuple[ClipSet, torch.Tensor, np.ndarray | None]:
    """(clips, own latents, own frames): actor `i % len(actors)` (default: the eight graded policies) acts for
    `steps` actions on `world`'s frames from `PushSimEnv.reset(seeds[i])`. The clips hold each start and its
    actions; the own latents `[N, C, 1 + windows, h, w]` are what the model committed: session i's clean first
    latent, then each window's latents (normalised model space, as a training context). With `keep_frames`, the
    own frames `[N, 1 + steps, H, W, 3]` uint8 are the first frame, then what the model decoded for each window (what
    its context shows, for re-anchored targets); else None."""
    actors = actors if actors is not None else [p for p in graded_policies(chunk) if p.name not in FLOOR]
    starts = np.empty((len(seeds), 3, 2), dtype=np.float64)
    actions = np.empty((len(seeds), steps, 2), dtype=np.float32)
    own: list[torch.Tensor | None] = [None] * len(seeds)
    env = PushSimEnv(chunk_size=chunk)
    frame_shape = env.observation_space["frames"].shape[1:]  # [H, W, 3]; uint8: 12 KiB a 64x64 frame
    kept = np.empty((len(seeds), 1 + steps, *frame_shape), dtype=np.uint8) if keep_frames else None
    for lo in range(0, len(seeds), BATCH):
        group = list(range(lo, min(lo + BATCH, len(seeds))))
        agents, sessions, frames, latents = [], [], [], []
        try:
            for i in group:
                obs, _ = env.reset(seed=int(seeds[i]))
                state: PushState = env.state
                starts[i] = np.stack([state.effector, state.block, state.goal])
                agent = copy.deepcopy(actors[i % len(actors)])  # policies keep per-episode state
                agent.reset(seed=int(seeds[i]))
                agents.append(agent)
                session = world.open_session(obs["frames"][0], prompt, domain_id, knobs=knobs,
                                             generator=torch.Generator().manual_seed(int(seeds[i])),
                                             action_width=2)
                sessions.append(session)
                frames.append(obs["frames"])
                latents.append([session.first_latent.float().cpu()])  # [C, 1, h, w]
                if kept is not None:
                    kept[i, 0] = obs["frames"][0]
            for w in range(steps // chunk):
                chunks = [np.asarray(a({"frames": f}), dtype=np.float32) for a, f in zip(agents, frames)]
                results = world.step(sessions, chunks)
                frames = [r.frames for r in results]
                for j, (i, c, r) in enumerate(zip(group, chunks, results)):
                    actions[i, w * chunk:(w + 1) * chunk] = c
                    latents[j].append(r.latents.float())  # [C, t, h, w]
                    if kept is not None:
                        kept[i, 1 + w * chunk:1 + (w + 1) * chunk] = r.frames
        finally:
            for s in sessions:
                world.close(s)
        for j, i in enumerate(group):
            own[i] = torch.cat(latents[j], dim=1)  # [C, 1 + windows * t, h, w]
    return ClipSet(starts, actions, np.asarray(seeds, dtype=np.int64)), torch.stack(own), kept
