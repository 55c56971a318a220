"""`decoder.channels_last`: every 3-D conv of the decoder gets its input in `channels_last_3d`, so no conv pays a
layout copy (a `cat` or `F.pad` with an input of another layout silently falls back to the standard one).

Checked on the CPU with oneDNN convs, which keep channels-last as cuDNN's do (torch's reference CPU kernels do not),
by a forward pre-hook on every Conv3d (the frames the module is handed) and at the convolution itself (what it
runs on, after the causal cache is stacked in front in time). The checker is shown to catch an injected drop.
"""

from __future__ import annotations

import types

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanResidualBlock
from torch import nn
from vae_models import FAMILIES, decode_windows, random_latents
from worldstep.engine.vae import DecoderOptions
from worldstep.engine.vae.decoder import WarmWanDecoder

CL = torch.channels_last_3d


class LayoutProbe:
    """Records every Conv3d of `decoder` whose input is not channels-last-3d: the module's arguments (forward
    pre-hook) and the tensor its convolution runs on (the fused path's `_padded_conv`, else `_conv_forward`)."""

    def __init__(self, decoder: nn.Module) -> None:
        self.names = {m: n for n, m in decoder.named_modules()}
        self.calls = 0
        self.dropped: set[str] = set()
        for m in decoder.modules():
            if isinstance(m, nn.Conv3d):
                m.register_forward_pre_hook(self._pre_hook)
                self._wrap_conv(m)

    def _check(self, module: nn.Module, t: torch.Tensor | None, where: str) -> None:
        if isinstance(t, torch.Tensor) and not t.is_contiguous(memory_format=CL):
            self.dropped.add(f"{self.names[module]} ({where})")

    def _pre_hook(self, module: nn.Module, args: tuple) -> None:
        """The frames a conv is handed. Its cache slot (`args[1]`) is stacked in front of them into a fresh
        tensor before the conv, and that tensor is checked at the conv; a one-frame slot's layout is ambiguous."""
        self.calls += 1
        self._check(module, args[0], "input")

    def _wrap_conv(self, m: nn.Conv3d) -> None:
        if "_padded_conv" in vars(m):
            inner = m._padded_conv

            def padded(conv, x, padding, inner=inner):
                self._check(conv, x, "conv")
                return inner(conv, x, padding)

            m._padded_conv = padded
        else:
            inner = m._conv_forward  # bound: the module's own or the oneDNN one

            def conv_forward(conv, x, weight, bias, inner=inner):
                self._check(conv, x, "conv")
                return inner(x, weight, bias)

            m._conv_forward = types.MethodType(conv_forward, m)


def _decode(family: str, fused: bool, batch: bool = False, inject=None) -> LayoutProbe:
    build, grid = FAMILIES[family]
    dec = WarmWanDecoder(build(seed=2), DecoderOptions(channels_last=True, onednn_conv=True, fused=fused,
                                                       batch_sessions=batch))
    if inject is not None:
        inject(dec._decoder)
    probe = LayoutProbe(dec._decoder)
    z = random_latents(6, grid, seed=3, batch=2)
    sessions = [dec.open_session(), dec.open_session()]
    start = 0
    for w in [1, 3, 2]:  # a cold first latent, then warm windows of several latents
        dec.decode_batch(sessions, [z[b : b + 1, :, start : start + w] for b in range(2)], output="pixels")
        start += w
    return probe


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("fused", [False, True], ids=["diffusers-convs", "fused"])
def test_every_conv3d_input_keeps_the_channels_last_layout(family, fused):
    probe = _decode(family, fused, batch=fused)  # the fused run stacks the two sessions' caches too
    assert probe.calls > 0
    assert not probe.dropped, f"convs handed another layout than channels_last_3d: {sorted(probe.dropped)}"


def _contiguous_norm_output(decoder: nn.Module) -> None:
    """Inject a layout drop: the first residual block's norm hands its output on in the standard layout."""
    block = next(m for m in decoder.modules() if isinstance(m, WanResidualBlock))
    block.norm1.register_forward_hook(lambda module, args, out: out.contiguous())


@pytest.mark.parametrize("fused", [False, True], ids=["diffusers-convs", "fused"])
def test_the_probe_catches_an_injected_layout_drop(fused):
    probe = _decode("wan22", fused, inject=_contiguous_norm_output)
    assert any("resnets.0.conv1 (input)" in d for d in probe.dropped), probe.dropped


def test_a_decode_runs_the_same_with_the_layout_check_and_without():
    """The probe only observes: the frames are the decoder's own (bit for bit, the same calls)."""
    build, grid = FAMILIES["wan22"]
    vae, z = build(seed=2), random_latents(3, grid, seed=4)
    opts = DecoderOptions(channels_last=True, onednn_conv=True, fused=False)
    plain, probed = WarmWanDecoder(vae, opts), WarmWanDecoder(vae, opts)
    LayoutProbe(probed._decoder)
    want = decode_windows(plain, plain.open_session(), z, [1, 2])
    got = decode_windows(probed, probed.open_session(), z, [1, 2])
    assert all(torch.equal(a, b) for a, b in zip(got, want))
