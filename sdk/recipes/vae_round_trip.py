"""The VAE round trip of a clip (encode, posterior mean, decode): the ceiling every model frame is bounded by,
since every model frame passes through that decoder. Replay and the fidelity report score it as a baseline."""

from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def vae_round_trip(vae: torch.nn.Module, clip: np.ndarray) -> np.ndarray:
    """One clip `[1 + T, H, W, 3]` uint8 through the VAE (encode, posterior mean, decode) -> frames 1..T."""
    x = torch.from_numpy(clip).float().div(127.5).sub(1).permute(3, 0, 1, 2)[None]  # [1, 3, 1 + T, H, W]
    y = vae.decode(vae.encode(x).latent_dist.mean).sample[0].clamp(-1, 1)  # [3, 1 + T, H, W]
    return ((y.permute(1, 2, 3, 0).numpy() + 1) * 127.5).round().astype(np.uint8)[1:]
