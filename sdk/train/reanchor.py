"""Re-anchored targets: what the simulator does from the state the model's own context shows.

The replay's window w follows from the true start, so once the model's context has drifted (the block in the
wrong place) the true window w is not what its context predicts, and training on it teaches the model to ignore
its context. Re-anchored, the simulator is the expert of the visited state instead: the effector and block read
(`detect_objects`) from the model's own last frame of window w-1, the episode's true goal, window w's actions
stepped from there (`physics_step`) and rendered. The target latents of window w are the frozen VAE's encoding of
the model's own frames up to window w-1 followed by those frames (the VAE is causal, so window w's latents see
the same past as the model's own). Window 0 follows the true first frame and keeps the replay's target; a window
whose anchor frame shows no effector or no block (a lost block) falls back to the replay's.
"""

from __future__ import annotations

import numpy as np
import torch
from worldstep.envs.push_sim import SIZE, PushState, detect_objects, physics_step, render_state

from .data import ClipSet, moving_cells, to_video_tensor
from .vae import encode_normalised


def anchor_state(frame: np.ndarray, goal: np.ndarray) -> PushState | None:
    """The state `frame` shows (effector and block detected, the episode's static `goal`); None when either is
    not seen."""
    found = detect_objects(frame)
    if found["effector"] is None or found["block"] is None:
        return None
    return PushState(found["effector"], found["block"], np.asarray(goal, dtype=np.float64).copy())


def simulate_window(state: PushState, actions: np.ndarray) -> np.ndarray:
    """`[len(actions), H, W, 3]` uint8: the frame after each action from `state`."""
    frames = []
    for a in actions:
        state = physics_step(state, a)
        frames.append(render_state(state))
    return np.stack(frames)


def window_anchors(clips: ClipSet, own_frames: np.ndarray, w: int, chunk: int) -> list[PushState | None]:
    """Per clip, the state its own last frame of window w-1 (pixel frame `w * chunk`) shows."""
    return [anchor_state(own_frames[i, w * chunk], clips.starts[i, 2]) for i in range(len(clips))]


def encode_window(vae, own_frames: np.ndarray, sims: list[np.ndarray], w: int, chunk: int,
                  batch: int) -> torch.Tensor:
    """`[len(sims), C, chunk // 4, h, w]`: window w's latents of [own frames 0 .. w*chunk, then sims[j]] for the
    clips `own_frames` holds (in order), `batch` clips per encode."""
    n = chunk // 4
    out = []
    for s in range(0, len(sims), batch):
        video = np.stack([np.concatenate([own_frames[j, :1 + w * chunk], sims[j]])
                          for j in range(s, min(s + batch, len(sims)))])  # [b, 1 + (w+1)*chunk, H, W, 3]
        out.append(encode_normalised(vae, to_video_tensor(video))[:, :, 1 + w * n:1 + (w + 1) * n])
    return torch.cat(out)


@torch.no_grad()
def reanchored_targets(vae, clips: ClipSet, own_frames: np.ndarray, true: torch.Tensor, chunk: int,
                       batch: int = 32) -> tuple[torch.Tensor, np.ndarray]:
    """(targets like `true` `[N, C, 1 + windows*n, h, w]`, anchors `[N, windows, 3, 2]`): window w >= 1 of clip i
    re-anchored on the state its own frames show (anchors[i, w]: effector, block, goal); NaN anchors mark the
    windows that keep the replay's latents (window 0, and every window whose anchor frame lost an object)."""
    n = chunk // 4
    windows = (true.shape[2] - 1) // n
    targets = true.clone()
    anchors = np.full((len(clips), windows, 3, 2), np.nan)
    for w in range(1, windows):
        states = window_anchors(clips, own_frames, w, chunk)
        found = [i for i, s in enumerate(states) if s is not None]
        if not found:
            continue
        sims = [simulate_window(states[i], clips.actions[i, w * chunk:(w + 1) * chunk]) for i in found]
        latents = encode_window(vae, own_frames[found], sims, w, chunk, batch)
        targets[found, :, 1 + w * n:1 + (w + 1) * n] = latents
        for i in found:
            anchors[i, w] = np.stack([states[i].effector, states[i].block, states[i].goal])
    return targets, anchors


def fallback_share(anchors: np.ndarray) -> tuple[int, int]:
    """(windows >= 1 that kept the replay's latents, windows >= 1 in all)."""
    missing = np.isnan(anchors[:, 1:, 0, 0])
    return int(missing.sum()), int(missing.size)


def anchored_cells(clips: ClipSet, anchors: np.ndarray, cells: torch.Tensor, chunk: int) -> torch.Tensor:
    """`cells` (`clip_cells` of the replay) with each re-anchored window's latent frames replaced by the cells its
    re-anchored effector and block cover, so the loss weighs the objects where the targets show them."""
    out = cells.clone()
    n, cell = chunk // 4, SIZE // cells.shape[-1]
    for i, w in zip(*np.nonzero(~np.isnan(anchors[:, :, 0, 0]))):
        window = moving_cells(anchors[i, w], clips.actions[i, w * chunk:(w + 1) * chunk], cell)  # [1 + n, g, g]
        out[i, 1 + w * n:1 + (w + 1) * n] = torch.from_numpy(window[1:])
    return out

