"""The first frame of an action rollout on its resolution canvas, as the Cosmos3 pipeline builds it.

diffusers' `Cosmos3OmniPipeline` (action path: `__call__`, `_prepare_action_video_conditioning`,
`_remove_action_video_padding_from_latent`) does, for one conditioning image:

1. floor the image to a multiple of the VAE's spatial factor (`VaeImageProcessor`: PIL bilinear
   for 8-bit images, nearest for float arrays) and map it to [-1, 1];
2. pick the aspect bin of the resolution tier closest to the image's aspect: the canvas;
3. shrink the image to fit the canvas (bicubic, antialiased; never enlarge), anchored top-left;
4. pad right and bottom by reflection, or by replication when a pad is at least as large as the
   content it would mirror;
5. encode the canvas, then keep only the latents over the content (`content // spatial`, floored):
   the transformer never sees padded tokens, and decoded frames are `latent * spatial` pixels.

`prepare_first_frame` reproduces 1-4 and returns the canvas with a `FramePlan` recording the tier,
bin, canvas (the size the caption states), content, and the latent crop to apply to the encoded
canvas (step 5), which fixes the size of every returned frame. Without an explicit tier it picks one
by cosmos-framework's inference rule (`get_vision_data_resolution`: shorter side <= 256 -> 256,
<= 640 -> 480, else 720, its largest tier diffusers has a bin table for).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ...checks import check_int


@functools.cache
def resolution_bins() -> dict[int, dict[str, tuple[int, int]]]:
    """tier -> {aspect key (height / width): (height, width)}, the installed diffusers' `_ACTION_RESOLUTION_BINS`."""
    from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as omni

    return {int(tier): {key: (int(h), int(w)) for key, (h, w) in bins.items()}
            for tier, bins in omni._ACTION_RESOLUTION_BINS.items()}


def choose_tier(height: int, width: int) -> int:
    """The tier for an image of this size (cosmos-framework's rule, capped at diffusers' 720)."""
    side = min(height, width)
    return 256 if side <= 256 else 480 if side <= 640 else 720


