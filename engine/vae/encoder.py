"""First frame -> the clean, normalised latent frame 0 of a rollout.

Same math as the Cosmos3 pipeline (`_preprocess_conditioning_image`, then `_encode_video` with the
distribution's mode), so a rollout starts from the latent the pipeline would build. The encoder runs
with its own causal-conv cache instead of `vae.encode`, which resets the shared `vae._feat_map` and
would break a whole-clip `vae.decode` running in another thread.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

from ..checks import check_image, is_int
from .cache import count_slots, empty_cache
from .latents import LatentNorm


def _check_size(height: int, width: int, multiple: int = 1) -> None:
    for name, value in (("height", height), ("width", width)):
        if not is_int(value) or value < multiple or value % multiple:
            raise ValueError(f"{name}={value!r} is invalid; allowed: a positive int, a multiple of {multiple}")


def preprocess_first_frame(image: np.ndarray, height: int, width: int) -> torch.Tensor:
    """Resize to cover `height x width` keeping the aspect (bilinear, antialiased), centre-crop,
    round to 8-bit levels and map to [-1, 1].

    Args:
        image: `[H, W, 3]` uint8 (0..255) or float (0..1) numpy array.
    Returns:
        `[1, 3, height, width]` float32 on the CPU.
    """
    return cover_pixels(check_image("image", image), height, width)


def cover_pixels(image: np.ndarray, height: int, width: int) -> torch.Tensor:
    """`preprocess_first_frame` of an image checked where it entered (`checks.check_image`): no check again."""
    _check_size(height, width)
    pixels = torch.from_numpy(np.ascontiguousarray(image)).unsqueeze(0).permute(0, 3, 1, 2)  # [1,3,H,W]
    pixels = pixels.to(torch.float32)
    if image.dtype != np.uint8:
        pixels = pixels * 255.0
    src_h, src_w = pixels.shape[-2:]
    scale = max(width / src_w, height / src_h)
    cover_h, cover_w = math.ceil(scale * src_h), math.ceil(scale * src_w)
    pixels = F.interpolate(pixels, size=(cover_h, cover_w), mode="bilinear", align_corners=False, antialias=True)
    top, left = round((cover_h - height) / 2), round((cover_w - width) / 2)
    pixels = pixels[:, :, top : top + height, left : left + width]  # [1,3,height,width]
    return pixels.round().clamp(0, 255) / 127.5 - 1.0


def cover_crop(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """`preprocess_first_frame`'s pixels as uint8 `[height, width, 3]`: the image a session starts from (exact: the
    preprocessing rounds to 8-bit levels before mapping to [-1, 1])."""
    pixels = (preprocess_first_frame(image, height, width)[0].permute(1, 2, 0) + 1.0) * 127.5  # [height,width,3]
    return pixels.round().clamp(0, 255).to(torch.uint8).numpy()


def _encode_mean(vae: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The posterior mean (mode) of one frame. Args: x `[1, 3, 1, H, W]`. Returns `[1, C, 1, h, w]`."""
    if vae.use_tiling or vae.use_slicing:  # keep diffusers' tiled/sliced encode exactly
        return vae.encode(x).latent_dist.mode()
    if vae.config.patch_size is not None:
        x = patchify(x, patch_size=vae.config.patch_size)  # [1,3p^2,1,H/p,W/p]
    # One frame is one encoder call, from an empty cache of our own.
    h = vae.encoder(x, feat_cache=empty_cache(count_slots(vae.encoder)), feat_idx=[0])
    moments = vae.quant_conv(h)  # [1,2C,1,h,w]: mean then log-variance
    return moments[:, : vae.config.z_dim]


def encode_first_frame(vae: torch.nn.Module, image: np.ndarray, height: int, width: int) -> torch.Tensor:
    """Encode a conditioning image to its clean normalised latent.

    Args:
        vae: a diffusers `AutoencoderKLWan`.
        image: `[H, W, 3]` uint8 (0..255) or float (0..1) numpy array, any size >= 16 px.
        height, width: output frame size, multiples of the VAE's `scale_factor_spatial`.
    Returns:
        `[1, C, 1, height / s, width / s]` float32 on the VAE's device, `(mu - mean) / std`.
    """
    _check_size(height, width, int(vae.config.scale_factor_spatial))
    return encode_pixels(vae, preprocess_first_frame(image, height, width))


def encode_checked_image(vae: torch.nn.Module, image: np.ndarray, height: int, width: int) -> torch.Tensor:
    """`encode_first_frame` of an image checked where it entered (a session's: `checks.check_image` ran once)."""
    _check_size(height, width, int(vae.config.scale_factor_spatial))
    return encode_pixels(vae, cover_pixels(image, height, width))


def encode_pixels(vae: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Encode one preprocessed frame (e.g. the pipeline's padded canvas) to its clean normalised latent.

    Args:
        pixels: `[1, 3, H, W]` float in [-1, 1], sides multiples of the VAE's spatial factor.
    Returns:
        `[1, C, 1, H / s, W / s]` float32 on the VAE's device, `(mu - mean) / std`.
    """
    _check_size(int(pixels.shape[-2]), int(pixels.shape[-1]), int(vae.config.scale_factor_spatial))
    weight = vae.quant_conv.weight
    x = pixels.to(device=weight.device, dtype=weight.dtype).unsqueeze(2)  # [1,3,1,H,W]
    with torch.no_grad():  # not inference_mode: the caller may edit the latent in place
        mu = _encode_mean(vae, x)
        norm = LatentNorm.from_vae(vae, weight.device, weight.dtype)
        return norm.normalize(mu).to(torch.float32)
