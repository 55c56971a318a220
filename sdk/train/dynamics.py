"""The forward-dynamics training pass: what worldstep's kv rollout asks of the model, all windows at once.

A clip of `W` windows becomes one token sequence per clip (clips are batched along dim 0 and share
the text prefix, so a clip's tokens attend only to the text and to its own clip):

    [ clean window 0 .. W-2 | noisy window 0 .. W-1 ]

Window 0 holds latent frames `0..n` (frame 0 clean, the conditioning frame) and actions `0..chunk-1`;
window k >= 1 holds latent frames `1+kn .. (k+1)n` and its `chunk` actions. A clean window attends to
the text and clean windows <= itself (what the rollout's commit pass computes); a noisy window k
attends to the text, clean windows < k and itself (what a denoise step of window k computes against
the committed KV). Positions are the absolute ones of `layout.py`, and the token embedding and the
generation layers are the rollout's own functions (`tokens.vision_tokens`/`action_tokens`/
`embed_timesteps`, `runner.gen_layers`); only the attention differs: a dense masked one over the whole
clip (`runner.masked_attention`) instead of the paged one, window by window.
Loss: flow matching on the noisy frames, velocity = noise - clean, one noise level per window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from worldstep.engine.models.cosmos3.layers import gen_layers, masked_attention, rotary, text_kv
from worldstep.engine.models.cosmos3.layout import (
    action_positions,
    media_offset,
    vision_positions,
)
from worldstep.engine.models.cosmos3.tokens import action_tokens, embed_timesteps, unpatchify, vision_tokens
from worldstep.engine.spec import window_tokens


@dataclass(frozen=True)
class ClipLayout:
    """Token layout of a `windows`-window clip (per clip; every clip in a batch shares it)."""

    windows: int
    latents_per_window: int
    chunk: int
    tokens_per_frame: int
    context_tokens: int | None = None

    def frames(self, k: int) -> tuple[int, int]:
        n = self.latents_per_window
        return (0, 1 + n) if k == 0 else (1 + k * n, 1 + (k + 1) * n)

    def block_size(self, k: int) -> int:
        start, end = self.frames(k)
        return window_tokens(end - start, self.tokens_per_frame, self.chunk)

    def blocks(self) -> list[tuple[str, int]]:
        """(kind, window) in sequence order."""
        return [("clean", k) for k in range(self.windows - 1)] + [("noisy", k) for k in range(self.windows)]

    def gen_mask(self) -> torch.Tensor:
        """`[N, N]` bool: may gen token i attend to gen token j.

        Block k (clean or noisy) sees itself and the committed clean tokens before it; with
        `context_tokens` set, only the last `context_tokens` of them (the rollout's nominal retention
        horizon, `context_frames * (tokens_per_frame + chunk)`).
        """
        starts, pos = {}, 0  # offset of clean window k in the committed (rollout-order) stream
        for k in range(self.windows):
            starts[k] = pos
            pos += self.block_size(k)
        committed = torch.cat([torch.full((self.block_size(k),), starts[k]) + torch.arange(self.block_size(k))
                               for k in range(self.windows - 1)]) if self.windows > 1 else torch.zeros(0)
        n_clean = committed.numel()
        rows = []
        for kind, k in self.blocks():
            size = self.block_size(k)
            low = starts[k] - (self.context_tokens if self.context_tokens is not None else starts[k])
            row = torch.zeros(size, n_clean + sum(self.block_size(j) for j in range(self.windows)), dtype=torch.bool)
            row[:, :n_clean] = ((committed < starts[k]) & (committed >= low)).unsqueeze(0)
            if kind == "clean":
                row[:, starts[k]: starts[k] + size] = True
            else:
                own = n_clean + starts[k]
                row[:, own: own + size] = True
            rows.append(row)
        return torch.cat(rows, dim=0)

    def positions(self, text_len: int, margin: int, grid: tuple[int, int], fps: float, base_fps: float,
                  tc: int) -> torch.Tensor:
        """`[3, N]` positions of the gen tokens in sequence order."""
        offset = media_offset(text_len, margin)
        out = []
        for _, k in self.blocks():
            out.append(vision_positions(*self.frames(k), *grid, offset=offset, fps=fps, base_fps=base_fps,
                                        temporal_compression=tc))
            out.append(action_positions(k * self.chunk, (k + 1) * self.chunk, offset=offset, fps=fps,
                                        base_fps=base_fps, temporal_compression=tc))
        return torch.cat(out, dim=1)


@dataclass
class DynamicsBatch:
    """Clean latents `[B, C, T, h, w]` (normalised), actions `[B, W*chunk, action_dim]`, per-window
    noise levels `sigmas` `[B, W]` in [0, 1], `noise` shaped like the latents and optional loss
    `weights` `[B, 1, T-1, h, w]` of latent frames 1..T-1 (None: uniform)."""

    latents: torch.Tensor
    actions: torch.Tensor
    sigmas: torch.Tensor
    noise: torch.Tensor
    weights: torch.Tensor | None = None


class DynamicsModel:
    """The training-time view of a `Cosmos3OmniTransformer`: layout, cached mask/positions, loss."""

    def __init__(self, transformer, layout: ClipLayout, text_ids: torch.Tensor, domain_id: int,
                 latent_hw: tuple[int, int], fps: float, temporal_compression: int = 4) -> None:
        self.transformer = transformer
        self.layout = layout
        self.text_ids = text_ids
        self.domain_id = domain_id
        self.latent_hw = latent_hw
        cfg = transformer.config
        patch = cfg.latent_patch_size
        grid = (-(-latent_hw[0] // patch), -(-latent_hw[1] // patch))
        self.mask = layout.gen_mask()
        positions = layout.positions(len(text_ids), cfg.unified_3d_mrope_temporal_modality_margin, grid, fps,
                                     float(cfg.base_fps), temporal_compression)
        self.positions = positions
        self.blocks = layout.blocks()

    def velocity(self, batch: DynamicsBatch, context: torch.Tensor | None = None,
                 context_level: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(predicted, target) velocities of every noisy frame, each `[B, C, W*n, h, w]`.

        `context` `[B, C, T, h, w]` replaces the clean latents the committed windows are built from (a
        rollout commits its own, imperfect windows); the noisy windows and targets stay on `batch.latents`.
        `context_level` `[B]`: the flow level the context was noised at, given to its committed windows as their
        timestep (the engine's ``context_noise`` knob; frame 0 stays clean); None: no timestep, as released
        checkpoints commit.
        """
        tr, lay = self.transformer, self.layout
        z, sig = batch.latents, batch.sigmas
        text_k, text_v = text_kv(tr, self.text_ids)
        cos, sin = rotary(tr, self.positions, tr.proj_in.weight.dtype)  # [N, D]
        act = action_tokens(tr, batch.actions, self.domain_id)  # [B, W*chunk, hidden]
        temb = embed_timesteps(tr, sig.flatten() * 1000.0).unflatten(0, sig.shape)  # [B, W, hidden]
        ctx_temb = None if context_level is None else embed_timesteps(tr, context_level * 1000.0)[:, None]  # [B,1,hid]
        tokens, targets, noisy_slices, pos = [], [], [], 0
        for kind, k in self.blocks:
            start, end = lay.frames(k)
            frames = z[:, :, start:end]  # [B, C, f, h, w]
            clean_lead = 1 if k == 0 else 0
            if kind == "noisy":
                s = sig[:, k].view(-1, 1, 1, 1, 1)
                eps = batch.noise[:, :, start:end]
                noisy = (1 - s) * frames + s * eps
                noisy = torch.cat([frames[:, :, :clean_lead], noisy[:, :, clean_lead:]], dim=2)
                targets.append((eps - frames)[:, :, clean_lead:])
                vis = vision_tokens(tr, noisy, clean_lead, temb[:, k:k + 1])  # [B, f*hw, hidden]
                per_frame = vis.shape[1] // (end - start)
                noisy_slices.append((pos + clean_lead * per_frame, pos + vis.shape[1], end - start - clean_lead))
            else:
                ctx = frames if context is None else context[:, :, start:end]
                if ctx_temb is None:
                    vis = vision_tokens(tr, ctx, end - start, None)  # [B, f*hw, hidden]
                else:
                    vis = vision_tokens(tr, ctx, 1 if k == 0 else 0, ctx_temb)
            tokens += [vis, act[:, k * lay.chunk:(k + 1) * lay.chunk]]
            pos += vis.shape[1] + lay.chunk
        attend = masked_attention(text_k, text_v, self.mask)
        hidden = gen_layers(tr, torch.cat(tokens, dim=1), cos, sin, attend).hidden  # [B, N, hidden]
        h, w = self.latent_hw
        channels, patch = z.shape[1], tr.config.latent_patch_size
        preds = [unpatchify(tr.proj_out(hidden[:, s0:s1]), nf, h, w, channels, patch)  # [B, C, nf, h, w]
                 for s0, s1, nf in noisy_slices]
        return torch.cat(preds, dim=2), torch.cat(targets, dim=2)

    def loss(self, batch: DynamicsBatch, context: torch.Tensor | None = None,
             context_level: torch.Tensor | None = None) -> torch.Tensor:
        """Flow-matching MSE over every noisy frame, weighted by `batch.weights` when given."""
        pred, target = self.velocity(batch, context, context_level)
        if batch.weights is None:
            return F.mse_loss(pred.float(), target.float())
        weights = batch.weights.expand_as(pred)
        return (weights * (pred.float() - target.float()) ** 2).sum() / weights.sum()

    @torch.no_grad()
    def denoised(self, batch: DynamicsBatch) -> torch.Tensor:
        """`[B, C, T, h, w]`: frame 0 as given, every later frame the model's one-step estimate of it,
        `x_t - sigma * v`, from the noisy window at `batch.sigmas` given the clean past (a rollout's
        own imperfect windows, for training on them as context)."""
        pred, _ = self.velocity(batch)  # [B, C, T-1, h, w]
        n = self.layout.latents_per_window
        sig = batch.sigmas.repeat_interleave(n, dim=1).view(*batch.sigmas.shape[:1], 1, -1, 1, 1)  # [B,1,T-1,1,1]
        z, eps = batch.latents[:, :, 1:], batch.noise[:, :, 1:]
        noisy = (1 - sig) * z + sig * eps
        return torch.cat([batch.latents[:, :, :1], noisy - sig * pred], dim=2)


