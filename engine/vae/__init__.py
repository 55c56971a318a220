"""Warm streaming Wan VAE decoder and first-frame encoder (see docs/internals.md, engine/vae)."""

from .decoder import WHOLE_STREAM_DECODE_ATOL, WarmWanDecoder
from .encoder import encode_first_frame, preprocess_first_frame
from .frames import frames_from_pixels, frames_per_window
from .options import DecoderOptions
from .stream import DecodeStream, StreamPath

__all__ = [
    "WHOLE_STREAM_DECODE_ATOL",
    "DecodeStream",
    "DecoderOptions",
    "StreamPath",
    "WarmWanDecoder",
    "encode_first_frame",
    "frames_from_pixels",
    "frames_per_window",
    "preprocess_first_frame",
]
