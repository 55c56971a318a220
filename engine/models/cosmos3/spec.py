"""Plain value types of a rollout: what the model is, the knobs of a session, what a window returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

WindowMode = Literal["kv", "chained"]
VIEW_POINTS = ("ego_view", "third_person_view", "wrist_view", "concat_view")


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
    temporal_compression: int = 4
    spatial_compression: int = 16


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class RolloutKnobs:
    """Per-session rollout settings; every bad value raises ValueError naming the knob."""

    chunk_size: int = 4
    num_steps: int = 4
    guidance_scale: float = 1.0
    context_frames: int = 0
    window_mode: WindowMode = "kv"
    flow_shift: float = 5.0
    negative_prompt: str = ""
    view_point: str = "ego_view"
    decode: bool = True

    def __post_init__(self) -> None:
        if not _is_int(self.chunk_size) or self.chunk_size < 4 or self.chunk_size % 4:
            raise ValueError(f"chunk_size={self.chunk_size!r} is invalid; allowed: an int multiple of 4, >= 4")
        if not _is_int(self.num_steps) or self.num_steps < 1:
            raise ValueError(f"num_steps={self.num_steps!r} is invalid; allowed: an int >= 1")
        if not _is_real(self.guidance_scale) or not np.isfinite(self.guidance_scale) or self.guidance_scale < 1:
            raise ValueError(f"guidance_scale={self.guidance_scale!r} is invalid; allowed: a finite number >= 1")
        if not _is_int(self.context_frames) or self.context_frames < 0:
            raise ValueError(f"context_frames={self.context_frames!r} is invalid; allowed: an int >= 0 (0 = unbounded)")
        if self.window_mode not in ("kv", "chained"):
            raise ValueError(f"window_mode={self.window_mode!r} is invalid; allowed: 'kv' or 'chained'")
        if not _is_real(self.flow_shift) or not np.isfinite(self.flow_shift) or self.flow_shift <= 0:
            raise ValueError(f"flow_shift={self.flow_shift!r} is invalid; allowed: a finite number > 0")
        if not isinstance(self.negative_prompt, str):
            raise ValueError(f"negative_prompt={self.negative_prompt!r} is invalid; allowed: a string")
        if self.view_point not in VIEW_POINTS:
            raise ValueError(f"view_point={self.view_point!r} is invalid; allowed: one of {VIEW_POINTS}")
        if not isinstance(self.decode, bool):
            raise ValueError(f"decode={self.decode!r} is invalid; allowed: true or false")

    @property
    def latents_per_window(self) -> int:
        return self.chunk_size // 4

    @property
    def uses_cfg(self) -> bool:
        return self.guidance_scale > 1.0


@dataclass(frozen=True)
class PhaseTimings:
    """Wall-clock seconds per phase of one window.

    Timings are measurements, not state: two instances always compare equal, so two rollouts with the
    same seed and actions have equal results and env infos (what gymnasium's determinism check compares).
    """

    denoise_s: float = field(default=0.0, compare=False)
    commit_s: float = field(default=0.0, compare=False)
    decode_s: float = field(default=0.0, compare=False)

    @property
    def total_s(self) -> float:
        return self.denoise_s + self.commit_s + self.decode_s


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
