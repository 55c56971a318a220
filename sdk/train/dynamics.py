"""The forward-dynamics training pass: what worldstep's kv rollout asks of the model, all windows at once.

A clip of `W` windows becomes one token sequence per clip (clips are batched along dim 0 and share
the text prefix, so a clip's tokens attend only to the text and to its own clip):

    [ clean window 0 .. W-2 | noisy window 0 .. W-1 ]

Window 0 holds latent frames `0..n` (frame 0 clean, the conditioning frame) and actions `0..chunk-1`;
window k >= 1 holds latent frames `1+kn .. (k+1)n` and its `chunk` actions. A clean window attends to
the text and clean windows <= itself (what the rollout's commit pass computes); a noisy window k
attends to the text, clean windows < k and itself (what a denoise step of window k computes against
the committed KV). Positions are the absolute ones of `layout.py`, so training and rollout agree.
Loss: flow matching on the noisy frames, velocity = noise - clean, one noise level per window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from worldstep.engine.models.cosmos3.layout import (
    action_positions,
    media_offset,
    vision_positions,
)
from worldstep.engine.models.cosmos3.runner import (  # the rollout's prefill maths
    apply_rotary,
    rotary,
    text_kv,
)
from worldstep.engine.models.cosmos3.tokens import patchify, unpatchify


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
        return (end - start) * self.tokens_per_frame + self.chunk

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


def timestep_embed(transformer, timesteps: torch.Tensor) -> torch.Tensor:
    """`[M]` timesteps (0..1000) -> `[M, hidden]`, with the model's `timestep_scale`."""
    t = timesteps * transformer.config.timestep_scale
    return transformer.time_embedder(transformer.time_proj(t).to(transformer.proj_in.weight.dtype))


def gen_layers(transformer, hidden: torch.Tensor, text_k: torch.Tensor, text_v: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Generation layers over `[B, N, hidden]` tokens; gen queries see `[text | gen]` under `mask` `[N, N]`.

    Same maths as `runner.gen_forward` with the paged attention replaced by a dense masked one.
    """
    batch, n, _ = hidden.shape
    text_len = text_k[0].shape[0]
    full_mask = torch.cat([torch.ones(n, text_len, dtype=torch.bool), mask], dim=1)  # [N, L+N]
    for index, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        x = layer.input_layernorm_moe_gen(hidden)
        q = attn.norm_added_q(attn.add_q_proj(x).view(batch, n, attn.num_attention_heads, attn.head_dim))
        k = attn.norm_added_k(attn.add_k_proj(x).view(batch, n, attn.num_key_value_heads, attn.head_dim))
        v = attn.add_v_proj(x).view(batch, n, attn.num_key_value_heads, attn.head_dim)  # [B, N, Hkv, D]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        tk = text_k[index].unsqueeze(0).expand(batch, -1, -1, -1)  # [B, L, Hkv, D]
        tv = text_v[index].unsqueeze(0).expand(batch, -1, -1, -1)
        keys, values = torch.cat([tk, k], dim=1), torch.cat([tv, v], dim=1)  # [B, L+N, Hkv, D]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=full_mask, enable_gqa=True
        )  # [B, H, N, D]
        hidden = hidden + attn.to_add_out(out.transpose(1, 2).flatten(-2))
        hidden = hidden + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(hidden))
    return transformer.norm_moe_gen(hidden)


@dataclass
class DynamicsBatch:
    """Clean latents `[B, C, T, h, w]` (normalised), actions `[B, W*chunk, action_dim]`, per-window
    noise levels `sigmas` `[B, W]` in [0, 1] and `noise` shaped like the latents."""

    latents: torch.Tensor
    actions: torch.Tensor
    sigmas: torch.Tensor
    noise: torch.Tensor


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

    def velocity(self, batch: DynamicsBatch, context_noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(predicted, target) velocities of every noisy frame, each `[B, C, W*n, h, w]`."""
        tr, lay = self.transformer, self.layout
        patch = tr.config.latent_patch_size
        z, sig = batch.latents, batch.sigmas
        bsz = z.shape[0]
        text_k, text_v = text_kv(tr, self.text_ids)
        cos, sin = rotary(tr, self.positions, tr.proj_in.weight.dtype)  # [N, D]
        domains = torch.full((bsz * batch.actions.shape[1],), self.domain_id, dtype=torch.long)
        act = tr.action_proj_in(batch.actions.flatten(0, 1), domains).view(bsz, -1, tr.config.hidden_size)
        act = act + tr.action_modality_embed  # [B, W*chunk, hidden]
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
            else:
                noisy = frames if context_noise is None else frames + context_noise[:, :, start:end]
            vis = torch.stack([patchify(noisy[b], patch) for b in range(bsz)])  # [B, f*hw, p*p*C]
            vis = tr.proj_in(vis)  # [B, f*hw, hidden]
            per_frame = vis.shape[1] // (end - start)
            if kind == "noisy":
                temb = timestep_embed(tr, sig[:, k] * 1000.0)  # [B, hidden]
                add = torch.zeros_like(vis)
                add[:, clean_lead * per_frame:] = temb[:, None]
                vis = vis + add
                noisy_slices.append((pos + clean_lead * per_frame, pos + vis.shape[1], end - start - clean_lead))
            tokens += [vis, act[:, k * lay.chunk:(k + 1) * lay.chunk]]
            pos += vis.shape[1] + lay.chunk
        hidden = gen_layers(tr, torch.cat(tokens, dim=1), text_k, text_v, cos, sin, self.mask)
        preds = []
        h, w = self.latent_hw
        channels = z.shape[1]
        for s0, s1, nf in noisy_slices:
            out = tr.proj_out(hidden[:, s0:s1])  # [B, nf*hw, p*p*C]
            preds.append(torch.stack([unpatchify(out[b], nf, h, w, channels, patch) for b in range(bsz)]))
        return torch.cat(preds, dim=2), torch.cat(targets, dim=2)

    def loss(self, batch: DynamicsBatch, context_noise: torch.Tensor | None = None) -> torch.Tensor:
        pred, target = self.velocity(batch, context_noise)
        return F.mse_loss(pred.float(), target.float())


def sample_sigmas(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Noise levels: half uniform, half logit-normal (more mass mid-range), clipped to [0.001, 0.999]."""
    uniform = torch.rand(shape, generator=generator)
    logit = torch.sigmoid(torch.randn(shape, generator=generator))
    pick = torch.rand(shape, generator=generator) < 0.5
    return torch.where(pick, uniform, logit).clamp(0.001, 0.999)
