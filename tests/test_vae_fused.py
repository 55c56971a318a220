"""`decoder.fused` (engine/vae/fused.py), the CUDA fast path, run on the CPU: the same code (padding inside the conv,
RMS norm + SiLU compiled by inductor, here its C++ backend) equals `vae.decode` within `FUSED_DECODE_ATOL`, keeps
the warm == whole-clip claim in bf16, and compiles at most `MAX_NORM_GRAPHS` graphs for a decoder."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from vae_models import FAMILIES, decode_windows, random_latents, raw_latents, session_pixels, whole_pixels
from worldstep.engine.vae import FUSED_DECODE_ATOL, DecoderOptions
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.fused import MAX_NORM_GRAPHS, reset_compiled


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("onednn", [False, True], ids=["torch-convs", "onednn-convs"])
def test_the_fused_path_equals_the_whole_clip_decode_within_its_bound(family, onednn):
    build, grid = FAMILIES[family]
    vae, z = build(seed=7), random_latents(6, grid, seed=8)
    dec = WarmWanDecoder(vae, DecoderOptions(fused=True, onednn_conv=onednn))
    assert dec.fused and not dec.channels_last and dec.dtype == torch.float32
    got = torch.cat(decode_windows(dec, dec.open_session(), z, [1, 3, 2]), dim=2)
    torch.testing.assert_close(got, whole_pixels(vae, z), atol=FUSED_DECODE_ATOL, rtol=0)


def test_the_fused_copy_replaces_every_norm_and_pad_and_leaves_the_vae_alone():
    build, _ = FAMILIES["wan22"]
    vae = build(seed=7)
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    dec = WarmWanDecoder(vae, DecoderOptions(fused=True))
    kinds = {type(m).__name__ for m in dec._decoder.modules()}
    assert "WanRMS_norm" not in kinds and "FusedRMSNorm" in kinds
    assert all("forward" in vars(m) for m in dec._decoder.modules() if type(m).__name__ == "WanCausalConv3d")
    assert "SiLU" not in kinds  # every SiLU moved into the norm before it
    assert "SiLU" in {type(m).__name__ for m in vae.decoder.modules()}
    assert all(torch.equal(before[k], v) for k, v in vae.state_dict().items())


@pytest.mark.exactness
def test_bf16_warm_windows_are_the_per_latent_calls_and_near_the_whole_clip_in_bf16():
    """Same dtype on both sides: the warm bf16 decode issues exactly the calls of a per-latent bf16 decode
    (bit for bit), and is within bf16 rounding of one whole-clip bf16 decode (only post_quant_conv's call shape
    differs, and it runs in float32 before the cast)."""
    build, grid = FAMILIES["wan22"]
    vae, z = build(seed=9), random_latents(5, grid, seed=10)
    dec = WarmWanDecoder(vae, DecoderOptions(dtype="bfloat16"))
    got = torch.cat(decode_windows(dec, dec.open_session(), z, [1, 3, 1]), dim=2)
    bf16 = build(seed=9)
    bf16.decoder.to(torch.bfloat16)
    want = _bf16_decoder_pixels(bf16, z, whole_clip=False)
    assert torch.equal(got, want)
    torch.testing.assert_close(got, _bf16_decoder_pixels(bf16, z, whole_clip=True), atol=BF16_WHOLE_ATOL, rtol=0)


# bf16 decoder, per-latent vs whole-clip float32 post_quant_conv before the cast: a 1-ulp flip of a bf16 input
# carried through the decoder. Measured max 0 on the test VAEs (the float32 outputs agreed to ~1e-7, below
# half a bf16 ulp); stated as the bf16 VAE's bound (vae_models.BF16_WHOLE_DECODE_ATOL).
BF16_WHOLE_ATOL = 3e-2


def _bf16_decoder_pixels(vae, z: torch.Tensor, whole_clip: bool) -> torch.Tensor:
    """float32 de-normalisation and post_quant_conv, then the bf16 decoder one latent at a time from an empty
    cache (`session_pixels`' calls), pixels cast back to float32; written independently of engine/vae."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    raw = raw_latents(vae, z)
    with torch.no_grad():
        x = (vae.post_quant_conv(raw) if whole_clip else
             torch.cat([vae.post_quant_conv(raw[:, :, i : i + 1]) for i in range(z.shape[2])], dim=2))
        cache = [None] * sum(type(m).__name__ == "WanCausalConv3d" for m in vae.decoder.modules())
        outs = []
        for i in range(z.shape[2]):
            out = vae.decoder(x[:, :, i : i + 1].to(torch.bfloat16), feat_cache=cache, feat_idx=[0], first_chunk=i == 0)
            outs.append(unpatchify(out, patch_size=vae.config.patch_size).clamp(-1.0, 1.0).to(torch.float32))
    return torch.cat(outs, dim=2)


def test_fused_bf16_is_near_the_bf16_decode():
    """The fused path in bf16 (what CUDA runs by default) against diffusers' bf16 ops: the norm's statistics and
    scale in float32 instead of bf16 products, within bf16 rounding."""
    build, grid = FAMILIES["wan21"]
    vae, z = build(seed=11), random_latents(4, grid, seed=12)
    plain = WarmWanDecoder(vae, DecoderOptions(dtype="bfloat16", fused=False))
    fused = WarmWanDecoder(vae, DecoderOptions(dtype="bfloat16", fused=True, channels_last=True))
    want = torch.cat(decode_windows(plain, plain.open_session(), z, [1, 2, 1]), dim=2)
    got = torch.cat(decode_windows(fused, fused.open_session(), z, [1, 2, 1]), dim=2)
    torch.testing.assert_close(got, want, atol=BF16_WHOLE_ATOL, rtol=0)
    assert torch.isfinite(got).all() and not torch.equal(got, session_pixels(vae, z))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_decoder_compiles_at_most_the_stated_number_of_norm_graphs(family):
    build, grid = FAMILIES[family]
    reset_compiled()
    counters.clear()
    dec = WarmWanDecoder(build(seed=2), DecoderOptions(fused=True, channels_last=True, onednn_conv=True,
                                                       batch_sessions=True))
    z = random_latents(7, grid, seed=3, batch=2)
    pair = [dec.open_session(), dec.open_session()]
    start = 0
    for w in [1, 3, 2]:  # batch 2, one frame and several, cold and warm
        dec.decode_batch(pair, [z[b : b + 1, :, start : start + w] for b in range(2)], output="pixels")
        start += w
    alone = dec.open_session()  # batch 1
    decode_windows(dec, alone, z[:1], [1, 1, 2])
    graphs = counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= MAX_NORM_GRAPHS, f"{graphs} graphs compiled"
    assert not counters["recompiles"] or sum(counters["recompiles"].values()) < torch._dynamo.config.recompile_limit
