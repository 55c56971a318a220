"""Warm streaming Wan VAE decoder and first-frame encoder (see docs/internals.md, engine/vae).

The package re-exports what imports without torch (the YAML config's `DecoderOptions`, the measured decode
bounds); import the rest from its module (``from worldstep.engine.vae.decoder import WarmWanDecoder``).
"""

from __future__ import annotations

from .bounds import BF16_DECODE_ATOL, BF16_DECODE_PSNR_DB, FUSED_DECODE_ATOL, WHOLE_CLIP_DECODE_ATOL
from .options import DecoderOptions

__all__ = ["BF16_DECODE_ATOL", "BF16_DECODE_PSNR_DB", "DecoderOptions", "FUSED_DECODE_ATOL",
           "WHOLE_CLIP_DECODE_ATOL"]
