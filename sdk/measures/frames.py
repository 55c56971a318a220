"""Frame quality: PSNR and SSIM of predicted against true uint8 frames, one definition for every part (the env's
truth overlay, replay, the viewer, the fidelity studies and training all score frames with these)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def psnr(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per-frame PSNR in dB of uint8 `[..., H, W, 3]` frames (capped at 60 dB for identical frames)."""
    diff = pred.astype(np.float64) - truth.astype(np.float64)
    mse = (diff**2).mean(axis=(-3, -2, -1))
    return np.minimum(10 * np.log10(255.0**2 / np.maximum(mse, 1e-10)), 60.0)


def _gaussian(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def ssim(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per-frame SSIM (Wang et al. 2004: 11-tap Gaussian, sigma 1.5, K1 0.01, K2 0.03), mean over RGB.

    Args:
        pred, truth: uint8 `[N, H, W, 3]`.
    Returns:
        `[N]` float64.
    """
    a = torch.from_numpy(pred.astype(np.float64)).permute(0, 3, 1, 2)  # [N, 3, H, W]
    b = torch.from_numpy(truth.astype(np.float64)).permute(0, 3, 1, 2)
    g = _gaussian()
    channels = a.shape[1]
    kx = g.view(1, 1, 1, -1).expand(channels, 1, 1, -1)
    ky = g.view(1, 1, -1, 1).expand(channels, 1, -1, 1)

    def blur(x: torch.Tensor) -> torch.Tensor:  # valid separable Gaussian per channel
        return F.conv2d(F.conv2d(x, kx, groups=channels), ky, groups=channels)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.mean(dim=(1, 2, 3)).numpy()
