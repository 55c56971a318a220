"""Speed switches that leave the shared VAE as it was: a decoder copy (channels-last, oneDNN convs) and a
scoped `cudnn.benchmark`."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn


def decoder_copy(decoder: nn.Module, *, channels_last: bool = False, onednn_conv: bool = False,
                 dtype: torch.dtype | None = None) -> nn.Module:
    """The module the warm decoder runs: `decoder` itself, or a deep copy when a switch is on, so the
    shared module (used by `vae.decode`, other users) keeps its layout and kernels.

    `channels_last`: 3-D conv weights in `channels_last_3d`, 2-D ones in `channels_last` (cache slots the
    copy writes are clones of dense channels-last slices, so they stay compact). `onednn_conv`: every
    3-D conv of the copy calls oneDNN directly on CPU float32 inputs (see `DecoderOptions.onednn_conv`).
    `dtype`: the copy's weights in that dtype (`DecoderOptions.dtype`). A copy costs a second set of decoder
    weights.
    """
    convert = dtype is not None and dtype != next(decoder.parameters()).dtype
    if not (channels_last or onednn_conv or convert):
        return decoder
    dup = copy.deepcopy(decoder).to(dtype) if convert else copy.deepcopy(decoder)
    for m in dup.modules():
        if isinstance(m, nn.Conv3d):
            if channels_last:
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
            if onednn_conv and torch.backends.mkldnn.is_available():
                m._conv_forward = _onednn_conv3d(m)  # instance attribute: only this copy changes
        elif isinstance(m, nn.Conv2d) and channels_last:
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
    return dup


def _onednn_conv3d(conv: nn.Conv3d):
    """`conv._conv_forward` that calls oneDNN for CPU float32 inputs with explicit (tuple) padding; any
    other input takes the module's own path."""
    direct = conv.padding_mode == "zeros" and not isinstance(conv.padding, str)

    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if direct and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32:
            return torch.ops.aten.mkldnn_convolution(x, weight, bias, list(conv.padding), list(conv.stride),
                                                     list(conv.dilation), conv.groups)
        return nn.Conv3d._conv_forward(conv, x, weight, bias)

    return forward


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
