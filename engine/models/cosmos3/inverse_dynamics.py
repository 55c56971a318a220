"""Cosmos3's inverse dynamics: a window's frames (or latents) in, the actions that connect them out.

The checkpoint's own transformer, run the way diffusers' `Cosmos3OmniPipeline` runs its ``"inverse_dynamics"``
action mode (`prepare_latents`, `_prepare_action_segment`, the denoising loop and its action output):

1. the clip of ``chunk + 1`` frames is encoded by the causal VAE to ``1 + chunk // 4`` latent frames; every one is
   a condition (clean tokens, no timestep embedding);
2. the ``chunk`` action tokens start from noise (the pipeline first draws, and discards, noise of the vision
   latents' shape from the same generator, so the same seed gives the same action noise here), zero past the
   embodiment's raw width;
3. each UniPC step embeds the noisy actions through the domain's action head plus the step's timestep embedding,
   runs the generation layers over `[vision | actions]` attending to the prompt's K/V and to each other, reads
   the velocity through `action_proj_out`, combines the CFG streams, and steps the actions (zero past the width);
4. the denoised action latents, cut to the raw width, are the inferred actions (in the model's normalised space).

Positions, tokens, attention and the scheduler are the forward rollout's maths modules (layout, tokens, layers,
unipc); the attention is dense (a text prefix and one clip: no pages). The parity with the pipeline on tiny random
weights is tests/test_cosmos3_inverse_dynamics.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...checks import check_fps, check_int
from ...vae.cache import count_slots, empty_cache
from ...vae.latents import LatentNorm
from .canvas import prepare_first_frame
from .layers import gen_layers, masked_attention, prefill_text, rotary
from .layout import action_positions, media_offset, vision_positions
from .prompt import PromptTokens
from .tokens import action_tokens, embed_timesteps, vision_tokens
from .unipc import UniPCStepper, unipc_plan

TEMPORAL = 4  # the Wan VAE's temporal compression: latent frame j > 0 covers pixel frames 4j - 3 .. 4j


@dataclass(frozen=True)
class ActionQuery:
    """Which actions to infer: the action head's domain, the embodiment's raw width, the fps of the positions."""

    domain_id: int
    action_width: int
    fps: float


def latent_frames(chunk_size: int) -> int:
    """Latent frames of a ``chunk_size + 1`` frame clip (the pipeline's ``(frames - 1) // 4 + 1``)."""
    return chunk_size // TEMPORAL + 1


def has_inverse_dynamics(transformer: Any) -> bool:
    """Whether a transformer has an action head to read actions out of (diffusers' ``action_gen``)."""
    return bool(getattr(getattr(transformer, "config", None), "action_gen", False)) and \
        hasattr(transformer, "action_proj_out")


@torch.no_grad()
def encode_clip(vae: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """A clip's clean normalised latents, as the pipeline's `_encode_video` (the posterior mode) computes them.

    The causal encoder sees frame 0 alone, then 4 frames at a time, through a cache of its own (not
    `vae.encode`, which resets the VAE's shared cache under a decoder that may be running).

    Args:
        pixels: `[1, 3, T, H, W]` float in [-1, 1], ``T = 1 + 4k``.
    Returns:
        `[C, 1 + k, H / s, W / s]` float32 on the VAE's device.
    """
    from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

    weight = vae.quant_conv.weight
    x = pixels.to(device=weight.device, dtype=weight.dtype)
    if vae.config.patch_size is not None:
        x = patchify(x, patch_size=vae.config.patch_size)  # [1, 3p^2, T, H/p, W/p]
    cache = empty_cache(count_slots(vae.encoder))
    chunks = [x[:, :, :1]] + [x[:, :, 1 + TEMPORAL * i: 1 + TEMPORAL * (i + 1)]
                              for i in range((x.shape[2] - 1) // TEMPORAL)]
    out = torch.cat([vae.encoder(c, feat_cache=cache, feat_idx=[0]) for c in chunks], dim=2)  # [1, 2C', t, h, w]
    mu = vae.quant_conv(out)[:, : vae.config.z_dim]  # [1, C, t, h, w]: the mean (the mode)
    return LatentNorm.from_vae(vae, weight.device, weight.dtype).normalize(mu)[0].float()


def clip_pixels(frames: np.ndarray, tier: int | None = None, spatial: int = 16) -> tuple[torch.Tensor, Any]:
    """`[T, H, W, 3]` uint8 frames -> `[1, 3, T, h, w]` in [-1, 1] and the canvas plan (None without a tier).

    With a tier each frame goes onto the pipeline's canvas (`canvas.prepare_first_frame`); the caller crops the
    encoded latents with `plan.crop_latents`. Without one the frames must already be the model's size.
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames of shape {frames.shape} and dtype {frames.dtype} are invalid; allowed: "
                         "uint8 [T, H, W, 3]")
    if tier is None:
        pixels = torch.from_numpy(frames.astype(np.float32) / 127.5 - 1.0).permute(3, 0, 1, 2)  # [3, T, H, W]
        return pixels.unsqueeze(0), None
    canvases = [prepare_first_frame(frame, tier, spatial) for frame in frames]
    pixels = torch.stack([c for c, _ in canvases], dim=2)  # [1, 3, T, h, w]
    return pixels, canvases[0][1]


@torch.no_grad()
def infer_actions(components: Any, latents: torch.Tensor, prompt: PromptTokens, query: ActionQuery, *,
                  chunk_size: int, num_steps: int, guidance_scale: float = 1.0, flow_shift: float | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """The actions that connect a clip's latent frames, denoised by the checkpoint's own transformer.

    Args:
        components: the loaded checkpoint (`Cosmos3Components`: transformer, unipc_config,
            use_native_flow_schedule).
        latents: `[C, 1 + chunk_size // 4, h, w]` the clip's clean normalised latents (`encode_clip`).
        prompt: the cond ids (the action JSON caption) and, under CFG, the uncond ids (`tokenize_action_prompt`).
        query: domain, raw width and fps.
        chunk_size: actions to infer (the clip has ``chunk_size + 1`` frames).
        num_steps: UniPC steps.
        guidance_scale: text CFG, >= 1 (1.0: the cond stream alone).
        flow_shift: None: the scheduler config's ``flow_shift``.
        generator: the noise (see the module docstring for its order).
    Returns:
        `[chunk_size, action_width]` float32 on the CPU: the inferred actions in the model's normalised space.
    """
    transformer = components.transformer
    _check(transformer, latents, query, chunk_size, num_steps, guidance_scale)
    config, weight = transformer.config, transformer.proj_in.weight
    device, dtype = weight.device, weight.dtype
    latents = latents.to(device=device, dtype=torch.float32)

    # noise: the pipeline's draws, in its order (vision noise first, unused: every vision frame is a condition)
    torch.randn((1, *latents.shape), generator=generator, dtype=torch.float32)
    noisy = torch.randn((chunk_size, config.action_dim), generator=generator, dtype=torch.float32).to(device)
    noisy[:, query.action_width:] = 0

    streams = [_Stream.of(transformer, ids, latents, chunk_size, query.fps)
               for ids in ([prompt.cond] + ([prompt.uncond] if guidance_scale != 1.0 else []))]
    vision = vision_tokens(transformer, latents, latents.shape[1], None)  # [T*hw, hidden]: clean at every step
    shift = components.unipc_config.get("flow_shift", 1.0) if flow_shift is None else flow_shift
    plan = unipc_plan(components.unipc_config, num_steps, shift, components.use_native_flow_schedule)
    stepper = UniPCStepper(plan)
    for step in plan.timesteps:
        temb = embed_timesteps(transformer, torch.full((1,), float(step), device=device)).to(dtype)  # [1, hidden]
        hidden = torch.cat([vision, action_tokens(transformer, noisy, query.domain_id) + temb])  # [tokens, hidden]
        velocities = [stream.velocity(transformer, hidden, query) for stream in streams]  # [chunk, action_dim]
        velocity = velocities[0] if len(velocities) == 1 else \
            velocities[1] + guidance_scale * (velocities[0] - velocities[1])
        noisy = stepper.step(velocity.unsqueeze(0), noisy.unsqueeze(0))[0]  # [chunk, action_dim]
        noisy[:, query.action_width:] = 0
    return noisy[:, :query.action_width].cpu()


@dataclass
class _Stream:
    """One CFG stream: its prompt's K/V (what the clip attends to) and the rotary tables of the clip behind it."""

    attend: Any  # layers.Attend: the prompt's K/V, then the clip's own tokens
    cos: torch.Tensor  # [tokens, head_dim]
    sin: torch.Tensor
    chunk: int  # action tokens, last in the clip

    @classmethod
    def of(cls, transformer, ids: list[int], latents: torch.Tensor, chunk_size: int, fps: float) -> _Stream:
        config, device = transformer.config, transformer.proj_in.weight.device
        text_k, text_v = prefill_text(transformer, torch.tensor(ids, device=device))  # [layers, L, Hkv, D]
        grid = (-(-latents.shape[2] // config.latent_patch_size), -(-latents.shape[3] // config.latent_patch_size))
        tokens = latents.shape[1] * grid[0] * grid[1] + chunk_size
        mask = torch.ones(tokens, tokens, dtype=torch.bool, device=device)  # the clip sees all of itself
        timing = dict(offset=media_offset(len(ids), config.unified_3d_mrope_temporal_modality_margin), fps=fps,
                      base_fps=float(config.base_fps), temporal_compression=TEMPORAL)
        positions = torch.cat([vision_positions(0, latents.shape[1], *grid, **timing),
                               action_positions(0, chunk_size, **timing)], dim=1)  # [3, tokens]
        return cls(masked_attention(text_k, text_v, mask), *rotary(transformer, positions, text_k.dtype), chunk_size)

    def velocity(self, transformer, hidden: torch.Tensor, query: ActionQuery) -> torch.Tensor:
        """`[tokens, hidden]` window tokens -> the actions' velocity `[chunk, action_dim]`, zero past the width."""
        out = gen_layers(transformer, hidden, self.cos, self.sin, self.attend).hidden  # [tokens, hidden]
        actions = out[-self.chunk:]  # [chunk, hidden]
        domains = torch.full((self.chunk,), query.domain_id, dtype=torch.long, device=hidden.device)
        velocity = transformer.action_proj_out(actions, domains).float()  # [chunk, action_dim]
        velocity[:, query.action_width:] = 0
        return velocity


def _check(transformer, latents: torch.Tensor, query: ActionQuery, chunk_size: int, num_steps: int,
           guidance_scale: float) -> None:
    """ValueErrors naming the argument, before any model work."""
    if not has_inverse_dynamics(transformer):
        raise ValueError("components.transformer has no action head (action_gen=False): no inverse dynamics")
    config = transformer.config
    check_int("chunk_size", chunk_size, 1)
    check_int("num_steps", num_steps, 1)
    check_int("query.domain_id", query.domain_id, 0, config.num_embodiment_domains)
    check_int("query.action_width", query.action_width, 1, config.action_dim + 1)
    check_fps("query.fps", query.fps)
    if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, (int, float)) or \
            not math.isfinite(guidance_scale) or guidance_scale < 1:
        raise ValueError(f"guidance_scale={guidance_scale!r} is invalid; allowed: a number >= 1")
    if not isinstance(latents, torch.Tensor) or latents.ndim != 4 or latents.shape[1] != latent_frames(chunk_size):
        shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
        raise ValueError(f"latents of shape {shape} are invalid; allowed: [C, {latent_frames(chunk_size)}, h, w] "
                         f"for chunk_size={chunk_size}")
