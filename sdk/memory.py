"""Memory of a config: the weights, and the KV plan (bytes per token, pages, the pages one episode holds at
its peak)."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from worldstep.engine.config import TEMPORAL_COMPRESSION, RolloutKnobs
from worldstep.engine.spec import window_tokens

from .config import WorldstepConfig

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class MemoryPlan:
    """The paged KV cache of one model and what one episode of ``windows`` windows needs from it.

    ``peak_pages_per_episode`` replays the cache's own arithmetic (text prefix protected, each window's
    commit appended, pages past ``context_frames`` latent frames released page-floored), per CFG stream.
    """

    kv_bytes_per_token: int
    page_size: int
    num_pages: int
    text_tokens: int
    text_tokens_measured: bool
    streams: int
    tokens_per_frame: int
    tokens_per_window: int
    context_frames: int
    windows: int
    peak_pages_per_episode: int

    @property
    def page_bytes(self) -> int:
        return self.kv_bytes_per_token * self.page_size

    @property
    def pool_bytes(self) -> int:
        return self.page_bytes * self.num_pages

    @property
    def episodes_per_pool(self) -> int:
        """Concurrent episodes the pool holds at their peak."""
        return self.num_pages // max(1, self.peak_pages_per_episode)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "page_bytes": self.page_bytes, "pool_bytes": self.pool_bytes,
                "episodes_per_pool": self.episodes_per_pool}


def peak_pages(text_tokens: int, tokens_per_frame: int, knobs: RolloutKnobs, windows: int, page_size: int,
               action_tokens_per_frame: int = TEMPORAL_COMPRESSION) -> int:
    """Peak pages of one KV stream over ``windows`` windows: the engine's own `StreamTable` and the session's
    `WindowSchedule`, driven without tensors, so the plan follows the commit and page-floored release rules
    exactly."""
    from worldstep.engine.kv.stream import StreamKey, StreamLabel
    from worldstep.engine.kv.table import StreamTable
    from worldstep.engine.session import window_schedule

    schedule = window_schedule(knobs)
    per_window = [window_tokens(p.units, tokens_per_frame, knobs.chunk_size)
                  for p in itertools.islice(schedule.windows(), windows)]
    table = StreamTable(num_pages=2 + _ceil(text_tokens + sum(per_window), page_size), page_size=page_size)
    key = StreamKey("plan", StreamLabel.MAIN)
    table.create_stream(key)
    table.append(key, text_tokens)
    table.protect_prefix(key, text_tokens)
    peak = table.num_used_pages
    policy = schedule.retention(tokens_per_frame + action_tokens_per_frame, text_tokens)
    for tokens in per_window if knobs.window_mode == "kv" else ():  # chained windows commit nothing
        table.append(key, tokens)
        peak = max(peak, table.num_used_pages)
        table.apply_retention(key, policy)
    return peak


def plan(config: WorldstepConfig, *, windows: int, text_tokens: int, kv_bytes_per_token: int | None = None,
         tokens_per_frame: int | None = None, text_tokens_measured: bool = False) -> MemoryPlan:
    """The plan from a config alone (the ``model.architecture`` block), or with a loaded model's facts."""
    arch = config.model.architecture
    if kv_bytes_per_token is None or tokens_per_frame is None:
        if arch is None:
            raise ValueError(f"model.architecture of {config.model.name!r} is needed for a memory plan without "
                             "loading the model (it has no transformer/vae block)")
        t, v = arch.transformer, arch.vae
        itemsize = _ITEMSIZE[config.model.dtype or "float32"]  # None loads float32
        kv_bytes_per_token = t["num_hidden_layers"] * 2 * t["num_key_value_heads"] * t["head_dim"] * itemsize
        spatial, patch = v["scale_factor_spatial"], t["latent_patch_size"]
        height = config.model.height or arch.height
        width = config.model.width or arch.width
        tokens_per_frame = _ceil(height // spatial, patch) * _ceil(width // spatial, patch)
    rollout = config.rollout
    streams = 2 if rollout.uses_cfg else 1
    per_stream = peak_pages(text_tokens, tokens_per_frame, rollout, windows, config.cache.page_size)
    return MemoryPlan(
        kv_bytes_per_token=kv_bytes_per_token, page_size=config.cache.page_size,
        num_pages=config.cache.num_pages, text_tokens=text_tokens, text_tokens_measured=text_tokens_measured,
        streams=streams, tokens_per_frame=tokens_per_frame,
        tokens_per_window=rollout.latents_per_window * (tokens_per_frame + TEMPORAL_COMPRESSION),
        context_frames=rollout.context_frames, windows=windows, peak_pages_per_episode=streams * per_stream,
    )


def plan_for_world(world, *, windows: int) -> MemoryPlan:
    """The plan of a loaded model, with the prompt's token count measured by opening (and closing) a session."""
    import numpy as np

    spec, env = world.model.spec, world.config.env
    image = np.zeros((spec.height, spec.width, 3), np.uint8)
    domain_id = 0 if env.domain_id is None and env.embodiment is None else env.domain_id
    with world.model.session(image, env.prompt, domain_id, embodiment=env.embodiment, knobs=world.knobs,
                             tier=env.resolution_tier) as session:
        text_tokens = world.model.kv_stats(session).protected_tokens
        tokens_per_frame = session.spec.tokens_per_frame  # the session's grid (its canvas's content, if any)
    return plan(world.config, windows=windows, text_tokens=text_tokens, text_tokens_measured=True,
                kv_bytes_per_token=world.model.kv_bytes_per_token, tokens_per_frame=tokens_per_frame)


@dataclass(frozen=True)
class WeightsMemory:
    """Bytes of a model's weights (parameters and buffers) per component; ``measured`` is False for an
    estimate from the config's ``model.architecture`` (modules built on the meta device, nothing allocated)."""

    transformer_bytes: int
    vae_bytes: int
    dtype: str
    measured: bool

    @property
    def total_bytes(self) -> int:
        return self.transformer_bytes + self.vae_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def _module_bytes(module, itemsize: int | None = None) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * (itemsize or t.element_size()) for t in tensors)


def weights_of_world(world) -> WeightsMemory:
    """The loaded model's weights, measured."""
    model = world.model
    dtype = str(model.dtype).removeprefix("torch.")
    return WeightsMemory(_module_bytes(model.transformer), _module_bytes(model.vae), dtype, measured=True)


def weights_from_architecture(config: WorldstepConfig) -> WeightsMemory | None:
    """The weights ``model.architecture`` describes, in the config's dtype (None without an architecture)."""
    arch = config.model.architecture  # a Cosmos3Architecture: both blocks are required fields
    if arch is None:
        return None
    import torch
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    dtype = config.model.dtype or "float32"
    with torch.device("meta"):
        transformer = Cosmos3OmniTransformer(**arch.transformer)
        vae = AutoencoderKLWan(**arch.vae)
    itemsize = _ITEMSIZE[dtype]
    return WeightsMemory(_module_bytes(transformer, itemsize), _module_bytes(vae, itemsize), dtype, measured=False)
