"""One session's window in a decode call, and the runs that decode it.

`WindowDecoder.run` gives one session its own decoder calls: a kernel's rounding may depend on the batch size
(oneDNN does at some shapes), so only then are a session's frames independent of which other sessions share a
step. `WindowDecoder.run_stacked` decodes the windows of several sessions in one set of calls, their caches
stacked along the batch and split again afterwards (`DecoderOptions.batch_sessions`): one call per group
instead of one per session, at a bounded rounding cost (docs/exactness.md). Only jobs with the same
`stack_key` (latent grid, window length, context, cache layout) may share a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from .cache import Slot, empty_cache, slot_signature, split_slots, stack_slots
from .causal import call_sizes, run_decoder
from .frames import frames_u8, pixels_from_decoder
from .session import DecodeSession

Output = Literal["frames", "pixels", "device"]

# `batch_sessions` (sessions stacked into one set of calls) vs each session's own calls, in [-1, 1] pixels: the same
# convs at another batch size, which kernels may round differently. Measured max 4.0e-6 on the test VAEs over
# seeds, grids, window patterns, oneDNN convs on and off and the CPU kernel selections; frames at most 1 uint8
# level apart on at most 1e-3 of values (measured 3.5e-4). docs/exactness.md.
BATCHED_DECODE_ATOL = 1e-5


@dataclass(eq=False)
class WindowJob:
    """One session's window in a decode call.

    Attributes:
        z: `[1, C, t, h, w]` the window's raw (de-normalised) latents, in the prelude's dtype (the wider of the
            VAE's and the decoder's).
        context: `[1, C, k, h, w]` retained decoder inputs re-decoded ahead of the window (cold
            runs of sessions past latent 0), else None.
        cold: run from an empty cache (first window, stateless session, or a dropped cache).
        out_dtype: dtype the pixels take before the uint8 mapping (the latents' dtype, as the
            pipeline's `decoded.to(in_dtype)`).
        x_new: `[1, C, t, h, w]` the window's `post_quant_conv` output, set by the run.
        slots: the session's cache after the run (warm sessions keep it at commit).
    """

    session: DecodeSession
    z: torch.Tensor
    context: torch.Tensor | None
    cold: bool
    out_dtype: torch.dtype
    output: Output
    parts: list[torch.Tensor] = field(default_factory=list)  # per call, on the device
    num_frames: int = 0
    x_new: torch.Tensor | None = None
    slots: list[Slot] | None = None

    @property
    def stack_key(self) -> tuple:
        """Jobs with equal keys can run as one batch: same window and context shapes (so the same latent grid),
        both cold or both warm, and caches of the same layout (which slots hold what, at which shapes)."""
        context = None if self.context is None else tuple(self.context.shape)
        cache = None if self.cold else slot_signature(self.session.slots)
        return tuple(self.z.shape), self.z.dtype, context, self.cold, cache

    @property
    def skip_calls(self) -> int:
        """Leading one-latent calls whose frames belong to the context, not the window."""
        return 0 if self.context is None else self.context.shape[2]

    def keep(self, pixels: torch.Tensor) -> None:
        """Keep one call's output on the device (one host copy per window, in `result`).

        Args: pixels `[1, 3, T_call, H, W]` in [-1, 1].
        """
        pixels = pixels.to(self.out_dtype)
        self.num_frames += pixels.shape[2]
        self.parts.append(pixels if self.output == "pixels" else frames_u8(pixels))

    def result(self) -> np.ndarray | torch.Tensor:
        """The window: pixels `[1, 3, T, H, W]` on the CPU, uint8 frames `[T, H, W, 3]` as numpy, or (``device``)
        uint8 frames left on the device for the caller to fetch."""
        if self.output == "pixels":
            return torch.cat(self.parts, dim=2).cpu()  # [1,3,T,H,W]
        frames = torch.cat(self.parts, dim=0)  # [T,H,W,3]
        return frames if self.output == "device" else frames.cpu().numpy()


@dataclass(frozen=True)
class WindowDecoder:
    """Decodes one session's window through the Wan decoder, call by call."""

    decoder: nn.Module
    post_quant_conv: nn.Module
    num_slots: int
    latents_per_call: int
    channels_last: bool
    patch_size: int | None
    dtype: torch.dtype | None = None  # the decoder's, when its input must be cast (a prelude in a wider dtype)

    def run(self, job: WindowJob) -> None:
        """Decode the job's window; a warm cache is advanced in place (the caller drops it if this raises)."""
        # One latent per post_quant_conv call: the same call shapes whatever the window pattern, so a
        # session's frames do not depend on how its latents were cut into windows.
        x_new = torch.cat([self.post_quant_conv(job.z[:, :, i : i + 1]) for i in range(job.z.shape[2])], dim=2)
        job.x_new = x_new  # [1,C,t,h,w]
        x = x_new if job.context is None else torch.cat([job.context, x_new], dim=2)  # [1,C,k+t,h,w]
        slots = empty_cache(self.num_slots) if job.cold else job.session.slots
        sizes = call_sizes(x.shape[2], self.latents_per_call, job.cold)
        calls = run_decoder(self.decoder, x, slots, sizes, from_first_latent=job.cold, channels_last=self.channels_last,
                            dtype=self.dtype)
        for i, out in enumerate(calls):
            if i >= job.skip_calls:  # earlier calls re-decode the context: their frames are dropped
                job.keep(pixels_from_decoder(out, self.patch_size))  # [1,3,T_call,H,W]
        job.slots = slots

    def run_stacked(self, jobs: list[WindowJob]) -> None:
        """Decode the windows of ``jobs`` (one `stack_key`) in one set of calls, every session's cache stacked
        along the batch, then split back per job; a warm cache is only replaced once the whole run succeeded."""
        if len({job.stack_key for job in jobs}) != 1:
            raise ValueError("jobs with different stack keys (grid, window, context or cache layout) cannot share "
                             "a decoder call")
        first = jobs[0]
        z = torch.cat([job.z for job in jobs])  # [B,C,t,h,w]
        x_new = torch.cat([self.post_quant_conv(z[:, :, i : i + 1]) for i in range(z.shape[2])], dim=2)  # [B,C,t,h,w]
        x = x_new if first.context is None else torch.cat([torch.cat([j.context for j in jobs]), x_new], dim=2)
        slots = empty_cache(self.num_slots) if first.cold else stack_slots([job.session.slots for job in jobs])
        sizes = call_sizes(x.shape[2], self.latents_per_call, first.cold)
        calls = run_decoder(self.decoder, x, slots, sizes, from_first_latent=first.cold,
                            channels_last=self.channels_last, dtype=self.dtype)
        for i, out in enumerate(calls):
            if i >= first.skip_calls:
                pixels = pixels_from_decoder(out, self.patch_size)  # [B,3,T_call,H,W]
                for b, job in enumerate(jobs):
                    job.keep(pixels[b : b + 1])
        for b, (job, own) in enumerate(zip(jobs, split_slots(slots, len(jobs)))):
            job.x_new, job.slots = x_new[b : b + 1], own  # views: the commit compacts them


def stacked_batches(jobs: list[WindowJob]) -> list[list[WindowJob]]:
    """The jobs that share decoder calls under `batch_sessions`: those of one `stack_key` together, so two latent
    grids, window lengths or cache layouts never share a call (a batch of one runs `WindowDecoder.run`)."""
    by_key: dict[tuple, list[WindowJob]] = {}
    for job in jobs:
        by_key.setdefault(job.stack_key, []).append(job)
    return list(by_key.values())
