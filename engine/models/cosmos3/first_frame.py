"""A session's first frame: the checkpoint's fixed size (cover-crop), or the pipeline's canvas.

Without a resolution tier a session keeps the model's frame size: the image is cover-cropped to it
(`vae.encode_first_frame`). With one (256, 480, 704, 720, or ``"auto"`` for cosmos-framework's rule) the
image goes onto the pipeline's canvas (`canvas.py`: tier, aspect bin, resize, reflect/replicate padding),
the canvas is encoded and the padding's latents are dropped, so the session's latent grid, and the size of
every frame it returns, is the content's (`FramePlan.output_size`); the caption states the canvas.
"""

from __future__ import annotations

import numpy as np
import torch

from ...spec import ModelSpec, SessionFrame
from ...vae.encoder import encode_checked_image, encode_pixels
from .canvas import canvas_pixels, plan_first_frame

AUTO_TIER = "auto"


def plan_session_frame(spec: ModelSpec, patch: int, image: np.ndarray, tier: int | str | None) -> SessionFrame:
    """Check the tier against the image (a ValueError before any model work) and plan the session's frames."""
    return frame_for_size(spec, patch, int(image.shape[0]), int(image.shape[1]), tier)


def frame_for_size(spec: ModelSpec, patch: int, height: int, width: int, tier: int | str | None) -> SessionFrame:
    """The `SessionFrame` of a first frame of ``height x width`` (what an env fixes at construction)."""
    if tier is None:
        return SessionFrame(spec, (spec.height, spec.width))
    if isinstance(tier, str) and tier != AUTO_TIER:
        raise ValueError(f"tier={tier!r} is invalid; allowed: 256, 480, 704, 720, {AUTO_TIER!r} or None")
    plan = plan_first_frame(height, width, None if tier == AUTO_TIER else tier, spec.spatial_compression)
    return SessionFrame(spec.at_latent_size(*plan.latent_size, patch), plan.canvas, plan)


def encode_session_frame(vae: torch.nn.Module, image: np.ndarray, frame: SessionFrame) -> torch.Tensor:
    """The clean normalised latent frame 0, `[C, 1, h, w]` float32, on the session's grid (``image`` was checked
    where it entered, once; ``frame`` was planned from it)."""
    if frame.plan is None:
        return encode_checked_image(vae, image, frame.spec.height, frame.spec.width)[0].float()
    return frame.plan.crop_latents(encode_pixels(vae, canvas_pixels(image, frame.plan)))[0].float()
