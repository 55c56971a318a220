"""The frames of a latent-observation episode, decoded only when someone looks (``observation="latents"``).

A latent episode's engine session decodes nothing (its knobs say ``decode=False``), so a step costs the denoise and
the commit alone. ``LatentFrames`` keeps the windows' latents that no one has looked at yet, and its own session of
the model's warm decoder. ``frames()`` catches the decoder up over those windows, oldest first, so the causal cache
sees the same latents in the same order and with the same call shapes as a frames episode's decoder: the frames are
the ones the frames env shows (bit-equal where the decode path is the same, docs/observations.md).
"""

from __future__ import annotations

import numpy as np
import torch
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.session import DecodeSession


class LatentFrames:
    """Windows' latents waiting for a decode, and the decoder session that decodes them in order.

    Args:
        decoder: the model's ``WarmWanDecoder`` (shared by every session of the model).
        first_latent: ``[C, 1, h, w]`` float32, the clean latent frame 0 (decoded first: it warms the cache).
    """

    def __init__(self, decoder: WarmWanDecoder, first_latent: torch.Tensor) -> None:
        self.decoder = decoder
        self.session: DecodeSession = decoder.open_session()
        self.pending: list[torch.Tensor] = [first_latent[None]]  # [1, C, t, h, w] each, oldest first
        self.last: np.ndarray | None = None  # the latest decoded window's frames, [T, H, W, 3] uint8

    def add(self, latents: torch.Tensor) -> None:
        """Queue one window's ``[C, t, h, w]`` latents (no decoder call)."""
        self.pending.append(latents[None])

    def frames(self) -> np.ndarray:
        """The latest window's frames ``[T, H, W, 3]`` uint8 (frame 0 alone before any step), after decoding every
        window not yet decoded, oldest first. A failed decode leaves the windows after it queued."""
        while self.pending:
            self.last = self.decoder.decode(self.session, self.pending[0])
            self.pending.pop(0)
        return self.last

    def fork(self) -> LatentFrames:
        """An independent copy at the same point (the decoder session forked, the queue copied)."""
        fork = object.__new__(LatentFrames)
        fork.decoder, fork.session = self.decoder, self.decoder.fork_session(self.session)
        fork.pending, fork.last = list(self.pending), self.last
        return fork

    def close(self) -> None:
        """The decoder session's cache and warm slot go back; the queue is dropped. Safe to call twice."""
        self.pending = []
        self.decoder.close_session(self.session)
