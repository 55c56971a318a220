"""The device fast path's pieces (`DecoderOptions.fused`): fewer bytes moved and fewer kernels per decoder call.

- A causal conv pads space inside the convolution (cuDNN and oneDNN take the padding as an argument) instead of
  `F.pad` copying its whole input into a zero-bordered tensor before every conv; only a session's first call
  still prepends zero frames in time.
- An RMS norm and the SiLU after it are one `torch.compile`d function: statistics in float32, one read and one
  write of the activation (on CUDA one Triton kernel; diffusers' `WanRMS_norm` + SiLU is about eight passes,
  four of them in float32 for a bf16 input). The SiLU moves into the norm by replacing the block's
  `nonlinearity` with an identity: in `WanResidualBlock` and `WanDecoder3d` it runs only right after a norm.

The function is compiled with dynamic shapes, sizes 1 included, so the channel counts, grids, frame counts and
batch sizes of a decode share graphs: at most `MAX_NORM_GRAPHS` per decoder (tested). Past dynamo's own limit
it would fall back to eager, still correct.
Sums run in another order than `F.normalize`, so frames equal `vae.decode`'s in the same dtype within
`FUSED_DECODE_ATOL` (docs/exactness.md).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import (
    WanCausalConv3d,
    WanDecoder3d,
    WanResidualBlock,
    WanRMS_norm,
)
from torch import nn

# Graphs the fused norm compiles over the decodes of one decoder (every layer, window, batch size): sizes are
# symbolic, sizes 1 included, but the input's stride pattern is guarded (standard, channels-last, a one-frame
# slice's): measured 3 on both test VAE families, batched and not, windows of 1-3 latents
# (tests/test_vae_fused.py asserts this ceiling).
MAX_NORM_GRAPHS = 4


def _rms_norm_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool,
                  channels_last: bool) -> torch.Tensor:
    """`x / ||x||_C * weight (+ bias)`, then SiLU when `silu`; in float32, returned in `x.dtype`, written
    channels-last when `channels_last` (else in the layout torch infers from `x`'s strides, which is ambiguous
    for a batch of one frame).

    Args:
        x: `[B, C, ...]` channels first, any layout (the output keeps it).
        weight: `[C]` float32, `sqrt(C) * gamma` (`WanRMS_norm`'s scale folded in).
        bias: `[C]` float32, or None.
    `F.normalize` divides by `max(||x||, 1e-12)`: the same as multiplying by `rsqrt(max(sum(x^2), 1e-24))`.
    """
    xf = x.float()
    shape = (-1,) + (1,) * (x.ndim - 2)  # literal ones: [C] -> [C, 1, ...]
    y = xf * xf.square().sum(1, keepdim=True).clamp_min(1e-24).rsqrt() * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    if silu:
        y = F.silu(y)
    y = y.to(x.dtype)
    if channels_last:
        y = y.contiguous(memory_format=torch.channels_last_3d if y.ndim == 5 else torch.channels_last)
    return y


_compiled = None


def rms_norm_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool,
                 channels_last: bool) -> torch.Tensor:
    """`_rms_norm_act`, compiled (once per process, on first use) for the 5-D norm + SiLU of the residual blocks
    and the head; the attention's 4-D norm (one per call, at the lowest resolution) runs eagerly.

    Sizes 0 and 1 are traced like any other (`backed_size_oblivious`) and equal sizes are not tied together
    (`use_duck_shape=False`), so batch 1 and one frame share the graph of larger ones; what still recompiles is
    the input's stride pattern (a one-frame slice's strides are ambiguous). Past dynamo's recompile limit a call
    falls back to eager (not `fullgraph`): slower, never wrong.
    """
    global _compiled
    if x.ndim != 5 or not silu:
        return _rms_norm_act(x, weight, bias, silu, channels_last)
    if _compiled is None:
        _compiled = torch.compile(_rms_norm_act, dynamic=True)
    with torch.fx.experimental._config.patch(backed_size_oblivious=True, use_duck_shape=False):
        return _compiled(x, weight, bias, True, channels_last)


def reset_compiled() -> None:
    """Forget the compiled function (tests count the graphs of one decode from a fresh start)."""
    global _compiled
    _compiled = None
    torch._dynamo.reset()


class FusedRMSNorm(nn.Module):
    """A `WanRMS_norm`'s weights in float32, applied (with the SiLU after it when `silu`) by `rms_norm_act`.

    Args of `forward`: x `[B, C, T, H, W]` (or `[N, C, H, W]` for the attention's norm).
    """

    def __init__(self, norm: WanRMS_norm, silu: bool, channels_last: bool) -> None:
        super().__init__()
        if not norm.channel_first:
            raise ValueError("FusedRMSNorm takes channel-first norms only (the Wan decoder's)")
        self.silu, self.channels_last = silu, channels_last
        self.register_buffer("weight", (norm.gamma.detach().float() * norm.scale).flatten().clone())  # [C]
        bias = norm.bias.detach().float().flatten().clone() if isinstance(norm.bias, torch.Tensor) else None
        if bias is None and norm.bias != 0.0:
            raise ValueError(f"FusedRMSNorm: a constant bias of {norm.bias} is not a Wan norm")
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_act(x, self.weight, self.bias, self.silu, self.channels_last)


def fuse_norms(decoder: nn.Module, channels_last: bool) -> None:
    """Replace every `WanRMS_norm` of `decoder` (a private copy) by a `FusedRMSNorm`; where a block's SiLU runs
    only right after its norms (`WanResidualBlock`, `WanDecoder3d`), the SiLU moves into them. `channels_last`:
    the norms write their outputs channels-last."""
    for block in list(decoder.modules()):
        silu = isinstance(block, (WanResidualBlock, WanDecoder3d)) and isinstance(block.nonlinearity, nn.SiLU)
        for name, child in list(block.named_children()):
            if isinstance(child, WanRMS_norm):
                setattr(block, name, FusedRMSNorm(child, silu, channels_last))
        if silu:
            block.nonlinearity = nn.Identity()


def pad_inside_conv(conv: WanCausalConv3d, conv_fn, channels_last: bool) -> None:
    """Make `conv` (of a private copy) pad space inside `conv_fn(conv, x, padding)`; `channels_last`: the frames
    it stacks in time (cache + input, or zeros + input) are written straight into a channels-last tensor."""
    conv.forward = types.MethodType(_causal_conv_forward, conv)
    conv._padded_conv = conv_fn
    conv._memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format


def _causal_conv_forward(self: WanCausalConv3d, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
    """`WanCausalConv3d.forward` with the spatial zero padding done by the convolution.

    Args:
        x: `[B, C, t, H, W]` this call's frames; `cache_x`: `[B, C, k, H, W]` the frames before them.
    """
    pad_w, _, pad_h, _, pad_t, _ = self._padding  # (w, w, h, h, 2 * t, 0): causal in time, symmetric in space
    ahead = None
    if cache_x is not None and pad_t > 0:
        ahead = cache_x.to(x.device)
        pad_t -= cache_x.shape[2]
    if pad_t > 0 or ahead is not None:
        x = _stack_in_time(ahead, max(pad_t, 0), x, self._memory_format)
    return self._padded_conv(self, x, [0, pad_h, pad_w])


def _stack_in_time(ahead: torch.Tensor | None, zeros: int, x: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """`[zeros frames | ahead | x]` along time, written once into a tensor of layout `fmt`.

    `torch.cat` infers its output's layout from its inputs, and a cached slice of one frame (whose strides
    are ambiguous) makes it fall back to the standard layout: the conv would then copy it back.
    Args: ahead `[B, C, k, H, W]` or None; x `[B, C, t, H, W]`.
    """
    k = 0 if ahead is None else ahead.shape[2]
    out = torch.empty((x.shape[0], x.shape[1], zeros + k + x.shape[2], *x.shape[3:]), dtype=x.dtype,
                      device=x.device, memory_format=fmt)  # [B,C,zeros+k+t,H,W]
    if zeros:
        out[:, :, :zeros].zero_()
    if k:
        out[:, :, zeros : zeros + k].copy_(ahead)
    out[:, :, zeros + k :].copy_(x)
    return out


def torch_conv(conv: nn.Conv3d, x: torch.Tensor, padding: list[int]) -> torch.Tensor:
    """The conv through `F.conv3d` (cuDNN on CUDA) with explicit zero padding."""
    return F.conv3d(x, conv.weight, conv.bias, conv.stride, padding, conv.dilation, conv.groups)
