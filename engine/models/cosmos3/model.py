"""Cosmos3 as the engine loop drives it: `Cosmos3Adapter` (the loop's `adapter.ModelAdapter`: prompt ids, prefill,
frame 0, and a window's denoise and commit over the diffusers modules) and `Cosmos3WorldModel`, the loop over it
built from a checkpoint and the engine's config sections."""

from __future__ import annotations

import os

import numpy as np
import torch

from ...adapter import KVLayout, LoopParts
from ...config import CacheConfig, RolloutKnobs, RuntimeConfig, sections
from ...devices import resolve_device
from ...embodiment.conditioning import Conditioning
from ...embodiment.embodiments import folder_registry
from ...kv import StreamLabel
from ...loop import RolloutLoop
from ...spec import SessionFrame
from ...vae import DecoderOptions
from .first_frame import encode_session_frame, plan_session_frame
from .layers import prefill_text
from .loader import Cosmos3Components, load_components, model_spec
from .prompt import session_prompt_ids
from .window import WindowContext


class Cosmos3Adapter:
    """The loaded diffusers modules as the loop calls them (`adapter.ModelAdapter`). No I/O and no cache: the
    loop's parts arrive in `bind`."""

    def __init__(self, components: Cosmos3Components, runtime: RuntimeConfig) -> None:
        self.components = components
        self.transformer, self.vae = components.transformer, components.vae
        self.dtype = next(self.transformer.parameters()).dtype
        self.spec = model_spec(components, height=runtime.height, width=runtime.width, fps=runtime.fps,
                               name=runtime.name)
        self.embodiments = folder_registry(components.path, self.spec.num_domains)
        config = self.transformer.config
        self.kv_layout = KVLayout(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, self.dtype)

    def plan_frame(self, image: np.ndarray, tier: int | str | None) -> SessionFrame:
        return plan_session_frame(self.spec, self.transformer.config.latent_patch_size, image, tier)

    def prompt_ids(self, prompt: str, knobs: RolloutKnobs, conditioning: Conditioning,
                   frame: SessionFrame) -> dict[StreamLabel, list[int]]:
        return session_prompt_ids(self.components.tokenizer, prompt, knobs, view_point=conditioning.view_point,
                                  fps=conditioning.fps, size=frame.caption_size,
                                  use_system_prompt=self.components.default_use_system_prompt)

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return prefill_text(self.transformer, ids)

    def encode_first_frame(self, image: np.ndarray, frame: SessionFrame) -> torch.Tensor:
        return encode_session_frame(self.vae, image, frame)

    def bind(self, parts: LoopParts) -> WindowContext:
        return WindowContext(self.transformer, parts.cache, parts.backend, self.spec, self.components.unipc_config,
                             self.components.use_native_flow_schedule, parts.device, self.dtype, parts.kernels,
                             parts.graphs)


class Cosmos3WorldModel(RolloutLoop):
    """The engine loop over Cosmos3 (`loop.RolloutLoop`): `open_session`, `step`, `fork`, `close`."""

    def __init__(self, components: Cosmos3Components, *, device: str | torch.device, cache: CacheConfig | None = None,
                 decoder: DecoderOptions | None = None, runtime: RuntimeConfig | None = None, **settings) -> None:
        """The config sections the loop takes (``cache``, ``decoder``, ``runtime``; defaults: their models'), with
        ``settings`` (any field of the cache or runtime section by name, e.g. ``num_pages=64, height=32``) over
        them; an unknown name is a TypeError listing the allowed ones."""
        cache, runtime = sections(cache, runtime, settings)
        self.components = components
        super().__init__(Cosmos3Adapter(components, runtime), device=device, cache=cache, decoder=decoder,
                         runtime=runtime)

    @classmethod
    def from_pretrained(cls, path_or_id: str | os.PathLike, *, device: str | torch.device = "auto",
                        dtype: torch.dtype | None = None, **kwargs) -> Cosmos3WorldModel:
        """Load a diffusers-layout checkpoint (local folder or offline hub id); ``kwargs`` as the constructor's.
        ``device``: ``auto`` (CUDA when there is one) or a device, resolved here, once."""
        device = resolve_device(device)
        return cls(load_components(path_or_id, device=device, dtype=dtype), device=device, **kwargs)

    @property
    def transformer(self) -> torch.nn.Module:
        return self.components.transformer

    @property
    def vae(self) -> torch.nn.Module:
        return self.components.vae
