"""The pusher model training writes: its architectures, prompt, embodiment, and the checkpoint export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from worldstep.envs.push_sim import PUSHER_EMBODIMENT

from ..trust.signals import HORIZON_KEY
from .vae import VAE_ARCH

TRANSFORMER_ARCH: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "head_dim": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "latent_channel": 16,
    "latent_patch_size": 1,
    "patch_latent_dim": 16,
    "vocab_size": 256,
    "rope_axes_dim": [8, 4, 4],
    "hidden_act": "relu2",
    "qk_norm_for_text": False,
    "use_und_k_norm_for_gen": True,
    "action_gen": True,
    "action_dim": 8,
    "num_embodiment_domains": 4,
    "base_fps": 24,
    "dtype": "float32",
}
PROMPT = "A robot pushes a block to the goal."
DOMAIN_ID = PUSHER_EMBODIMENT["domain_id"]
FPS = PUSHER_EMBODIMENT["fps"]
SIZE = 64
# The embodiment a trained folder registers in its worldstep.json; its domains are its own, so the Cosmos3
# built-in names do not apply to it.
EMBODIMENT = PUSHER_EMBODIMENT


def architectures(small: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(transformer, vae) constructor kwargs; `small` shrinks both for smoke tests."""
    t, v = dict(TRANSFORMER_ARCH), dict(VAE_ARCH)
    if small:
        t.update(hidden_size=32, intermediate_size=64, head_dim=16, num_hidden_layers=1, latent_channel=4,
                 patch_latent_dim=4, rope_axes_dim=[4, 2, 2])
        v.update(base_dim=4, decoder_base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1])
    return t, v


def text_ids(tokenizer, chunk: int) -> torch.Tensor:
    """The prompt ids a worldstep session prefills for this model (same caption, same template)."""
    from worldstep.engine.models.cosmos3.prompt import tokenize_action_prompt

    tokens = tokenize_action_prompt(tokenizer, PROMPT, "", view_point="ego_view", num_frames=chunk + 1, fps=FPS,
                                    height=SIZE, width=SIZE)
    return torch.tensor(tokens.cond, dtype=torch.long)


def make_transformer(arch: dict[str, Any], seed: int):
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(seed)
    return Cosmos3OmniTransformer(**arch)


def export_checkpoint(path: Path, transformer, vae, tokenizer, *, trained_horizon: int) -> Path:
    """Write the diffusers layout `Cosmos3WorldModel.from_pretrained` reads, plus `worldstep.json`, which records
    `trained_horizon` (the windows the training clips cover: the `horizon` trust signal, `worldstep.trust`)."""
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
    from worldstep.engine.models.cosmos3.checkpoint import SCHEDULER_CONFIG

    pipeline = Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=tokenizer, vae=vae,
        scheduler=UniPCMultistepScheduler(**SCHEDULER_CONFIG), enable_safety_checker=False,
        default_use_system_prompt=False, use_native_flow_schedule=True,
    )
    pipeline.save_pretrained(path, safe_serialization=True)
    (path / "worldstep.json").write_text(json.dumps({"height": SIZE, "width": SIZE, "fps": FPS,
                                                     "prompt": PROMPT, "domain_id": DOMAIN_ID,
                                                     HORIZON_KEY: int(trained_horizon), "config": "pusher",
                                                     "builtin_embodiments": False,
                                                     "embodiments": [EMBODIMENT]}, indent=2))  # run settings
    return path