def sample_sigmas(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Noise levels: half uniform, half logit-normal (more mass mid-range), clipped to [0.001, 0.999]."""
    uniform = torch.rand(shape, generator=generator)
    logit = torch.sigmoid(torch.randn(shape, generator=generator))
    pick = torch.rand(shape, generator=generator) < 0.5
    return torch.where(pick, uniform, logit).clamp(0.001, 0.999)


def noised_context(context: torch.Tensor, level: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`[B, C, T, h, w]` context at flow level `level` `[B]`, `(1 - s) z + s eps`, frame 0 kept clean (what the
    engine commits with its ``context_noise`` knob)."""
    eps = torch.randn(context.shape, generator=generator)
    s = level.view(-1, 1, 1, 1, 1)
    out = (1 - s) * context + s * eps
    return torch.cat([context[:, :, :1], out[:, :, 1:]], dim=2)


def dyn_batch(latents: torch.Tensor, actions: np.ndarray, idx: np.ndarray, action_dim: int,
              gen: torch.Generator, windows: int, cells: torch.Tensor | None = None,
              moving_weight: float = 0.0) -> DynamicsBatch:
    """A batch of clips `idx`; with `cells` `[N, T, h, w]` (bool, `moving_cells`) the loss weighs the
    cells the effector or block covers `1 + moving_weight`, the rest 1."""
    z = latents[idx]
    a = torch.zeros(len(idx), actions.shape[1], action_dim)
    a[:, :, :2] = torch.from_numpy(actions[idx])
    weights = None
    if cells is not None and moving_weight > 0:
        weights = 1.0 + moving_weight * cells[idx][:, None, 1:].float()  # [B, 1, T-1, h, w]
    return DynamicsBatch(z, a, sample_sigmas(gen, (len(idx), windows)), torch.randn(z.shape, generator=gen),
                         weights)
