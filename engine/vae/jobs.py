"""One decode call's work: a job per stream, grouped into batched runs of the Wan decoder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from .cache import Slot, empty_cache, signature, split_cache, stack_caches
from .causal import call_sizes, run_decoder
from .frames import frames_from_pixels, pixels_from_decoder
from .stream import DecodeStream

Output = Literal["frames", "pixels"]


@dataclass(eq=False)
class WindowJob:
    """One stream's window in a decode call.

    Attributes:
        z: `[1, C, t, h, w]` the window's raw (de-normalised) latents, in the VAE's dtype.
        context: `[1, C, k, h, w]` retained decoder inputs re-decoded ahead of the window (cold
            runs of streams past latent 0), else None.
        cold: run from an empty cache (first window, stateless stream, or a dropped cache).
        out_dtype: dtype the pixels take before the uint8 mapping (the latents' dtype, as the
            pipeline's `decoded.to(in_dtype)`).
        x_new: `[1, C, t, h, w]` the window's `post_quant_conv` output, set by the run.
        slots: the stream's cache after the run (warm streams keep it at commit).
    """

    stream: DecodeStream
    z: torch.Tensor
    context: torch.Tensor | None
    cold: bool
    out_dtype: torch.dtype
    output: Output
    parts: list[np.ndarray | torch.Tensor] = field(default_factory=list)  # per call, on the CPU
    num_frames: int = 0
    x_new: torch.Tensor | None = None
    slots: list[Slot] | None = None

    @property
    def skip_calls(self) -> int:
        """Leading one-latent calls whose frames belong to the context, not the window."""
        return 0 if self.context is None else self.context.shape[2]

    def group_key(self) -> tuple:
        # first_chunk applies to a whole call, and stacked caches must agree slot by slot.
        if self.cold:
            return ("cold", self.z.shape[2], self.skip_calls)
        return ("warm", self.z.shape[2], signature(self.stream.slots))

    def keep(self, pixels: torch.Tensor) -> None:
        """Store one call's output on the CPU. Args: pixels `[1, 3, T_call, H, W]` in [-1, 1]."""
        pixels = pixels.to(self.out_dtype)
        self.num_frames += pixels.shape[2]
        self.parts.append(pixels.cpu() if self.output == "pixels" else frames_from_pixels(pixels))

    def result(self) -> np.ndarray | torch.Tensor:
        if self.output == "pixels":
            return torch.cat(self.parts, dim=2)  # [1,3,T,H,W]
        return np.concatenate(self.parts, axis=0)  # [T,H,W,3]


@dataclass(frozen=True)
class GroupRunner:
    """Runs a group of same-phase jobs through one sequence of batched decoder calls."""

    decoder: nn.Module
    post_quant_conv: nn.Module
    num_slots: int
    latents_per_call: int
    channels_last: bool
    patch_size: int | None

    def run(self, group: list[WindowJob]) -> None:
        """Decode the group's windows; a warm single-stream cache is advanced in place.

        A group of several warm streams runs on a stacked copy of their caches and drops the
        streams' own lists first, so the caches are not held twice while it runs.
        """
        first = group[0]
        # post_quant_conv on the stacked batch, as vae.decode of the stacked streams would.
        x_new = self.post_quant_conv(torch.cat([j.z for j in group]))  # [B,C,t,h,w]
        for b, j in enumerate(group):
            j.x_new = x_new[b : b + 1]
        x = x_new
        if first.context is not None:
            x = torch.cat([torch.cat([j.context for j in group]), x_new], dim=2)  # [B,C,k+t,h,w]
        slots = self._input_cache(group)
        sizes = call_sizes(x.shape[2], self.latents_per_call, first.cold)
        calls = run_decoder(self.decoder, x, slots, sizes, stream_start=first.cold, channels_last=self.channels_last)
        for i, out in enumerate(calls):
            if i < first.skip_calls:
                continue  # frames of the re-decoded context
            pixels = pixels_from_decoder(out, self.patch_size)  # [B,3,T_call,H,W]
            for b, j in enumerate(group):
                j.keep(pixels[b : b + 1])
        caches = split_cache(slots, [1] * len(group)) if len(group) > 1 else [slots]
        for j, cache in zip(group, caches):
            j.slots = cache

    def _input_cache(self, group: list[WindowJob]) -> list[Slot]:
        if group[0].cold:
            return empty_cache(self.num_slots)
        if len(group) == 1:
            return group[0].stream.slots  # advanced in place; dropped by the caller if the run raises
        stacked = stack_caches([j.stream.slots for j in group])
        for j in group:
            j.stream.slots = None
        return stacked
