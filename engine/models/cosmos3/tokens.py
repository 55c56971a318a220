"""Window tokens: patchified vision latents and clean action tokens, embedded for the generation pathway."""

from __future__ import annotations

import torch


def patchify(latents: torch.Tensor, patch: int) -> torch.Tensor:
    """`[C, T, h, w]` latents -> `[T * h/p * w/p, p*p*C]` tokens in frame, row, column order."""
    channels, frames, height, width = latents.shape
    padded_h, padded_w = -(-height // patch) * patch, -(-width // patch) * patch
    if (padded_h, padded_w) != (height, width):
        latents = torch.nn.functional.pad(latents, (0, padded_w - width, 0, padded_h - height))
    x = latents.reshape(channels, frames, padded_h // patch, patch, padded_w // patch, patch)  # [C,T,h,p,w,q]
    return torch.einsum("cthpwq->thwpqc", x).reshape(-1, patch * patch * channels)  # [T*h*w, p*p*C]


def unpatchify(tokens: torch.Tensor, frames: int, height: int, width: int, channels: int, patch: int) -> torch.Tensor:
    """Inverse of `patchify`: `[T * h/p * w/p, p*p*C]` -> `[C, T, h, w]` (padding cropped)."""
    grid_h, grid_w = -(-height // patch), -(-width // patch)
    x = tokens.reshape(frames, grid_h, grid_w, patch, patch, channels)  # [T,h,w,p,q,C]
    x = torch.einsum("thwpqc->cthpwq", x).reshape(channels, frames, grid_h * patch, grid_w * patch)
    return x[:, :, :height, :width]


def tokens_per_frame(latent_height: int, latent_width: int, patch: int) -> int:
    return -(-latent_height // patch) * -(-latent_width // patch)


@torch.no_grad()
def timestep_embedding(transformer, timestep: float, device, dtype) -> torch.Tensor:
    """`[1, hidden]` embedding of one diffusion timestep (the model's `timestep_scale` applied)."""
    t = torch.full((1,), float(timestep), device=device) * transformer.config.timestep_scale
    embedder_dtype = next(transformer.time_embedder.parameters()).dtype
    return transformer.time_embedder(transformer.time_proj(t).to(embedder_dtype)).to(dtype)  # [1, hidden]


@torch.no_grad()
def embed_vision(
    transformer, latents: torch.Tensor, noisy_from: int, timestep: float | None, temb: torch.Tensor | None = None
) -> torch.Tensor:
    """Embed `[C, T, h, w]` latents; frames `noisy_from..T-1` get the timestep embedding when one is given
    (`temb` `[1, hidden]` lets a batch compute it once per step)."""
    patch = transformer.config.latent_patch_size
    weight = transformer.proj_in.weight
    tokens = transformer.proj_in(patchify(latents.to(weight.dtype), patch))  # [T*hw, hidden]
    if timestep is not None:
        if temb is None:
            temb = timestep_embedding(transformer, timestep, tokens.device, tokens.dtype)
        start = noisy_from * (tokens.shape[0] // latents.shape[1])
        tokens[start:] = tokens[start:] + temb
    return tokens


@torch.no_grad()
def embed_actions(transformer, actions: torch.Tensor, domain_id: int) -> torch.Tensor:
    """Clean action tokens: `[A, action_dim]` -> `[A, hidden]` through the domain's `DomainAwareLinear`."""
    weight = transformer.proj_in.weight
    domains = torch.full((actions.shape[0],), int(domain_id), dtype=torch.long, device=weight.device)
    tokens = transformer.action_proj_in(actions.to(device=weight.device, dtype=weight.dtype), domains)
    return tokens + transformer.action_modality_embed  # [A, hidden]


@torch.no_grad()
def project_out(transformer, hidden: torch.Tensor) -> torch.Tensor:
    """Generation hidden states of vision tokens -> `[N, p*p*C]` velocity patches."""
    return transformer.proj_out(hidden)
