"""The private CPU fast path of engine/vae/perf.py: each replaced piece against the module's own forward
within float32 rounding, the fallback for inputs it does not take, and the shared modules left alone."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanRMS_norm
from vae_models import ONEDNN_ATOL, random_latents, tiny_wan22
from worldstep.engine.vae import DecoderOptions
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.perf import decoder_copy

# One replaced module vs the original on the same input: oneDNN and the fused norm sum in another order than
# the reference kernels. Measured max |diff| over 20 seeds, also under the kernel selections of
# tests/test_cpu_kernels.py: 1.2e-6 (convs), 9.5e-7 (norm, outputs of scale ~3); stated with an 8x margin. The
# whole-decoder bound (1e-4) is ONEDNN_ATOL in vae_models.py.
PIECE_ATOL = 1e-5


def _copy_of(module: torch.nn.Module) -> torch.nn.Module:
    return decoder_copy(module, onednn_conv=True)


def _randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    return module.eval()


@pytest.mark.exactness
@pytest.mark.parametrize("images,bias,shape", [(False, False, (2, 8, 3, 6, 5)), (True, False, (3, 8, 6, 5)),
                                               (False, True, (1, 16, 2, 4, 4))])
def test_fused_rms_norm_matches_f_normalize(images, bias, shape):
    norm = _randomize(WanRMS_norm(shape[1], images=images, bias=bias), seed=1)
    fast = _copy_of(norm)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2)) * 3
    x[0, :, 0] = 0.0  # an all-zero pixel: F.normalize's eps clamp, not a division by zero
    with torch.inference_mode():
        want, got = norm(x), fast(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=PIECE_ATOL, rtol=0)


@pytest.mark.exactness
@pytest.mark.parametrize("cache_frames", [None, 1, 2])
@pytest.mark.parametrize("kernel,stride,padding", [(3, 1, 1), ((3, 1, 1), (2, 1, 1), 0), (1, 1, 0)],
                         ids=["3x3x3", "time-stride-2", "1x1x1"])
def test_causal_conv_pads_inside_onednn_and_matches(kernel, stride, padding, cache_frames):
    torch.manual_seed(3)
    conv = WanCausalConv3d(6, 5, kernel, stride=stride, padding=padding).eval()
    fast = _copy_of(conv)
    x = torch.randn(1, 6, 4, 7, 6)
    cache = None if cache_frames is None else torch.randn(1, 6, cache_frames, 7, 6)
    with torch.inference_mode():
        want, got = conv(x, cache), fast(x, cache)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=PIECE_ATOL, rtol=0)


def test_autograd_and_other_dtypes_take_the_modules_own_path():
    torch.manual_seed(4)
    conv, norm = WanCausalConv3d(4, 4, 3, padding=1), WanRMS_norm(4, images=False)
    fast_conv, fast_norm = _copy_of(conv), _copy_of(norm)
    x = torch.randn(1, 4, 2, 5, 5)
    # With autograd on, the copy runs the very same calls as the original: equal bit for bit, and differentiable.
    assert torch.equal(fast_conv(x), conv(x)) and torch.equal(fast_norm(x), norm(x))
    fast_norm(x.requires_grad_()).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.inference_mode():  # float64 is not the fast path either
        assert torch.equal(fast_conv.double()(x.double()), conv.double()(x.double()))


def test_the_copy_is_private_and_a_copy_of_it_binds_its_own_weights():
    vae = tiny_wan22(seed=6)
    fast = _copy_of(vae.decoder)
    patched = [m for m in fast.modules() if "forward" in vars(m)]
    assert patched and all(isinstance(m, (WanCausalConv3d, WanRMS_norm)) for m in patched)
    assert not any("forward" in vars(m) or "_conv_forward" in vars(m) for m in vae.decoder.modules())
    assert not any(p is q for p, q in zip(fast.parameters(), vae.decoder.parameters()))
    conv = next(m for m in fast.modules() if isinstance(m, WanCausalConv3d))
    twin = copy.deepcopy(conv)
    x = torch.randn(1, conv.in_channels, 1, 4, 4)
    with torch.inference_mode():
        before = conv(x)
        twin.weight.zero_()
        twin.bias.zero_()
        assert float(twin(x).abs().max()) == 0.0  # the twin's forward reads the twin's weights
        torch.testing.assert_close(conv(x), before, atol=0, rtol=0)


def test_a_steady_window_runs_no_strided_norm_no_pad_and_no_reference_conv():
    vae = tiny_wan22(seed=7)
    dec = WarmWanDecoder(vae, DecoderOptions(onednn_conv=True))
    z = random_latents(3, (2, 2), seed=8)
    with dec.session() as s:
        dec.decode(s, z[:, :, :2])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            dec.decode(s, z[:, :, 2:])
    ops = {e.key for e in prof.key_averages()}
    assert "aten::mkldnn_convolution" in ops
    assert not ops & {"aten::linalg_vector_norm", "aten::constant_pad_nd", "aten::slow_conv3d_forward"}, ops


@pytest.mark.exactness
def test_a_whole_vae_copy_encodes_and_decodes_within_the_onednn_bound():
    """The bench patches a pipeline's own VAE this way (encoder, decoder and the quant convs)."""
    vae = tiny_wan22(seed=9)
    fast = _copy_of(vae)
    video = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(10)) * 2 - 1
    with torch.no_grad():
        want_z, got_z = vae.encode(video).latent_dist.mode(), fast.encode(video).latent_dist.mode()
        torch.testing.assert_close(got_z, want_z, atol=ONEDNN_ATOL, rtol=0)
        torch.testing.assert_close(fast.decode(want_z).sample, vae.decode(want_z).sample, atol=ONEDNN_ATOL, rtol=0)
