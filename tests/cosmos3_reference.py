"""A dense, page-free reference of the kv-mode rollout, for parity tests.

It keeps each stream's committed K/V as plain tensors, slices the context explicitly, and applies
the page-floored eviction with its own arithmetic. It shares only the model's token embedding and
text prefill with worldstep (both checked against diffusers elsewhere); attention, caching and
eviction are written here independently.
"""

from __future__ import annotations

import numpy as np
import torch
from worldstep.engine.models.cosmos3.layers import apply_rotary, prefill_text, rotary
from worldstep.engine.models.cosmos3.layout import action_positions, media_offset, vision_positions
from worldstep.engine.models.cosmos3.tokens import action_tokens, embed_timesteps, unpatchify, vision_tokens


class DenseStream:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor, page_size: int):
        self.k = [keys[i] for i in range(keys.shape[0])]  # per layer [S, Hkv, D]
        self.v = [values[i] for i in range(values.shape[0])]
        self.prefix = keys.shape[1]
        self.page_size = page_size
        self.released = 0

    def append(self, keys, values):
        self.k = [torch.cat([a, b]) for a, b in zip(self.k, keys)]
        self.v = [torch.cat([a, b]) for a, b in zip(self.v, values)]

    def evict(self, context_tokens: int):
        """Free whole pages behind the page that holds the end of the prefix; never the tail page."""
        held = self.k[0].shape[0]
        want = held - self.prefix - context_tokens
        if want <= 0:
            return
        ps = self.page_size
        first_free_page = -(-self.prefix // ps)  # first page wholly after the protected prefix
        full_pages = held // ps  # the partial tail page is never freed
        pages = min(want // ps, max(0, full_pages - first_free_page))
        if pages <= 0:
            return
        start, end = first_free_page * ps, (first_free_page + pages) * ps
        self.k = [torch.cat([k[:start], k[end:]]) for k in self.k]
        self.v = [torch.cat([v[:start], v[end:]]) for v in self.v]
        self.released += end - start


def gen_layers(transformer, hidden, cos, sin, stream: DenseStream, collect=False):
    keys, values = [], []
    for index, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        x = layer.input_layernorm_moe_gen(hidden)
        q = attn.norm_added_q(attn.add_q_proj(x).view(-1, attn.num_attention_heads, attn.head_dim))
        k = attn.norm_added_k(attn.add_k_proj(x).view(-1, attn.num_key_value_heads, attn.head_dim))
        v = attn.add_v_proj(x).view(-1, attn.num_key_value_heads, attn.head_dim)
        q, k = apply_rotary(cos, sin, q, k)
        keys.append(k)
        values.append(v)
        all_k = torch.cat([stream.k[index], k])
        all_v = torch.cat([stream.v[index], v])
        groups = attn.num_attention_heads // attn.num_key_value_heads
        qh = q.transpose(0, 1)  # [H, N, D]
        kh = all_k.transpose(0, 1).repeat_interleave(groups, dim=0)  # [H, S, D]
        vh = all_v.transpose(0, 1).repeat_interleave(groups, dim=0)
        weights = torch.softmax(qh @ kh.transpose(1, 2) / attn.head_dim**0.5, dim=-1)
        out = (weights @ vh).transpose(0, 1)  # [N, H, D]
        hidden = hidden + attn.to_add_out(out.flatten(-2))
        hidden = hidden + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(hidden))
    hidden = transformer.norm_moe_gen(hidden)
    return hidden, (torch.stack(keys), torch.stack(values)) if collect else None


@torch.no_grad()
def dense_kv_rollout(model, session_ids: list[int], first_latent, actions_list, domain_id, *, num_steps,
                     context_frames, generator, flow_shift=5.0):
    """Roll out kv-mode windows without pages (no CFG). Returns the list of new latents per window."""
    transformer, spec = model.transformer, model.spec
    stream = DenseStream(*prefill_text(transformer, torch.tensor(session_ids)), model.kv.page_size)
    text_len = len(session_ids)
    offset = media_offset(text_len, transformer.config.unified_3d_mrope_temporal_modality_margin)
    grid_h, grid_w = model.spec.patch_grid
    n = actions_list[0].shape[0] // 4
    chunk = actions_list[0].shape[0]
    outputs = []
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler.from_config(model.components.unipc_config, flow_shift=flow_shift)
    for w, actions in enumerate(actions_list):
        start, end, clean = (0, 1 + n, 1) if w == 0 else (1 + w * n, 1 + (w + 1) * n, 0)
        shape = (1, spec.latent_channels, end - start, spec.latent_height, spec.latent_width)
        latents = torch.randn(shape, generator=generator, dtype=torch.float32)[0]
        if clean:
            latents[:, :1] = first_latent
        padded = np.zeros((chunk, spec.action_dim), np.float32)
        padded[:, : actions.shape[1]] = actions
        act_tokens = action_tokens(transformer, torch.from_numpy(padded), domain_id)
        pos = torch.cat([
            vision_positions(start, end, grid_h, grid_w, offset=offset, fps=spec.fps,
                             base_fps=float(transformer.config.base_fps)),
            action_positions(w * chunk, (w + 1) * chunk, offset=offset, fps=spec.fps,
                             base_fps=float(transformer.config.base_fps), temporal_compression=4),
        ], dim=1)
        cos, sin = rotary(transformer, pos, torch.float32)
        sigmas = np.linspace(1.0 - 1.0 / 1000, 0.0, num_steps + 1)[:-1]
        scheduler.set_timesteps(num_steps, sigmas=sigmas)
        tpf = spec.tokens_per_frame
        for t in scheduler.timesteps:
            temb = embed_timesteps(transformer, torch.full((1,), t.item()))
            hidden = torch.cat([vision_tokens(transformer, latents, clean, temb), act_tokens])
            out, _ = gen_layers(transformer, hidden, cos, sin, stream)
            frames = latents.shape[1]
            noisy = unpatchify(transformer.proj_out(out[clean * tpf: frames * tpf]), frames - clean,
                               spec.latent_height, spec.latent_width, spec.latent_channels,
                               transformer.config.latent_patch_size)
            velocity = torch.zeros_like(latents)
            velocity[:, clean:] = noisy
            latents = scheduler.step(velocity.unsqueeze(0), t, latents.unsqueeze(0), return_dict=False)[0][0]
        if clean:
            latents[:, :1] = first_latent
        hidden = torch.cat([vision_tokens(transformer, latents, latents.shape[1], None), act_tokens])
        _, (keys, values) = gen_layers(transformer, hidden, cos, sin, stream, collect=True)
        stream.append(keys, values)
        if context_frames:
            stream.evict(context_frames * (tpf + 4))
        outputs.append(latents[:, clean:].clone())
    return outputs, stream
