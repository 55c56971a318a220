"""The model sizes the bench runs: `tiny` (the embedded default), `small` (a CPU stand-in for Edge),
`edge` (Cosmos3-Edge, GPU only) and `pusher` (the shipped trained 64x64 model, its own weights).

`small` keeps Edge's shape rules (relu2 MLP, GQA 2:1, head_dim 64, patch 2, Wan 2.2 VAE with a
wider decoder than encoder) and, more importantly, Edge's *proportions*: VAE-decode FLOPs per
latent frame over generation FLOPs per latent frame per denoise step is ~18 here vs ~26 for Edge
at 480p, so a CPU ratio between "decode-bound" and "transformer-bound" alternatives means
something. Random-weight checkpoints are built once with the engine's own builder into
`$WORLDSTEP_CACHE/models/` and loaded back through the real loader.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

# The bench drives the droid embodiment in every alternative: diffusers' domain 8 with 10-wide actions.
DOMAIN_ID = 8
DOMAIN_NAME = "droid_lerobot"
ACTION_WIDTH = 10
PROMPT = "A robot arm pushes a block across a table."

_SMALL_TRANSFORMER = {
    "hidden_size": 384,
    "intermediate_size": 1536,
    "head_dim": 64,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "num_hidden_layers": 6,
    "latent_channel": 16,
    "patch_latent_dim": 64,  # p*p*C
    "vocab_size": 512,
    "rope_axes_dim": [12, 10, 10],  # sums to head_dim / 2, Edge's 24:20:20 split
    "action_dim": 32,
}
_SMALL_VAE = {"base_dim": 16, "decoder_base_dim": 24, "z_dim": 16, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1}


@dataclass(frozen=True)
class BenchArch:
    """An architecture block (as in configs/*.yaml), the decoder options its config ships, and the rollout shape
    the bench uses with it."""

    name: str
    architecture: dict[str, Any] = field(repr=False)
    decoder: dict[str, Any] = field(repr=False)
    chunk_size: int  # actions per window (env step)
    height: int
    width: int
    page_size: int = 16
    domain_id: int = DOMAIN_ID
    action_width: int = ACTION_WIDTH
    checkpoint: str | None = None  # trained weights to load instead of a random-weight build

    @property
    def latents_per_window(self) -> int:
        return self.chunk_size // 4


def _config(name: str) -> dict[str, Any]:
    return yaml.safe_load(files("worldstep.configs").joinpath(f"{name}.yaml").read_text())


def bench_arch(name: str) -> BenchArch:
    """`tiny` (128x128, 4 actions/window), `small` (256x256, 8), `edge` (480x832, 16) or `pusher` (64x64, 4)."""
    if name in ("tiny", "small"):
        config = _config("tiny")
        arch, decoder = config["model"]["architecture"], config["decoder"]
        if name == "tiny":
            return BenchArch("tiny", arch, decoder, chunk_size=4, height=arch["height"], width=arch["width"])
        arch = copy.deepcopy(arch)
        arch["transformer"].update(_SMALL_TRANSFORMER)
        arch["vae"].update(_SMALL_VAE)
        arch.update(height=256, width=256)
        return BenchArch("small", arch, decoder, chunk_size=8, height=256, width=256)
    if name == "edge":
        config = _config("cosmos3_edge")
        arch = config["model"]["architecture"]
        return BenchArch("edge", arch, config["decoder"], chunk_size=16, height=arch["height"], width=arch["width"],
                         page_size=128)
    if name == "pusher":
        config = _config("pusher")
        arch = config["model"]["architecture"]
        shipped = str(files("worldstep.configs").joinpath("models", "pusher"))
        return BenchArch("pusher", arch, config["decoder"], chunk_size=4, height=arch["height"], width=arch["width"],
                         page_size=4, domain_id=0, action_width=2, checkpoint=shipped)
    raise ValueError(f"arch={name!r} is invalid; allowed: 'tiny', 'small', 'edge', 'pusher'")


def checkpoint_for(arch: BenchArch, cache_dir: str | Path | None = None) -> Path:
    """The random-weight checkpoint folder of `arch`, built on first use (a few seconds for small), or the
    trained weights it names."""
    from worldstep.engine.models.cosmos3.checkpoint import ensure_embedded_checkpoint

    if arch.checkpoint is not None:
        return Path(arch.checkpoint)
    return ensure_embedded_checkpoint(f"bench-{arch.name}", arch.architecture, cache_dir=cache_dir)


def load_model(arch: BenchArch, *, height: int | None = None, width: int | None = None, num_pages: int = 512,
               cache_dir: str | Path | None = None, decoder: dict[str, Any] | None = None):
    """A `Cosmos3WorldModel` of `arch` from its checkpoint (frames `height`x`width`, default the arch's), decoding
    as its shipped config does (`small`: as `tiny`), with the `DecoderOptions` fields in ``decoder`` changed."""
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
    from worldstep.engine.vae import DecoderOptions

    return Cosmos3WorldModel.from_pretrained(
        checkpoint_for(arch, cache_dir), device="cpu", num_pages=num_pages, page_size=arch.page_size,
        height=height or arch.height, width=width or arch.width, name=f"bench-{arch.name}",
        decoder=DecoderOptions(**{**arch.decoder, **(decoder or {})}),
    )


def open_session(model, arch: BenchArch, knobs, seed: int = 0, image=None):
    """A session of `model` on the bench's prompt and embodiment, first frame `image` (default `first_frame`)."""
    import torch

    image = first_frame(model.spec.height, model.spec.width) if image is None else image
    return model.open_session(image, PROMPT, arch.domain_id, knobs=knobs, action_width=arch.action_width,
                              generator=torch.Generator().manual_seed(seed))


def rollout_knobs(arch: BenchArch, num_steps: int, context_frames: int, **kwargs):
    """`RolloutKnobs` of the bench: the arch's window, `num_steps` denoise steps, a bounded context."""
    from worldstep.engine.config import RolloutKnobs

    return RolloutKnobs(chunk_size=arch.chunk_size, num_steps=num_steps, context_frames=context_frames, **kwargs)


def first_frame(height: int, width: int, seed: int = 0):
    """A deterministic uint8 `[H, W, 3]` first frame (smooth gradients plus noise, like a camera image)."""
    import numpy as np

    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width, y / height, 0.5 + 0.5 * np.sin((x + y) / 17.0)], axis=-1) * 200
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def action_chunks(count: int, arch: BenchArch, seed: int = 1) -> list:
    """`count` smooth action chunks `(arch.chunk_size, arch.action_width)` in [-1, 1], the same for every
    alternative."""
    import numpy as np

    chunk_size, width = arch.chunk_size, arch.action_width
    rng = np.random.RandomState(seed)
    t = np.arange(count * chunk_size, dtype=np.float32)[:, None]
    phase = rng.uniform(0, 2 * np.pi, (1, width)).astype(np.float32)
    actions = np.sin(t / 7.0 + phase) * 0.8 + rng.normal(0, 0.05, (len(t), width)).astype(np.float32)
    actions = np.clip(actions, -1, 1).astype(np.float32)
    return [actions[i * chunk_size:(i + 1) * chunk_size] for i in range(count)]
