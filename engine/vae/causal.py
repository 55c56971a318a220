"""Run the Wan decoder over a run of latents against one cache, call by call.

This is the loop of `AutoencoderKLWan._decode` with the cache passed in instead of kept on the
shared module (`vae._feat_map`, which any `vae.decode`/`encode` clears).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .cache import Slot


def call_sizes(num_latents: int, latents_per_call: int, starts_cold: bool) -> list[int]:
    """Latents per decoder call for one run.

    A run that starts from an empty cache goes one latent per call: latent 0 must be alone with
    `first_chunk=True`, and a re-decode behind the context would otherwise put the whole context in
    one call (an unbounded transient peak). Steady runs group `latents_per_call` (0 = all).
    """
    if starts_cold or latents_per_call == 1:
        return [1] * num_latents
    step = num_latents if latents_per_call == 0 else latents_per_call
    return [min(step, num_latents - i) for i in range(0, num_latents, step)]


def run_decoder(
    decoder: nn.Module,
    x: torch.Tensor,
    slots: list[Slot],
    sizes: list[int],
    *,
    from_first_latent: bool,
    channels_last: bool = False,
    dtype: torch.dtype | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the raw decoder output of each call; `slots` is updated in place as diffusers does.

    Args:
        decoder: `vae.decoder` (or its channels-last copy).
        x: `[B, C, t, h, w]` `post_quant_conv` output; `sum(sizes) == t`.
        slots: the cache of all `B` sessions (stacked along the batch); empty when `from_first_latent`.
        sizes: latents per call (see `call_sizes`).
        from_first_latent: the run starts at latent 0 of its sessions (`first_chunk` for the first call).
        channels_last: hand each call its input in `channels_last_3d`; dtype: cast it to the decoder's dtype.
    Yields:
        `[B, C_out, T_call, h', w']` per call: 1 frame for latent 0, 4 per later latent.
    """
    start = 0
    for n in sizes:
        chunk = x[:, :, start : start + n]  # [B,C,n,h,w]
        if dtype is not None:
            chunk = chunk.to(dtype)
        if channels_last:
            chunk = chunk.contiguous(memory_format=torch.channels_last_3d)
        # feat_idx has a shared mutable default in diffusers: always pass a fresh [0].
        yield decoder(chunk, feat_cache=slots, feat_idx=[0], first_chunk=from_first_latent and start == 0)
        start += n
