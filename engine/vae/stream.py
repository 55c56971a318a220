"""One live video stream of a `WarmWanDecoder`: its own cache, context and counters."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import torch

from .cache import Slot, cache_nbytes

if TYPE_CHECKING:
    from .decoder import WarmWanDecoder


class StreamPath(str, Enum):
    """How a stream decodes, chosen at its first window and kept for its whole life."""

    WARM = "warm"  # keeps its causal-conv cache: decodes only new latents, exact
    STATELESS = "stateless"  # re-decodes its retained context from an empty cache every window


@dataclass(eq=False)
class DecodeStream:
    """State of one stream. Open with `WarmWanDecoder.open_stream`; the decoder mutates it.

    The cache lives here, never on the shared VAE module, so streams are independent of each other
    and of `vae.decode`/`encode` calls. Use as a context manager to close it on any exit.

    Attributes:
        stream_id: unique within the process.
        path: `None` until the first window is decoded, then `StreamPath.WARM` or `STATELESS`.
        latents_decoded: latent frames committed so far (a failed window does not count).
        frames_decoded: frames returned so far.
        grid: latent `(h, w)`, fixed by the first window.
        closed: no further decode; cache, context and warm slot are released.
    """

    stream_id: int
    decoder: WarmWanDecoder = field(repr=False)
    path: StreamPath | None = None
    latents_decoded: int = 0
    frames_decoded: int = 0
    grid: tuple[int, int] | None = None
    closed: bool = False
    # The decoder's causal-conv cache (None: none held, the next window runs cold behind `context`).
    slots: list[Slot] | None = field(default=None, repr=False)
    # [1, C, k, h, w] decoder inputs (post_quant_conv output) of the last k <= context_latents latents.
    context: torch.Tensor | None = field(default=None, repr=False)
    # Gives the warm slot back (once): called by close, or by the collector for a dropped stream.
    slot_release: weakref.finalize | None = field(default=None, repr=False)
    # Held while a decode, fork or close works on this stream.
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

    def close(self) -> None:
        self.decoder.close_stream(self)

    def __enter__(self) -> DecodeStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
