"""Decoder output -> uint8 frames, the way `AutoencoderKLWan._decode` and diffusers'
`VideoProcessor.postprocess_video(..., output_type="pil")` do it, one decoder call at a time."""

from __future__ import annotations

import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify


def frames_per_window(latents: int, first: bool, temporal_factor: int = 4) -> int:
    """Frames decoded from a window of `latents` latent frames: `1 + 4(w-1)` first, `4w` later."""
    return 1 + temporal_factor * (latents - 1) if first else temporal_factor * latents


def pixels_from_decoder(out: torch.Tensor, patch_size: int | None) -> torch.Tensor:
    """Unpatchify (Wan 2.2) then clamp to [-1, 1], in that order, as `_decode` does.

    Args:
        out: `[B, C_out, T, H/p, W/p]` raw decoder output, `C_out = 3 p^2`.
    Returns:
        `[B, 3, T, H, W]` pixels in [-1, 1].
    """
    if patch_size is not None:
        out = unpatchify(out, patch_size=patch_size)  # [B,3,T,H,W]
    return out.clamp(min=-1.0, max=1.0)


def frames_u8(pixels: torch.Tensor) -> torch.Tensor:
    """Map pixels in [-1, 1] to uint8 frames where they live (no host copy).

    Matches diffusers' postprocess bit for bit: `(x * 0.5 + 0.5).clamp(0, 1)` in the pixels' dtype, then
    float32 `* 255`, round half to even, uint8; only a quarter of the bytes then cross to the host.

    Args:
        pixels: one video, `[1, 3, T, H, W]` or `[3, T, H, W]` (channels, then time).
    Returns:
        uint8 `[T, H, W, 3]` on the pixels' device.
    """
    if pixels.ndim == 5:
        if pixels.shape[0] != 1:
            raise ValueError(f"pixels must hold one video, got batch {pixels.shape[0]}")
        pixels = pixels[0]
    if pixels.ndim != 4 or pixels.shape[0] != 3:
        raise ValueError(f"pixels must be [1, 3, T, H, W] or [3, T, H, W], got {tuple(pixels.shape)}")
    unit = (pixels * 0.5 + 0.5).clamp(0, 1).float()  # [3,T,H,W]
    return (unit * 255).round().to(torch.uint8).permute(1, 2, 3, 0)  # [T,H,W,3]


def frames_from_pixels(pixels: torch.Tensor) -> np.ndarray:
    """`frames_u8` copied to a numpy array on the CPU."""
    return frames_u8(pixels).contiguous().cpu().numpy()
