"""Train the small Wan 2.2-style VAE and encode clips to normalised latents.

The loss weights object pixels by what a rollout is judged on (the table is ~91% of each frame and would
otherwise dominate): the small moving objects (effector 64 px, block 144 px, edges included) x20, the
static goal ring x5; it adds 0.1 L1 for sharp edges and a tiny penalty on latent magnitude in place of
a KL term. Optional noise on the latents before decoding trains a decoder that keeps objects whole when
generated latents are a little off the encoder's (a rollout never decodes exact encoder latents).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from worldstep.envs.push_sim import BACKGROUND

from .data import ClipSet, render_clip, to_video_tensor

VAE_ARCH: dict[str, Any] = {
    "base_dim": 16,
    "decoder_base_dim": 16,
    "z_dim": 16,
    "dim_mult": [1, 2, 2, 2],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
}


def make_vae(arch: dict[str, Any], seed: int):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    z = int(arch["z_dim"])
    return AutoencoderKLWan(**arch, latents_mean=[0.0] * z, latents_std=[1.0] * z)


def encode_mean(vae, video: torch.Tensor) -> torch.Tensor:
    """`[B, 3, T, H, W]` in [-1, 1] -> posterior mean `[B, C, 1 + (T-1)/4, h, w]` (unnormalised)."""
    return vae.encode(video).latent_dist.mean


def object_weights(video: torch.Tensor, moving: float = 20.0, static: float = 5.0) -> torch.Tensor:
    """`[B, 1, T, H, W]` loss weights: `moving` on effector (red) and block (blue) pixels, `static` on the
    goal ring (green), 1 on the table; a pixel belongs to an object when its colour leaves the table's
    (soft edges included), and to the moving ones when red or blue dominates."""
    bg = torch.tensor(BACKGROUND / 127.5 - 1.0, dtype=video.dtype).view(1, 3, 1, 1, 1)
    on_object = (video - bg).abs().amax(dim=1, keepdim=True) > 0.05
    r, g, b = video[:, 0:1], video[:, 1:2], video[:, 2:3]
    is_moving = on_object & ((r > g) | (b > g))  # red or blue over green: effector or block
    weights = torch.where(on_object, torch.full_like(r, static), torch.ones_like(r))
    return torch.where(is_moving, torch.full_like(r, moving), weights)


def vae_loss(vae, video: torch.Tensor, latent_noise: float = 0.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, reconstruction) for a `[B, 3, T, H, W]` batch; `latent_noise` (relative to each latent channel's
    spread in the batch) perturbs the decoder's input by a uniform-random share of that level per clip."""
    mu = encode_mean(vae, video)
    z = mu
    if latent_noise > 0:
        spread = mu.detach().std(dim=(0, 2, 3, 4), keepdim=True)  # [1, C, 1, 1, 1]
        level = torch.rand(mu.shape[0], 1, 1, 1, 1, generator=generator) * latent_noise
        z = mu + level * spread * torch.randn(mu.shape, generator=generator)
    recon = vae.decode(z).sample
    w = object_weights(video)
    mse = (w * (recon - video) ** 2).mean() / w.mean()
    loss = mse + 0.1 * F.l1_loss(recon, video) + 1e-4 * mu.pow(2).mean()
    return loss, recon


def sample_vae_batch(clips: ClipSet, rng: np.random.Generator, batch: int, frames: int = 17) -> torch.Tensor:
    """Random `frames`-long crops (starting on a 4-frame boundary) of random clips, as a video tensor."""
    out = []
    steps = clips.actions.shape[1]
    for _ in range(batch):
        i = int(rng.integers(len(clips)))
        start = 4 * int(rng.integers((steps + 1 - frames) // 4 + 1))
        video = render_clip(clips.starts[i], clips.actions[i, : start + frames - 1])
        out.append(video[start: start + frames])
    return to_video_tensor(np.stack(out))


@torch.no_grad()
def latent_stats(vae, clips: ClipSet, count: int = 64) -> tuple[list[float], list[float]]:
    """Per-channel mean/std of posterior means over `count` clips (the config's latents_mean/std)."""
    mus = [encode_mean(vae, to_video_tensor(render_clip(clips.starts[i], clips.actions[i])[None]))
           for i in range(min(count, len(clips)))]
    mu = torch.cat([m.transpose(0, 1).flatten(1) for m in mus], dim=1)  # [C, N]
    return mu.mean(1).tolist(), mu.std(1).clamp_min(1e-3).tolist()


@torch.no_grad()
def encode_normalised(vae, video: torch.Tensor) -> torch.Tensor:
    """`[B, 3, T, H, W]` in [-1, 1] -> latents `(mu - mean) / std` `[B, C, 1 + (T-1)/4, h, w]`, as the engine
    expects them."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (encode_mean(vae, video) - mean) / std


@torch.no_grad()
def encode_clips(vae, clips: ClipSet, batch: int = 8) -> torch.Tensor:
    """Normalised latents `[N, C, T, h, w]` of whole clips (`encode_normalised`)."""
    out = []
    for s in range(0, len(clips), batch):
        video = to_video_tensor(np.stack([render_clip(clips.starts[i], clips.actions[i])
                                          for i in range(s, min(s + batch, len(clips)))]))
        out.append(encode_normalised(vae, video))
    return torch.cat(out)
