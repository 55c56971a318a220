"""Warm streaming Wan VAE decoder and first-frame encoder (see docs/internals.md, engine/vae).

`DecoderOptions` imports without torch (the YAML config uses it); everything else loads on first use.
"""

from __future__ import annotations

from .options import DecoderOptions

__all__ = [
    "DecoderOptions",
    "BATCHED_DECODE_ATOL",
    "WHOLE_CLIP_DECODE_ATOL",
    "FUSED_DECODE_ATOL",
    "BF16_DECODE_ATOL",
    "BF16_DECODE_PSNR_DB",
    "WarmWanDecoder",
    "encode_first_frame",
    "encode_pixels",
    "preprocess_first_frame",
    "frames_from_pixels",
    "frames_per_window",
    "LatentNorm",
    "DecodeSession",
    "DecodePath",
]


def __getattr__(name: str):
    """The names whose modules import torch, imported on first use; every import is spelled out, so tools and the
    structure test see each edge."""
    if name == "BATCHED_DECODE_ATOL":
        from .jobs import BATCHED_DECODE_ATOL

        return BATCHED_DECODE_ATOL
    if name == "WHOLE_CLIP_DECODE_ATOL":
        from .bounds import WHOLE_CLIP_DECODE_ATOL

        return WHOLE_CLIP_DECODE_ATOL
    if name == "FUSED_DECODE_ATOL":
        from .bounds import FUSED_DECODE_ATOL

        return FUSED_DECODE_ATOL
    if name == "BF16_DECODE_ATOL":
        from .bounds import BF16_DECODE_ATOL

        return BF16_DECODE_ATOL
    if name == "BF16_DECODE_PSNR_DB":
        from .bounds import BF16_DECODE_PSNR_DB

        return BF16_DECODE_PSNR_DB
    if name == "WarmWanDecoder":
        from .decoder import WarmWanDecoder

        return WarmWanDecoder
    if name == "encode_first_frame":
        from .encoder import encode_first_frame

        return encode_first_frame
    if name == "encode_pixels":
        from .encoder import encode_pixels

        return encode_pixels
    if name == "preprocess_first_frame":
        from .encoder import preprocess_first_frame

        return preprocess_first_frame
    if name == "frames_from_pixels":
        from .frames import frames_from_pixels

        return frames_from_pixels
    if name == "frames_per_window":
        from .frames import frames_per_window

        return frames_per_window
    if name == "LatentNorm":
        from .latents import LatentNorm

        return LatentNorm
    if name == "DecodeSession":
        from .session import DecodeSession

        return DecodeSession
    if name == "DecodePath":
        from .session import DecodePath

        return DecodePath
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
