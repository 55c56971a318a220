"""Speed switches that leave the shared VAE as it was: a private copy of a VAE module (channels-last, the CPU
fast path, the device fast path of `engine/vae/fused.py`) and a scoped `cudnn.benchmark`.

The CPU fast path (`onednn_conv`) changes three things in the copy, for CPU float32 inputs without autograd:
- every 3-D conv calls oneDNN directly (torch sends the small per-latent convs of a streaming decode to its
  reference kernel, an unfold + GEMM, 3-10x slower at these shapes);
- a causal conv pads space inside the oneDNN call instead of copying its input into a zero-padded tensor
  (`F.pad` allocates, fills and copies the whole activation before every conv);
- the RMS norm computes `x * rsqrt(sum(x^2))` in one pass over channels instead of `F.normalize`'s strided
  `linalg_vector_norm` and four more passes (divide, scale, gamma, bias): a third of a tiny window's decode.
Sums run in another order than the reference kernels, so the frames differ from `vae.decode`'s within
float32 rounding (docs/exactness.md); any other input takes the module's own path.
"""

from __future__ import annotations

import contextlib
import copy
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock, WanCausalConv3d, WanRMS_norm
from torch import nn

from .fused import fuse_norms, pad_inside_conv, torch_conv


def decoder_copy(module: nn.Module, *, channels_last: bool = False, onednn_conv: bool = False, fused: bool = False,
                 dtype: torch.dtype | None = None) -> nn.Module:
    """The module to run: `module` itself, or a deep copy when a switch is on, so the shared module (used by
    `vae.decode`, other users) keeps its layout, dtype and kernels.

    `module` is any part of a Wan VAE (its decoder, `post_quant_conv`, or the whole VAE). `channels_last`:
    3-D conv weights in `channels_last_3d`, 2-D ones in `channels_last` (cache slots the copy writes are clones
    of dense channels-last slices, so they stay compact). `onednn_conv`: the CPU fast path of the module
    docstring. `fused`: the device fast path (`engine/vae/fused.py`: padding inside every causal conv, each RMS
    norm with its SiLU one compiled kernel; with `onednn_conv` the convs go through oneDNN). `dtype`: the
    copy's weights in that dtype (`DecoderOptions.dtype`). A copy costs a second set of weights.
    """
    convert = dtype is not None and dtype != next(module.parameters()).dtype
    if not (channels_last or onednn_conv or fused or convert):
        return module
    dup = copy.deepcopy(module).to(dtype) if convert else copy.deepcopy(module)
    fast = onednn_conv and torch.backends.mkldnn.is_available()
    if fused:
        fuse_norms(dup, channels_last)
    for m in dup.modules():
        if isinstance(m, nn.Conv3d):
            if channels_last:
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
            if fast:  # instance attributes, bound to the copy (a deepcopy of the copy rebinds them)
                m._conv_forward = types.MethodType(_onednn_conv_forward, m)
            if isinstance(m, WanCausalConv3d) and fused:
                pad_inside_conv(m, _onednn_or_torch_conv if fast else torch_conv, channels_last)
            elif isinstance(m, WanCausalConv3d) and fast:
                m.forward = types.MethodType(_causal_conv_forward, m)
        elif isinstance(m, nn.Conv2d):
            if channels_last:
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
            if fast:  # the attention's 1x1 and the upsamplers' 3x3 convs: torch's CPU kernel drops channels-last
                m._conv_forward = types.MethodType(_onednn_conv_forward, m)
        elif isinstance(m, WanRMS_norm) and onednn_conv:
            m.forward = types.MethodType(_rms_norm_forward, m)
        elif isinstance(m, WanAttentionBlock) and channels_last:
            m.register_forward_hook(_channels_last_output)
    return dup


def _channels_last_output(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    """The mid block's attention output in `channels_last_3d`: its reshapes around one-head attention leave the
    layout to stride heuristics that a one-frame batch of one defeats (a copy at the lowest resolution only, and
    none when the layout held)."""
    return out.contiguous(memory_format=torch.channels_last_3d)


def _fast(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Inputs the fast path takes: CPU float32, no autograd graph to record."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_grad_enabled())


def _onednn_conv_forward(self: nn.Conv3d | nn.Conv2d, x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None) -> torch.Tensor:
    """`_conv_forward` of a 3-D or 2-D conv through oneDNN for explicit zero padding; anything else the module's
    own way."""
    if _fast(x, weight) and self.padding_mode == "zeros" and not isinstance(self.padding, str):
        return torch.ops.aten.mkldnn_convolution(x, weight, bias, list(self.padding), list(self.stride),
                                                 list(self.dilation), self.groups)
    return (nn.Conv3d if isinstance(self, nn.Conv3d) else nn.Conv2d)._conv_forward(self, x, weight, bias)


def _onednn_or_torch_conv(conv: nn.Conv3d, x: torch.Tensor, padding: list[int]) -> torch.Tensor:
    """The fused path's conv on a CPU with `onednn_conv`: oneDNN where the CPU fast path takes the input."""
    if _fast(x, conv.weight):
        return torch.ops.aten.mkldnn_convolution(x, conv.weight, conv.bias, padding, list(conv.stride),
                                                 list(conv.dilation), conv.groups)
    return torch_conv(conv, x, padding)


def _causal_conv_forward(self: WanCausalConv3d, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
    """`WanCausalConv3d.forward` with the spatial zero padding done by oneDNN.

    Args:
        x: `[B, C, t, H, W]` this call's frames; `cache_x`: `[B, C, k, H, W]` the frames before them.
    """
    if not _fast(x, self.weight):
        return WanCausalConv3d.forward(self, x, cache_x)
    pad_w, _, pad_h, _, pad_t, _ = self._padding  # (w, w, h, h, 2 * t, 0): causal in time, symmetric in space
    if cache_x is not None and pad_t > 0:
        x = torch.cat([cache_x.to(x.device), x], dim=2)  # [B,C,k+t,H,W]
        pad_t -= cache_x.shape[2]
    if pad_t > 0:
        x = F.pad(x, (0, 0, 0, 0, pad_t, 0))  # zero frames ahead of a session's first call only
    return torch.ops.aten.mkldnn_convolution(x, self.weight, self.bias, [0, pad_h, pad_w], list(self.stride),
                                             list(self.dilation), self.groups)


def _rms_norm_forward(self: WanRMS_norm, x: torch.Tensor) -> torch.Tensor:
    """`WanRMS_norm.forward` (`F.normalize` over channels, times `scale * gamma`, plus bias) in one reduction.

    `F.normalize` divides by `max(||x||, 1e-12)`: the same as multiplying by `rsqrt(max(sum(x^2), 1e-24))`.
    """
    if not (self.channel_first and _fast(x, self.gamma)):
        return WanRMS_norm.forward(self, x)
    inv = x.pow(2).sum(1, keepdim=True).clamp_min_(1e-24).rsqrt_().mul_(self.scale)  # [B,1,...]
    out = (x * inv).mul_(self.gamma)  # [B,C,...]
    return out if isinstance(self.bias, float) and self.bias == 0.0 else out.add_(self.bias)


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
