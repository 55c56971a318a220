"""One decode session of a `WarmWanDecoder`: one video's own cache, context and counters (a rollout session
holds one)."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from .cache import Slot, cache_nbytes


class DecodePath(str, Enum):
    """How a session decodes, chosen at its first window and kept for its whole life."""

    WARM = "warm"  # keeps its causal-conv cache: decodes only new latents, exact
    STATELESS = "stateless"  # re-decodes its retained context from an empty cache every window


@dataclass(eq=False)
class DecodeSession:
    """State of one video being decoded: a record the decoder opens, mutates and closes (`WarmWanDecoder.open_session`,
    `decode`, `close_session`); it holds no reference to the decoder.

    The cache lives here, never on the shared VAE module, so sessions are independent of each other
    and of `vae.decode`/`encode` calls.

    Attributes:
        session_id: unique within the process (the decoder's own count, not a rollout session's id).
        owner: the id of the decoder that opened it (a session is decoded by its own decoder only).
        path: `None` until the first window is decoded, then `DecodePath.WARM` or `STATELESS`.
        latents_decoded: latent frames committed so far (a failed window does not count).
        frames_decoded: frames returned so far.
        grid: latent `(h, w)`, fixed by the first window.
        closed: no further decode; cache, context and warm slot are released.
    """

    session_id: int
    owner: int
    path: DecodePath | None = None
    latents_decoded: int = 0
    frames_decoded: int = 0
    grid: tuple[int, int] | None = None
    closed: bool = False
    # The decoder's causal-conv cache (None: none held, the next window runs cold behind `context`).
    slots: list[Slot] | None = field(default=None, repr=False)
    # [1, C, k, h, w] decoder inputs (post_quant_conv output) of the last k <= context_latents latents.
    context: torch.Tensor | None = field(default=None, repr=False)
    # Gives the warm slot back (once): called by close, or by the collector for a dropped session.
    slot_release: weakref.finalize | None = field(default=None, repr=False)
    # The CUDA event after the last decode wrote `slots`/`context` (on whichever CUDA stream ran it); None on a CPU.
    written: Any = field(default=None, repr=False)
    # Held while a decode, fork or close works on this session.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def cache_bytes(self) -> int:
        return cache_nbytes(self.slots)

    @property
    def context_bytes(self) -> int:
        return 0 if self.context is None else self.context.nbytes

    @property
    def retained_latents(self) -> int:
        return 0 if self.context is None else self.context.shape[2]