@dataclass(frozen=True)
class FramePlan:
    """Where a first frame sits on its canvas, and what part of the rollout is kept.

    Attributes:
        source: `(height, width)` of the image as given.
        floored: `(height, width)` after flooring to a multiple of `spatial` (what the bins see).
        tier: the resolution tier (256, 480, 704 or 720).
        aspect_bin: the diffusers key of the chosen bin (its height / width ratio).
        canvas: `(height, width)` of the padded frame the VAE encodes and the caption states.
        content: `(height, width)` of the image on the canvas (top-left).
        pad_mode: `"reflect"`, `"replicate"` or None (no padding).
        latent_size: `(height, width)` of the latent grid kept after encoding (content // spatial).
        spatial: the VAE's spatial compression.
    """

    source: tuple[int, int]
    floored: tuple[int, int]
    tier: int
    aspect_bin: str
    canvas: tuple[int, int]
    content: tuple[int, int]
    pad_mode: str | None
    latent_size: tuple[int, int]
    spatial: int

    @property
    def output_size(self) -> tuple[int, int]:
        """`(height, width)` of every decoded frame."""
        return self.latent_size[0] * self.spatial, self.latent_size[1] * self.spatial

    @property
    def crop_box(self) -> tuple[int, int, int, int]:
        """`(top, left, height, width)` of the canvas that the returned frames show."""
        return (0, 0, *self.output_size)

    def crop_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Keep the latents over the content. Args: latents `[..., canvas_h / s, canvas_w / s]`."""
        expected = (self.canvas[0] // self.spatial, self.canvas[1] // self.spatial)
        if tuple(latents.shape[-2:]) != expected:
            raise ValueError(f"latents of spatial shape {tuple(latents.shape[-2:])} are invalid; allowed: the "
                             f"canvas grid {expected}")
        return latents[..., : self.latent_size[0], : self.latent_size[1]].contiguous()  # [..., lh, lw]


def plan_first_frame(height: int, width: int, tier: int | None = None, spatial: int = 16) -> FramePlan:
    """The canvas arithmetic alone (no pixels): tier, bin, content size, padding, kept latents."""
    for name, value, low in (("height", height, spatial), ("width", width, spatial), ("spatial", spatial, 1)):
        check_int(name, value, low)
    floored = (height - height % spatial, width - width % spatial)
    bins = resolution_bins()
    if tier is None:
        tier = choose_tier(*floored)
    if isinstance(tier, bool) or tier not in bins:
        raise ValueError(f"tier={tier!r} is invalid; allowed: one of {sorted(bins)} or None (chosen from the image)")
    ratio = floored[0] / floored[1]
    aspect_bin = min(bins[tier], key=lambda key: abs(float(key) - ratio))  # diffusers' classify_height_width_bin
    canvas = bins[tier][aspect_bin]
    scale = min(canvas[1] / floored[1], canvas[0] / floored[0], 1.0)
    content = (max(1, int(scale * floored[0] + 0.5)), max(1, int(scale * floored[1] + 0.5)))
    pad_bottom, pad_right = canvas[0] - content[0], canvas[1] - content[1]
    pad_mode = None
    if pad_bottom or pad_right:
        pad_mode = "replicate" if pad_right >= content[1] or pad_bottom >= content[0] else "reflect"
    latent_size = (max(content[0] // spatial, 1), max(content[1] // spatial, 1))
    return FramePlan(source=(height, width), floored=floored, tier=tier, aspect_bin=aspect_bin, canvas=canvas,
                     content=content, pad_mode=pad_mode, latent_size=latent_size, spatial=spatial)


def prepare_first_frame(image: np.ndarray, tier: int | None = None,
                        spatial: int = 16) -> tuple[torch.Tensor, FramePlan]:
    """The canvas the pipeline encodes for this first frame, and its plan.

    Args:
        image: `[H, W, 3]` numpy, uint8 (0..255; treated as the pipeline treats a PIL image) or float
            in [0, 1] (as it treats a float array). Both sides at least `spatial`.
        tier: 256, 480, 704, 720, or None to choose from the image.
        spatial: the VAE's spatial compression (16 for the Wan 2.2 VAE).
    Returns:
        `[1, 3, canvas_h, canvas_w]` float32 in [-1, 1] on the CPU, and the `FramePlan`.
    """
    _check_image(image)
    plan = plan_first_frame(int(image.shape[0]), int(image.shape[1]), tier, spatial)
    return canvas_pixels(image, plan), plan


def canvas_pixels(image: np.ndarray, plan: FramePlan) -> torch.Tensor:
    """`prepare_first_frame`'s canvas of an image checked where it entered, on its plan: no check again.
    Returns `[1, 3, canvas_h, canvas_w]` float32 in [-1, 1] on the CPU."""
    pixels = _floored_pixels(image, plan.floored)  # [1,3,h,w] in [-1,1]
    if plan.content != plan.floored:
        pixels = F.interpolate(pixels, size=plan.content, mode="bicubic", align_corners=False, antialias=True)
    pad_bottom, pad_right = plan.canvas[0] - plan.content[0], plan.canvas[1] - plan.content[1]
    if plan.pad_mode is not None:
        pixels = F.pad(pixels, (0, pad_right, 0, pad_bottom), mode=plan.pad_mode)  # [1,3,canvas_h,canvas_w]
    return pixels


def _floored_pixels(image: np.ndarray, floored: tuple[int, int]) -> torch.Tensor:
    """Step 1: `VaeImageProcessor.preprocess` with no target size, then [0, 1] -> [-1, 1]."""
    if image.dtype == np.uint8:
        picture = Image.fromarray(np.ascontiguousarray(image))  # RGB
        if picture.size != (floored[1], floored[0]):
            picture = picture.resize((floored[1], floored[0]), resample=Image.BILINEAR, reducing_gap=None)
        unit = np.asarray(picture).astype(np.float32) / 255.0  # [h,w,3]
        pixels = torch.from_numpy(unit[None].transpose(0, 3, 1, 2).copy())  # [1,3,h,w]
    else:  # float32/float64 arithmetic stays in the array's dtype until the pipeline's cast to float32
        array = image if image.dtype in (np.float32, np.float64) else image.astype(np.float32)
        pixels = torch.from_numpy(np.ascontiguousarray(array)[None].transpose(0, 3, 1, 2).copy())
        if tuple(pixels.shape[-2:]) != floored:
            pixels = F.interpolate(pixels, size=floored)  # nearest, as diffusers resizes arrays
    return (2.0 * pixels - 1.0).to(torch.float32)


def _check_image(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray):
        raise ValueError(f"image must be a numpy array [H, W, 3], got {type(image).__name__}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be [H, W, 3] (RGB, channels last), got shape {image.shape}")
    if image.dtype == np.uint8:
        return
    if not np.issubdtype(image.dtype, np.floating):
        raise ValueError(f"image dtype must be uint8 (0..255) or float (0..1), got {image.dtype}")
    if not np.isfinite(image).all():
        raise ValueError("image (float) contains NaN or Inf; allowed values are 0..1")
    lo, hi = float(image.min()), float(image.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(f"image (float) values must lie in 0..1, got min {lo:g}, max {hi:g}")
