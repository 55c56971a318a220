"""Frame and object metrics shared by every fidelity number: PSNR, SSIM, centroid error, rank correlation."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from worldstep.envs.push_sim import detect_objects


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


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), as Spearman's rho needs."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=np.float64)
    for value in np.unique(x):
        tie = x == value
        ranks[tie] = ranks[tie].mean()
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r; NaN when either side is constant."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rho (Pearson on average ranks); NaN when either side is constant."""
    return pearson(_ranks(np.asarray(x)), _ranks(np.asarray(y)))
