"""Warm streaming Wan VAE decoder and first-frame encoder (see docs/internals.md, engine/vae).

`DecoderOptions` imports without torch (the YAML config uses it); everything else loads on first use.
"""

from __future__ import annotations

import importlib

from .options import DecoderOptions

_LAZY = {
    "BATCHED_DECODE_ATOL": ".jobs",
    "WHOLE_CLIP_DECODE_ATOL": ".bounds",
    "FUSED_DECODE_ATOL": ".bounds",
    "BF16_DECODE_ATOL": ".bounds",
    "BF16_DECODE_PSNR_DB": ".bounds",
    "WarmWanDecoder": ".decoder",
    "encode_first_frame": ".encoder",
    "encode_pixels": ".encoder",
    "preprocess_first_frame": ".encoder",
    "frames_from_pixels": ".frames",
    "frames_per_window": ".frames",
    "LatentNorm": ".latents",
    "DecodeSession": ".session",
    "DecodePath": ".session",
}

__all__ = ["DecoderOptions", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
