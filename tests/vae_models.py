"""Tiny random Wan VAEs and independent references (diffusers only) for the engine/vae tests."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify as wan_unpatchify
from diffusers.video_processor import VideoProcessor
from worldstep.engine.vae import WHOLE_CLIP_DECODE_ATOL

Z_DIM = 4
MEAN = [0.3, -0.7, 1.1, 0.05]
STD = [1.7, 0.6, 2.3, 0.9]


def tiny_wan22(seed: int = 0) -> AutoencoderKLWan:
    """Wan 2.2 family: residual blocks, patch 2, 16x spatial. A 2x2 latent grid is 32x32 px."""
    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4, latents_mean=MEAN, latents_std=STD,
    ).eval()


def tiny_wan21(seed: int = 0) -> AutoencoderKLWan:
    """Wan 2.1 family: no patching, 8x spatial. A 4x4 latent grid is 32x32 px."""
    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=8, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], latents_mean=MEAN, latents_std=STD,
    ).eval()


FAMILIES = {"wan22": (tiny_wan22, (2, 2)), "wan21": (tiny_wan21, (4, 4))}


def random_latents(t: int, grid: tuple[int, int], seed: int = 0, batch: int = 1) -> torch.Tensor:
    """Normalised (model-space) latents `[B, Z_DIM, t, h, w]`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, Z_DIM, t, *grid, generator=g)


def raw_latents(vae: AutoencoderKLWan, z: torch.Tensor) -> torch.Tensor:
    """The Cosmos3 pipeline's de-normalisation in the VAE's dtype, written out here independently of
    engine/vae."""
    dtype = vae.post_quant_conv.weight.dtype
    mean = torch.tensor(vae.config.latents_mean, dtype=dtype).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=dtype).view(1, -1, 1, 1, 1)
    return z.to(dtype) / inv_std + mean


def whole_pixels(vae: AutoencoderKLWan, z: torch.Tensor) -> torch.Tensor:
    """`vae.decode` of the whole (normalised) clip: `[B, 3, T, H, W]` in [-1, 1]."""
    with torch.no_grad():
        return vae.decode(raw_latents(vae, z)).sample


# Warm decode vs one whole-clip `vae.decode`: the decoder calls are the same, but `post_quant_conv` runs
# one latent at a time instead of over the whole clip and may round differently (kernels choose their
# path by shape). Measured on the test VAEs, over seeds, window patterns and kernel selections
# (ATEN_CPU_CAPABILITY default/avx2/avx512, ONEDNN_MAX_CPU_ISA=AVX2, oneDNN convs on and off):
# max |diff| 3.8e-6 in [-1, 1] pixels. The engine states the bound (2.5x margin); docs/exactness.md.
WHOLE_DECODE_ATOL = WHOLE_CLIP_DECODE_ATOL
# oneDNN convs (DecoderOptions.onednn_conv) sum every conv of the decoder in another order than torch's
# reference kernel; measured max |diff| 3.8e-6 here too, bound kept at the looser 1e-4 it always had.
ONEDNN_ATOL = 1e-4
# bf16 VAEs: the same per-latent vs whole-clip post_quant_conv rounding at bf16 scale (8 mantissa bits).
BF16_WHOLE_DECODE_ATOL = 3e-2


def assert_near_whole_decode(got: torch.Tensor, want: torch.Tensor, atol: float = WHOLE_DECODE_ATOL) -> None:
    """`got` equals the whole-clip decode `want` within the stated bound, and within 1 uint8 level."""
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    if got.dtype == torch.float32:
        levels = np.abs(diffusers_frames(got).astype(np.int16) - diffusers_frames(want).astype(np.int16))
        assert levels.max() <= 1


def session_pixels(vae: AutoencoderKLWan, z: torch.Tensor, first: int = 0,
                   decoder_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The calls a warm session issues, written out independently of engine/vae: `post_quant_conv` and the
    decoder one latent at a time over `z[:, :, first:]` from an empty cache. `[B, 3, T, H, W]` in [-1, 1].

    A warm session with one latent per call makes exactly these calls with these shapes, so it must equal
    this bit for bit, whatever its window pattern."""
    num_slots = sum(type(m).__name__ == "WanCausalConv3d" for m in vae.decoder.modules())
    cache: list = [None] * num_slots
    raw = raw_latents(vae, z)
    outs = []
    with torch.no_grad():
        for i in range(first, z.shape[2]):
            x = vae.post_quant_conv(raw[:, :, i : i + 1])
            x = x if decoder_dtype is None else x.to(decoder_dtype)  # a decoder in another dtype than the prelude
            out = vae.decoder(x, feat_cache=cache, feat_idx=[0], first_chunk=i == first)
            if vae.config.patch_size is not None:
                out = wan_unpatchify(out, patch_size=vae.config.patch_size)
            outs.append(out.clamp(-1.0, 1.0))
    return torch.cat(outs, dim=2)


def diffusers_frames(pixels: torch.Tensor) -> np.ndarray:
    """uint8 `[T, H, W, 3]` of one video through diffusers' VideoProcessor (PIL output path)."""
    pil = VideoProcessor(vae_scale_factor=8).postprocess_video(pixels, output_type="pil")[0]
    return np.stack([np.asarray(im) for im in pil])


def stateless_pixels(vae: AutoencoderKLWan, z: torch.Tensor, start: int, w: int, k: int) -> torch.Tensor:
    """The stateless baseline for the window `[start, start + w)`: up to `k` latents of context plus the
    window decoded from an empty cache with a session's calls (`session_pixels`), keeping the window's frames."""
    lo = max(0, start - k)
    pixels = session_pixels(vae, z[:, :, : start + w], first=lo)
    return pixels if start == 0 else pixels[:, :, -4 * w :]


def decode_windows(decoder, session, z: torch.Tensor, pattern: list[int], start: int = 0) -> list[torch.Tensor]:
    """Decode `z[:, :, start:]` window by window (pixels), returning each window's pixels."""
    out = []
    for w in pattern:
        out.append(decoder.decode_pixels(session, z[:, :, start : start + w]))
        start += w
    return out


class CallRecorder:
    """Forward pre-hook on a decoder: records (batch, latents, first_chunk) of every call and can
    raise on a chosen call to inject a failure mid-window."""

    def __init__(self, module: torch.nn.Module, fail_on: int | None = None, fail_if_first_chunk: bool = False):
        self.calls: list[tuple[int, int, bool]] = []
        self.fail_on = fail_on
        self.fail_if_first_chunk = fail_if_first_chunk
        self._handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        x = args[0]
        first = bool(kwargs.get("first_chunk", False))
        self.calls.append((x.shape[0], x.shape[2], first))
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise RuntimeError("injected decoder failure")
        if self.fail_if_first_chunk and first:
            raise RuntimeError("injected decoder failure on a first chunk")

    def remove(self) -> None:
        self._handle.remove()
