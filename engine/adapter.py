"""The model adapter: everything the loop (`loop.RolloutLoop`) calls of a model, in one place.

The loop owns what outlives a call and is shared by every session: the KV page pool (allocated from the adapter's
`KVLayout`), the scheduler, the warm decoder around the adapter's VAE, the attention backend, the flashinfer plans
and the CUDA graphs (`LoopParts`). The adapter owns the maths: a prompt's token ids and their K/V, frame 0's
latent, and a scheduled group's denoise and commit. It allocates no cache (the style guide's adapter rule;
tests/test_engine_loop.py fails on a module under ``engine/models/`` that constructs one): the loop's parts
arrive as arguments, bound once at load by `ModelAdapter.bind`.

A step reads as the loop's three calls, schedule (`scheduler.Scheduler`), run (`runner.StepRunner`, which calls
`WindowOps.denoise` then `WindowOps.commit` per group) and postprocess (the loop, the one place a cursor moves).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from .attention import AttentionBackendName
from .config import RolloutKnobs
from .embodiment.conditioning import Conditioning
from .embodiment.embodiments import EmbodimentRegistry
from .flashinfer_kernels import FlashinferKernels
from .graphs import GraphCache
from .kv import PagedKVCache, StreamLabel
from .scheduler import ScheduledWindow
from .session import RolloutSession
from .spec import ModelSpec, SessionFrame


@dataclass(frozen=True)
class KVLayout:
    """The shape of the K/V one token leaves in every layer: what the loop sizes the page pool by."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize


@dataclass(frozen=True)
class LoopParts:
    """What the loop allocated and resolved once at load, handed to the adapter (`ModelAdapter.bind`)."""

    cache: PagedKVCache
    backend: AttentionBackendName
    device: torch.device
    kernels: FlashinferKernels | None = None  # the loop's, when its backend is flashinfer
    graphs: GraphCache | None = None  # the loop's captured denoise steps and commits, with `cuda_graphs`


class DenoisedGroup(Protocol):
    """A group's windows after their denoise, before their commit."""

    @property
    def latents(self) -> list[torch.Tensor]:
        """Per window its new latents ``[C, n, h, w]`` float32, on the device."""


class WindowOps(Protocol):
    """The adapter bound to the loop's parts: what the runner calls once per scheduled group."""

    device: torch.device
    graphs: GraphCache | None

    def denoise(self, group: Sequence[ScheduledWindow[RolloutSession]]) -> DenoisedGroup:
        """Denoise the group's windows as one batched window, queued on the device (no wait for it); raise
        `session.SessionClosedError` when a session of the group was closed meanwhile, before any commit."""

    def commit(self, window: DenoisedGroup) -> None:
        """Append each row's window K/V to its streams (and release beyond the horizon), or nothing."""


class ModelAdapter(Protocol):
    """A model as the loop drives it: its spec, its embodiments, its KV layout and VAE, and the verbs below."""

    spec: ModelSpec
    embodiments: EmbodimentRegistry
    kv_layout: KVLayout
    vae: nn.Module

    def plan_frame(self, image: np.ndarray, tier: int | str | None) -> SessionFrame:
        """Where a session's frames come from (a ValueError for a tier the image cannot take)."""

    def prompt_ids(self, prompt: str, knobs: RolloutKnobs, conditioning: Conditioning,
                   frame: SessionFrame) -> dict[StreamLabel, list[int]]:
        """The token ids of each of a session's KV streams (``main``, and ``uncond`` under CFG)."""

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V ``[layers, L, Hkv, D]`` of ``[L]`` prompt token ids, what generation attends to."""

    def encode_first_frame(self, image: np.ndarray, frame: SessionFrame) -> torch.Tensor:
        """Frame 0's clean latent ``[C, 1, h, w]`` float32 (``image`` already checked where it entered)."""

    def bind(self, parts: LoopParts) -> WindowOps:
        """The per-group verbs over the loop's parts; called once, at load."""
