"""Window tokens: patchified vision latents and clean action tokens, embedded for the generation pathway.

One set of functions for training (differentiable) and the rollout (which runs them under the step's
`torch.inference_mode`).
"""

from __future__ import annotations

import torch


def patchify(latents: torch.Tensor, patch: int) -> torch.Tensor:
    """`[..., C, T, h, w]` latents -> `[..., T * h/p * w/p, p*p*C]` tokens in frame, row, column order."""
    *lead, channels, frames, height, width = latents.shape
    padded_h, padded_w = -(-height // patch) * patch, -(-width // patch) * patch
    if (padded_h, padded_w) != (height, width):
        latents = torch.nn.functional.pad(latents, (0, padded_w - width, 0, padded_h - height))
    x = latents.reshape(*lead, channels, frames, padded_h // patch, patch, padded_w // patch, patch)  # [..,C,T,h,p,w,q]
    return torch.einsum("...cthpwq->...thwpqc", x).reshape(*lead, -1, patch * patch * channels)  # [.., T*h*w, p*p*C]


def unpatchify(tokens: torch.Tensor, frames: int, height: int, width: int, channels: int, patch: int) -> torch.Tensor:
    """Inverse of `patchify`: `[..., T * h/p * w/p, p*p*C]` -> `[..., C, T, h, w]` (padding cropped)."""
    grid_h, grid_w = -(-height // patch), -(-width // patch)
    lead = tokens.shape[:-2]
    x = tokens.reshape(*lead, frames, grid_h, grid_w, patch, patch, channels)  # [..,T,h,w,p,q,C]
    x = torch.einsum("...thwpqc->...cthpwq", x).reshape(*lead, channels, frames, grid_h * patch, grid_w * patch)
    return x[..., :height, :width]


def tokens_per_frame(latent_height: int, latent_width: int, patch: int) -> int:
    return -(-latent_height // patch) * -(-latent_width // patch)


def embed_timesteps(transformer, timesteps: torch.Tensor) -> torch.Tensor:
    """`[M]` diffusion timesteps (0..1000) -> `[M, hidden]` (the model's `timestep_scale` applied); differentiable."""
    t = timesteps * transformer.config.timestep_scale
    embedder_dtype = next(transformer.time_embedder.parameters()).dtype
    return transformer.time_embedder(transformer.time_proj(t).to(embedder_dtype))  # [M, hidden]


def vision_tokens(transformer, latents: torch.Tensor, noisy_from: int, temb: torch.Tensor | None) -> torch.Tensor:
    """Embed `[..., C, T, h, w]` latents -> `[..., T*hw, hidden]`; frames `noisy_from..T-1` get `temb`
    (`[..., 1, hidden]`, one per clip) added when given; differentiable."""
    patch = transformer.config.latent_patch_size
    weight = transformer.proj_in.weight
    tokens = transformer.proj_in(patchify(latents.to(weight.dtype), patch))  # [.., T*hw, hidden]
    if temb is None:
        return tokens
    start = noisy_from * (tokens.shape[-2] // latents.shape[-3])
    return torch.cat([tokens[..., :start, :], tokens[..., start:, :] + temb.to(tokens.dtype)], dim=-2)


def action_tokens(transformer, actions: torch.Tensor, domain_id: int) -> torch.Tensor:
    """Clean action tokens: `[..., A, action_dim]` -> `[..., A, hidden]` through the domain's
    `DomainAwareLinear`; differentiable."""
    weight = transformer.proj_in.weight
    flat = actions.to(device=weight.device, dtype=weight.dtype).reshape(-1, actions.shape[-1])  # [M, action_dim]
    domains = torch.full((flat.shape[0],), int(domain_id), dtype=torch.long, device=weight.device)
    tokens = transformer.action_proj_in(flat, domains).reshape(*actions.shape[:-1], -1)  # [.., A, hidden]
    return tokens + transformer.action_modality_embed
