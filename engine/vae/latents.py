"""Model-space latents <-> raw Wan VAE latents, with the Cosmos3 pipeline's exact arithmetic.

The denoiser works on normalised latents `(mu - mean) / std`. The pipeline stores `inv_std =
1 / std` in the VAE's dtype and multiplies/divides by it; doing the same here (instead of `* std`)
keeps our frames and first-frame latents bit-identical to the pipeline's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LatentNorm:
    """Per-channel statistics of one VAE, on its device and in its dtype.

    Attributes:
        mean: `[1, C, 1, 1, 1]` the VAE config's `latents_mean`.
        inv_std: `[1, C, 1, 1, 1]` `1 / latents_std`.
    """

    mean: torch.Tensor
    inv_std: torch.Tensor

    @classmethod
    def from_vae(cls, vae: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> LatentNorm:
        cfg = vae.config
        if cfg.latents_mean is None or cfg.latents_std is None:
            raise ValueError("the VAE config has no latents_mean/latents_std; cannot (de)normalise latents")
        if len(cfg.latents_mean) != cfg.z_dim or len(cfg.latents_std) != cfg.z_dim:
            raise ValueError(
                f"latents_mean/latents_std must have z_dim = {cfg.z_dim} entries, "
                f"got {len(cfg.latents_mean)} and {len(cfg.latents_std)}"
            )
        mean = torch.tensor(cfg.latents_mean, dtype=dtype)
        inv_std = 1.0 / torch.tensor(cfg.latents_std, dtype=dtype)
        return cls(mean.view(1, -1, 1, 1, 1).to(device), inv_std.view(1, -1, 1, 1, 1).to(device))

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """Args: z `[B, C, t, h, w]` model space. Returns raw latents in the VAE's dtype."""
        return z.to(self.mean.dtype) / self.inv_std + self.mean

    def normalize(self, mu: torch.Tensor) -> torch.Tensor:
        """Args: mu `[B, C, t, h, w]` raw VAE latents. Returns model-space latents, same dtype."""
        return (mu - self.mean) * self.inv_std
