"""Plain value types of a rollout: what the model is, where a session's frames come from, and what a window
returns and costs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .config import TEMPORAL_COMPRESSION


@dataclass(frozen=True)
class ModelSpec:
    """What a loaded checkpoint produces and accepts."""

    name: str
    height: int
    width: int
    fps: float
    action_dim: int
    num_domains: int
    latent_channels: int
    latent_height: int
    latent_width: int
    tokens_per_frame: int
    """vision tokens of one latent frame (the patch grid)"""
    patch_grid: tuple[int, int]
    temporal_compression: int = TEMPORAL_COMPRESSION
    spatial_compression: int = 16

    @property
    def action_tokens_per_frame(self) -> int:
        """Clean action tokens per latent frame: one per pixel frame it decodes to."""
        return self.temporal_compression

    @property
    def tokens_per_unit(self) -> int:
        """Cache tokens one committed latent frame costs: its vision tokens and its action tokens."""
        return self.tokens_per_frame + self.action_tokens_per_frame

    def at_latent_size(self, latent_height: int, latent_width: int, patch: int) -> ModelSpec:
        """This spec for frames of a ``latent_height x latent_width`` grid (a session on its own canvas)."""
        grid = (-(-latent_height // patch), -(-latent_width // patch))
        return replace(self, height=latent_height * self.spatial_compression,
                       width=latent_width * self.spatial_compression, latent_height=latent_height,
                       latent_width=latent_width, tokens_per_frame=grid[0] * grid[1], patch_grid=grid)


def window_tokens(units: int, tokens_per_frame: int, actions: int) -> int:
    """Tokens of one row of a window (what it attends with, and what its kv commit appends): the vision tokens of
    its ``units`` latent frames, then one token per action."""
    return units * tokens_per_frame + actions


@dataclass(frozen=True)
class SessionFrame:
    """Where a session's frames come from: its spec (latent grid, frame size), the caption's size, and the
    adapter's plan of the first frame (None: the model's frame size, the image cover-cropped)."""

    spec: ModelSpec
    caption_size: tuple[int, int]
    plan: Any = None


@dataclass(frozen=True)
class PhaseTimings:
    """Wall-clock seconds of one window: THIS SESSION'S SHARE of the step that ran it.

    The sessions of a group run one batched call per phase, so each window is charged the call's time divided by
    ``shared_by`` (the sessions in its group); ``other_s`` is the step's time outside every group's phases
    (checks, scheduling, admission, host copies, postprocess), divided by the step's sessions. The shares of one
    `step` therefore add up to its wall time, whatever the grouping (`of_group` gives the call's own figures).
    A window decoded later by `RolloutLoop.decode` gets that decode's own time as ``decode_s``.

    Timings are measurements, not state: two instances always compare equal, so two rollouts with the same
    seed and actions have equal infos (what gymnasium's determinism check compares).
    """

    denoise_s: float = field(default=0.0, compare=False)
    commit_s: float = field(default=0.0, compare=False)
    decode_s: float = field(default=0.0, compare=False)
    other_s: float = field(default=0.0, compare=False)
    shared_by: int = field(default=1, compare=False)

    @property
    def total_s(self) -> float:
        return self.denoise_s + self.commit_s + self.decode_s + self.other_s

    def of_group(self) -> PhaseTimings:
        """The phases of the group's batched call (each share times ``shared_by``)."""
        n = self.shared_by
        return PhaseTimings(n * self.denoise_s, n * self.commit_s, n * self.decode_s, n * self.other_s, n)


@dataclass(frozen=True)
class KVStats:
    pages_in_use: int
    protected_tokens: int
    released_tokens: int
    seq_len: int


@dataclass
class WindowResult:
    """One window of a rollout: its latents, its frames (window k covers pixel frames
    `[1 + k*chunk, 1 + (k+1)*chunk)`; frame 0 is the first image) and what it cost."""

    window_index: int
    latents: torch.Tensor  # [C, t, h, w], CPU float32, normalised model space
    frames: np.ndarray | None  # [chunk, H, W, 3] uint8
    frame_start: int
    frame_end: int
    timings: PhaseTimings
    kv: KVStats


def charge_step_overhead(results: list[WindowResult], step_s: float) -> list[WindowResult]:
    """Give each window of a step an equal share of the step's time outside its groups' phases (``other_s``), so
    the results' `PhaseTimings` add up to ``step_s``, the step's wall time."""
    other = max(0.0, step_s - sum(r.timings.total_s for r in results)) / max(1, len(results))
    for r in results:
        r.timings = replace(r.timings, other_s=other)
    return results
