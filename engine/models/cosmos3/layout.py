"""Absolute 3D mRoPE positions of a forward-dynamics rollout, any window, any length.

Text sits at `0..L-1` on all three axes. Vision and action tokens share the media offset
`O = L + margin`. With fps modulation, latent frame j is at `t = O + j * base_fps / fps` and action i
(the transition into pixel frame i + 1) at `t = O + (i + 1) * base_fps / (tcf * fps)`; h/w are the
patch row/column. Positions are computed from absolute indices, so a window sliced from an
open-ended rollout gets exactly the positions a whole-clip layout would give it, and nothing is
re-based after eviction (K is stored after RoPE).
"""

from __future__ import annotations

import torch


def text_positions(num_tokens: int) -> torch.Tensor:
    """[3, L] float positions of the text prefix."""
    ids = torch.arange(num_tokens, dtype=torch.float32)
    return ids.unsqueeze(0).expand(3, -1).contiguous()  # [3, L]


def media_offset(num_text_tokens: int, margin: int) -> int:
    return num_text_tokens + margin


def vision_positions(
    frame_start: int,
    frame_end: int,
    grid_h: int,
    grid_w: int,
    *,
    offset: float,
    fps: float,
    base_fps: float,
    temporal_compression: int = 4,
) -> torch.Tensor:
    """[3, (frame_end - frame_start) * grid_h * grid_w] positions of latent frames [frame_start, frame_end)."""
    frames = torch.arange(frame_start, frame_end, dtype=torch.float32)
    t = frames / (fps / temporal_compression) * (base_fps / temporal_compression) + offset  # [T]
    num_frames = frame_end - frame_start
    t = t.view(-1, 1).expand(-1, grid_h * grid_w).flatten()  # [T*h*w]
    h = torch.arange(grid_h, dtype=torch.float32).view(1, -1, 1).expand(num_frames, -1, grid_w).flatten()
    w = torch.arange(grid_w, dtype=torch.float32).view(1, 1, -1).expand(num_frames, grid_h, -1).flatten()
    return torch.stack([t, h, w], dim=0)  # [3, T*h*w]


def action_positions(
    action_start: int, action_end: int, *, offset: float, fps: float, base_fps: float, temporal_compression: int
) -> torch.Tensor:
    """[3, action_end - action_start] positions of actions [action_start, action_end)."""
    index = torch.arange(action_start, action_end, dtype=torch.float32)
    t = (index + 1) / fps * (base_fps / temporal_compression) + offset  # [A]
    zeros = torch.zeros_like(t)
    return torch.stack([t, zeros, zeros], dim=0)  # [3, A]
