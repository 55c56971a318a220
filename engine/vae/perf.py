"""Speed switches that leave the shared VAE as it was: a channels-last decoder copy and a scoped
`cudnn.benchmark`."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn


def channels_last_copy(decoder: nn.Module) -> nn.Module:
    """A deep copy of `decoder` with 3-D conv weights in `channels_last_3d` and 2-D ones in
    `channels_last`; the shared module (used by `vae.decode`, other users) keeps its layout.

    Costs a second copy of the decoder weights. Cache slots the copy writes are clones of dense
    channels-last slices, so they stay compact.
    """
    dup = copy.deepcopy(decoder)
    for m in dup.modules():
        if isinstance(m, nn.Conv3d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
        elif isinstance(m, nn.Conv2d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
    return dup


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool) -> Iterator[None]:
    """Set `torch.backends.cudnn.benchmark = True` for the body only when `enabled`; restore the
    previous value afterwards, also when the body raises. Disabled: the flag is not touched."""
    if not enabled:
        yield
        return
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous
