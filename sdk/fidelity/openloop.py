"""Open-loop fidelity: held-out clips through the simulator and the model, scored per window with intervals.

Every clip is fixed by a seed of one evaluation range (`clips_from_seeds`). Frames are scored by PSNR
and SSIM, and objects by the simulator's own colour detector. A frame where the detector cannot find
an object is a failure, never dropped: it counts in the object-vanish rate, and in the moved-block
error it costs `VANISHED_PX`. The moved-block error is measured only on frames where the simulator's
block has moved at least `MOVED_PX` from its start, where copying the first frame is wrong by
construction; the fair "nothing moves" control is the model's own VAE round trip of the first frame
(`copy_first_frame_vae`), since every model frame passes through that decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from worldstep.envs.push_sim import detect_objects, render_state
from worldstep.train.data import clips_from_seeds, rollout_states

from ..measures.frames import psnr, ssim
from ..measures.intervals import Estimate, bootstrap, nanmean, per_window_estimates

VANISHED_PX = 32.0  # error charged to a frame whose block the detector cannot find (half the frame width)
MOVED_PX = 1.0  # a block counts as moved once its centre is this far from where it started


@dataclass(frozen=True)
class HeldOut:
    """Clips `[N]`: first frames `[N, H, W, 3]`, true frames 1..T `[N, T, H, W, 3]`, true states
    `[N, T, 3, 2]` (effector, block, goal) of those frames, start states `[N, 3, 2]`, actions `[N, T, 2]`."""

    seeds: list[int]
    first: np.ndarray
    truth: np.ndarray
    states: np.ndarray
    start: np.ndarray
    actions: np.ndarray


def held_out(seeds: list[int], steps: int) -> HeldOut:
    """The simulator's side of the clips with these seeds, `steps` actions each."""
    clips = clips_from_seeds(seeds, steps)
    first, truth, states = [], [], []
    for start, actions in zip(clips.starts, clips.actions):
        traj = rollout_states(start, actions)
        frames = np.stack([render_state(s) for s in traj])
        first.append(frames[0])
        truth.append(frames[1:])
        states.append(np.stack([np.stack([s.effector, s.block, s.goal]) for s in traj[1:]]))
    return HeldOut(list(seeds), np.stack(first), np.stack(truth), np.stack(states), clips.starts, clips.actions)


@dataclass(frozen=True)
class FrameScores:
    """Per clip and frame `[N, T]`: PSNR, SSIM, object centroid errors (NaN: not detected) and whether the
    simulator's block has moved from its start."""

    psnr: np.ndarray
    ssim: np.ndarray
    effector_error: np.ndarray
    block_error: np.ndarray
    moved: np.ndarray

    @property
    def moved_block_error(self) -> np.ndarray:
        """`[N, T]` block error on moved frames, `VANISHED_PX` where the block vanished, NaN elsewhere."""
        err = np.where(np.isnan(self.block_error), VANISHED_PX, self.block_error)
        return np.where(self.moved, err, np.nan)


def score_frames(pred: np.ndarray, held: HeldOut) -> FrameScores:
    """Score model (or baseline) frames `[N, T, H, W, 3]` against the held-out truth."""
    n, t = pred.shape[:2]
    flat_p, flat_t = pred.reshape(n * t, *pred.shape[2:]), held.truth.reshape(n * t, *held.truth.shape[2:])
    states = held.states.reshape(n * t, 3, 2)
    errors = object_errors(flat_p, states)
    moved = np.linalg.norm(held.states[:, :, 1] - held.start[:, None, 1], axis=-1) >= MOVED_PX  # [N, T]
    return FrameScores(psnr(flat_p, flat_t).reshape(n, t), ssim(flat_p, flat_t).reshape(n, t),
                       errors["effector"].reshape(n, t), errors["block"].reshape(n, t), moved)


def object_errors(frames: np.ndarray, states: np.ndarray) -> dict[str, np.ndarray]:
    """Centroid error (px) of the effector and block detected in `frames` `[N, H, W, 3]` vs true
    `states` `[N, 3, 2]` (effector, block, goal); NaN where the object is not detected."""
    out = {"effector": np.full(len(frames), np.nan), "block": np.full(len(frames), np.nan)}
    for i, frame in enumerate(frames):
        found = detect_objects(frame)
        for j, name in enumerate(("effector", "block")):
            if found[name] is not None:
                out[name][i] = float(np.linalg.norm(found[name] - states[i, j]))
    return out


def per_window(values: np.ndarray, chunk: int) -> np.ndarray:
    """`[N, W*chunk]` -> `[N, W]` per-clip window means (NaN-aware; NaN where a window has no value)."""
    n, t = values.shape
    return nanmean(values.reshape(n, t // chunk, chunk), axis=2)


def series(estimates: list[Estimate]) -> dict[str, list[float]]:
    """Per-window estimates as parallel lists (JSON and charts)."""
    return {"value": [e.value for e in estimates], "low": [e.low for e in estimates],
            "high": [e.high for e in estimates]}


def summarize(scores: FrameScores, chunk: int, seed: int = 0) -> dict[str, Any]:
    """Per-window means over clips with 95% bootstrap intervals (clips resampled)."""
    eff_missing = np.isnan(scores.effector_error).astype(float)
    blk_missing = np.isnan(scores.block_error).astype(float)
    rows = {
        "psnr_db": scores.psnr, "ssim": scores.ssim,
        "object_vanish_rate": np.maximum(eff_missing, blk_missing), "block_vanish_rate": blk_missing,
        "effector_vanish_rate": eff_missing,
        "effector_error_detected_px": scores.effector_error, "block_error_detected_px": scores.block_error,
        "moved_block_error_px": scores.moved_block_error,
    }
    out = {name: series(per_window_estimates(per_window(v, chunk), seed=seed + k))
           for k, (name, v) in enumerate(rows.items())}
    out["moved_block_frames"] = [int(x) for x in scores.moved.reshape(len(scores.moved), -1, chunk).sum(axis=(0, 2))]
    return out


def moved_error_difference(model: FrameScores, baseline: FrameScores, chunk: int, seed: int = 0) -> list[Estimate]:
    """Per window: mean moved-block error of `model` minus `baseline` over the same frames (negative: the
    model is better), clips resampled in pairs."""
    a = per_window(model.moved_block_error, chunk)
    b = per_window(baseline.moved_block_error, chunk)
    out = []
    for w in range(a.shape[1]):
        diff = a[:, w] - b[:, w]
        out.append(bootstrap(lambda idx, d=diff: nanmean(d[idx]), len(diff), seed=seed + w))
    return out


def changed_pixel_share(held: HeldOut, chunk: int) -> list[float]:
    """Per window: the share of the simulator's pixels that differ from the first frame (any channel by more
    than 8 of 255), i.e. how much of a frame any dynamics is about; the rest a still image scores on."""
    changed = (np.abs(held.truth.astype(np.int16) - held.first[:, None].astype(np.int16)) > 8).any(axis=-1)
    per_frame = changed.mean(axis=(-2, -1))  # [N, T]
    return [float(x) for x in per_window(per_frame, chunk).mean(axis=0)]
