"""Seeded simulator clips for training: start states and action sequences, rendered on demand.

Clips are stored as states + actions (a few KB each) rather than frames (~800 KB for 65 frames), and
rendered when a batch needs pixels; rendering is exact and cheap, so nothing is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from worldstep.envs.push_policies import FLOOR, graded_policies
from worldstep.envs.push_sim import (
    BLOCK,
    EFFECTOR,
    SIZE,
    PushSimEnv,
    PushState,
    physics_step,
    push_oracle,
    render_state,
)

STEER_NOISE = (0.0, 0.2, 0.5, 1.0, 2.0)  # action-noise std of steered clips: the graded policies' range


@dataclass(frozen=True)
class ClipSet:
    """`starts` `[N, 3, 2]` (effector, block, goal), `actions` `[N, A, 2]` float32 in [-1, 1] and the
    `PushSimEnv.reset` seed of each start (`[N]`, so evaluation seed ranges can be checked disjoint)."""

    starts: np.ndarray
    actions: np.ndarray
    seeds: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.starts)


def smooth_random_actions(rng: np.random.Generator, steps: int) -> np.ndarray:
    """Random smooth velocities: an Ornstein-Uhlenbeck walk with a random time scale, clipped to [-1, 1]."""
    theta = rng.uniform(0.05, 0.6)
    scale = rng.uniform(0.3, 1.0)
    a = rng.uniform(-1, 1, size=2)
    out = np.empty((steps, 2), dtype=np.float32)
    for i in range(steps):
        a = a + theta * (-a) + scale * np.sqrt(2 * theta) * rng.normal(size=2)
        out[i] = np.clip(a, -1, 1)
    return out


def steered_actions(rng: np.random.Generator, start: PushState, steps: int) -> np.ndarray:
    """A noisy oracle (noise level drawn per clip) that pushes the block toward the goal."""
    noise = rng.choice(STEER_NOISE)
    state, out = start, np.empty((steps, 2), dtype=np.float32)
    for i in range(steps):
        a = np.clip(push_oracle(state) + noise * rng.normal(size=2), -1, 1)
        out[i] = a
        state = physics_step(state, a)
    return out


def generate_clips(num_clips: int, steps: int, seed: int, steer_share: float = 0.6) -> ClipSet:
    """`num_clips` clips of `steps` actions: start states from `PushSimEnv.reset`, a share steered."""
    rng = np.random.default_rng(seed)
    env = PushSimEnv(chunk_size=4)
    starts = np.empty((num_clips, 3, 2), dtype=np.float64)
    actions = np.empty((num_clips, steps, 2), dtype=np.float32)
    seeds = np.empty(num_clips, dtype=np.int64)
    for i in range(num_clips):
        seeds[i] = int(rng.integers(2**31))
        env.reset(seed=int(seeds[i]))
        state = env.state
        starts[i] = np.stack([state.effector, state.block, state.goal])
        steer = rng.random() < steer_share
        actions[i] = steered_actions(rng, state, steps) if steer else smooth_random_actions(rng, steps)
    return ClipSet(starts, actions, seeds)


# Shares of the training mixture. Evaluation grades eight pixel policies (worldstep.envs.push_policies); a model
# trained on the expert's pushes alone had barely seen greedy's diagonal pushes or a noisy policy's contacts, and
# over-reported them. So a share of clips is driven by each graded policy acting on the simulator's own frames,
# and another share starts in contact with the block and pushes it in any direction.
CLIP_MIX = {"steered": 0.3, "random": 0.15, "policy": 0.35, "contact": 0.2}


def policy_actions(policy, start: PushState, steps: int, chunk: int, seed: int) -> np.ndarray:
    """`steps` actions of a pixel policy (`worldstep.envs.push_policies`) acting on rendered frames from `start`,
    a window of `chunk` actions at a time, run to the clip's end (a training clip does not stop on success)."""
    policy.reset(seed=seed)
    state, out = start, np.empty((steps, 2), dtype=np.float32)
    frames = render_state(state)[None]
    for w in range(steps // chunk):
        chunk_actions = np.asarray(policy({"frames": frames}), dtype=np.float32)
        rendered = []
        for i, a in enumerate(chunk_actions):
            out[w * chunk + i] = a
            state = physics_step(state, a)
            rendered.append(render_state(state))
        frames = np.stack(rendered)
    return out


def contact_start(rng: np.random.Generator, state: PushState) -> tuple[PushState, np.ndarray]:
    """The effector placed against the block at a random angle, and the push direction through the block."""
    angle = rng.uniform(0, 2 * np.pi)
    direction = np.array([np.cos(angle), np.sin(angle)])
    reach = (EFFECTOR + BLOCK) / 2 + rng.uniform(0.0, 2.0)
    effector = np.clip(state.block - direction * reach, EFFECTOR / 2, SIZE - EFFECTOR / 2)
    return PushState(effector, state.block.copy(), state.goal.copy()), direction


def contact_actions(rng: np.random.Generator, direction: np.ndarray, steps: int) -> np.ndarray:
    """Pushes along `direction` (any angle, diagonals included) at a random speed, turning slowly, with jitter."""
    out = np.empty((steps, 2), dtype=np.float32)
    speed, turn, angle = rng.uniform(0.3, 1.0), rng.normal(0, 0.08), np.arctan2(direction[1], direction[0])
    for i in range(steps):
        angle += turn
        a = speed * np.array([np.cos(angle), np.sin(angle)]) + 0.15 * rng.normal(size=2)
        out[i] = np.clip(a, -1, 1)
    return out


def training_clips(num_clips: int, steps: int, seed: int, chunk: int = 4,
                   mix: dict[str, float] | None = None) -> tuple[ClipSet, np.ndarray]:
    """`num_clips` clips drawn from the mixture `mix` (default `CLIP_MIX`) and each clip's kind (an index into
    the mixture's keys). Start states come from `PushSimEnv.reset` with seeds drawn from `seed`'s generator."""
    mix = dict(CLIP_MIX if mix is None else mix)
    if set(mix) - set(CLIP_MIX) or any(v < 0 for v in mix.values()) or not sum(mix.values()) > 0:
        raise ValueError(f"mix={mix!r} is invalid; allowed: non-negative shares of {sorted(CLIP_MIX)}")
    names = list(mix)
    shares = np.array([mix[n] for n in names], dtype=np.float64)
    rng = np.random.default_rng(seed)
    graded = [p for p in graded_policies(chunk) if p.name not in FLOOR]
    env = PushSimEnv(chunk_size=chunk)
    starts = np.empty((num_clips, 3, 2), dtype=np.float64)
    actions = np.empty((num_clips, steps, 2), dtype=np.float32)
    seeds = np.empty(num_clips, dtype=np.int64)
    kinds = rng.choice(len(names), size=num_clips, p=shares / shares.sum())
    seeds[:] = mixture_seeds(num_clips, seed)
    for i in range(num_clips):
        env.reset(seed=int(seeds[i]))
        state, kind = env.state, names[kinds[i]]
        if kind == "steered":
            actions[i] = steered_actions(rng, state, steps)
        elif kind == "random":
            actions[i] = smooth_random_actions(rng, steps)
        elif kind == "policy":
            policy = graded[int(rng.integers(len(graded)))]
            actions[i] = policy_actions(policy, state, steps, chunk, int(seeds[i]))
        else:
            state, direction = contact_start(rng, state)
            actions[i] = contact_actions(rng, direction, steps)
        starts[i] = np.stack([state.effector, state.block, state.goal])
    return ClipSet(starts, actions, seeds), np.array([CLIP_KINDS.index(names[k]) for k in kinds])


def mixture_seeds(num_clips: int, seed: int) -> np.ndarray:
    """The `PushSimEnv.reset` seeds of `training_clips(num_clips, ..., seed)` (a generator of their own, so a
    check that they miss the evaluation ranges need not draw the clips)."""
    return np.random.default_rng([seed, 1]).integers(2**31, size=num_clips)


CLIP_KINDS = (*CLIP_MIX, "model_loop")  # kind indices of `training_clips` and the DAgger round


def concat_clips(*sets: ClipSet) -> ClipSet:
    """One ClipSet of several (seeds kept)."""
    return ClipSet(np.concatenate([s.starts for s in sets]), np.concatenate([s.actions for s in sets]),
                   np.concatenate([s.seeds for s in sets]))


def take_clips(clips: ClipSet, index: np.ndarray) -> ClipSet:
    return ClipSet(clips.starts[index], clips.actions[index], None if clips.seeds is None else clips.seeds[index])


def clips_from_seeds(seeds: list[int], steps: int, steer_share: float = 0.6) -> ClipSet:
    """One clip per seed, drawn like `generate_clips` draws one: the start is `PushSimEnv.reset(seed=s)` and
    the actions come from `np.random.default_rng(s)`, so a clip is fixed by its seed alone (evaluation
    clips from a documented seed range)."""
    env = PushSimEnv(chunk_size=4)
    starts = np.empty((len(seeds), 3, 2), dtype=np.float64)
    actions = np.empty((len(seeds), steps, 2), dtype=np.float32)
    for i, seed in enumerate(seeds):
        rng = np.random.default_rng(seed)
        env.reset(seed=int(seed))
        state = env.state
        starts[i] = np.stack([state.effector, state.block, state.goal])
        steer = rng.random() < steer_share
        actions[i] = steered_actions(rng, state, steps) if steer else smooth_random_actions(rng, steps)
    return ClipSet(starts, actions, np.asarray(seeds, dtype=np.int64))


def rollout_states(start: np.ndarray, actions: np.ndarray) -> list[PushState]:
    """The `len(actions) + 1` states of a clip (frame 0 is the start)."""
    state = PushState(start[0].copy(), start[1].copy(), start[2].copy())
    states = [state]
    for a in actions:
        state = physics_step(state, a)
        states.append(state)
    return states


def moving_cells(start: np.ndarray, actions: np.ndarray, cell: int, temporal: int = 4) -> np.ndarray:
    """`[1 + len(actions) // temporal, SIZE // cell, SIZE // cell]` bool: latent cells that the effector or the
    block overlaps in any pixel frame a latent frame covers (frame 0: the first frame; latent j >= 1: pixel
    frames `temporal*(j-1) .. temporal*j`), the cells where a rollout's errors live."""
    states = rollout_states(start, actions)
    grid = SIZE // cell
    out = np.zeros((1 + len(actions) // temporal, grid, grid), dtype=bool)
    for j in range(out.shape[0]):
        frames = [0] if j == 0 else range(temporal * (j - 1), temporal * j + 1)
        for f in frames:
            for centre, side in ((states[f].effector, EFFECTOR), (states[f].block, BLOCK)):
                lo = np.clip(np.floor((centre - side / 2) / cell).astype(int), 0, grid - 1)
                hi = np.clip(np.floor((centre + side / 2 - 1e-6) / cell).astype(int), 0, grid - 1)
                out[j, lo[1]: hi[1] + 1, lo[0]: hi[0] + 1] = True  # rows = y, columns = x
    return out


def render_clip(start: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """`[len(actions) + 1, 64, 64, 3]` uint8 frames of one clip."""
    return np.stack([render_state(s) for s in rollout_states(start, actions)])


def to_video_tensor(frames: np.ndarray):
    """uint8 `[B, T, H, W, 3]` -> float `[B, 3, T, H, W]` in [-1, 1] (the VAE's input range)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(frames)).float() / 127.5 - 1.0
    return x.permute(0, 4, 1, 2, 3).contiguous()  # [B, 3, T, H, W]


def clip_cells(clips: ClipSet, count: int, latent_hw: tuple[int, int]):
    """`[count, T, h, w]` bool tensor: `moving_cells` of the first `count` clips at the latent grid."""
    import torch

    cell = SIZE // latent_hw[1]
    return torch.from_numpy(np.stack([moving_cells(clips.starts[i], clips.actions[i], cell)
                                      for i in range(count)]))
