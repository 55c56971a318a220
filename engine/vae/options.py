"""The warm streaming decoder's knobs, validated before any work starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import PlainValidator

from ..checks import check_int
from ..settings import NonNegativeInt, PositiveInt, StrictModel

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")


def _auto_or_bool(value: object) -> bool | str:
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    raise ValueError("a boolean true/false or 'auto' (not another string or a number)")


def _dtype_name(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value in ("auto", *DTYPES)):
        return value
    raise ValueError("one of 'auto', " + ", ".join(repr(d) for d in DTYPES) + " or null (the VAE's own dtype)")


# A switch that is on, off, or "auto": decided by the decoder's device (`resolve_switch`).
AutoSwitch = Annotated[bool | Literal["auto"], PlainValidator(_auto_or_bool)]
DecoderDtype = Annotated[Literal["auto", "float32", "bfloat16", "float16"] | None, PlainValidator(_dtype_name)]


def on_cuda(device: torch.device) -> bool:
    return str(device).split(":")[0] == "cuda"


def resolve_switch(value: bool | str, device: torch.device) -> bool:
    """An `AutoSwitch` for a decoder on `device`: "auto" is on for CUDA, off elsewhere."""
    return on_cuda(device) if value == "auto" else bool(value)


def resolve_switches(options: DecoderOptions, device: torch.device) -> tuple[bool, bool, bool]:
    """`channels_last`, `cudnn_benchmark` and `fused` of `options` decided for a decoder on `device`."""
    return tuple(resolve_switch(getattr(options, k), device) for k in ("channels_last", "cudnn_benchmark", "fused"))


def resolve_dtype(value: str | None, device: torch.device, vae_dtype: torch.dtype) -> torch.dtype:
    """The dtype a decoder on `device` runs in: "auto" is bfloat16 on CUDA and float32 elsewhere; None is the
    VAE's own."""
    import torch  # here: the YAML config imports DecoderOptions without torch

    if value is None:
        return vae_dtype
    if value == "auto":
        return torch.bfloat16 if on_cuda(device) else torch.float32
    return getattr(torch, value)


class DecoderOptions(StrictModel):
    """Switches of `WarmWanDecoder`; the YAML config's ``decoder`` section is this model.

    Attributes:
        warm_cache: keep each session's causal-conv cache so a window decodes only its new latents
            (within float32 rounding of one whole-clip decode). Off: every window re-decodes
            `context_latents` of context from an empty cache (an approximation, ~(K + w) / w slower).
        latents_per_call: latents per decoder call on steady windows. 1 issues exactly
            `vae.decode`'s decoder calls (frames within `WHOLE_CLIP_DECODE_ATOL` of one whole-clip
            decode and identical for any window pattern; smallest transient peak). 0 decodes a whole
            window per call: equal within rounding (~1e-6) for a transient peak that grows with it.
            A session's first window (fresh or re-decoded behind its context) always runs one
            latent per call, whatever this says. Check it against the window with
            `validate_for_window`.
        channels_last: run the decoder on a channels-last copy of its weights and activations
            (the shared VAE keeps its layout; the copy doubles the decoder's weight memory). "auto" (the
            default): on for CUDA, where cuDNN's channels-last kernels run bf16 convs on tensor cores without
            layout transposes; off on CPU (no gain there).
        onednn_conv: on a CPU, decode float32 through the fast path of a private copy of the decoder
            (`engine/vae/perf.py`): every 3-D conv through oneDNN with the spatial padding inside the
            conv (torch sends the small per-latent convs of a streaming decode to its reference kernel,
            `slow_conv3d`, 3-10x slower at these shapes), and the RMS norm as one sum of squares instead
            of `F.normalize`'s strided reduction. Sums run in another order, so frames equal
            `vae.decode`'s within 1e-4 (measured 5.4e-6) before uint8 quantisation. No effect on CUDA.
        cudnn_benchmark: set `torch.backends.cudnn.benchmark` around each decode only, restored
            afterwards (also when the decode raises). The flag is process-global: concurrent
            decodes from several threads see each other's setting while they overlap. "auto" (the
            default): on for CUDA (a streaming decode repeats a handful of conv shapes, so the search pays
            once), off on CPU (no effect there).
        fused: the device fast path of a private copy of the decoder (`engine/vae/perf.py`): each causal
            conv pads space inside the convolution instead of `F.pad`-copying its input, and every RMS norm
            (with the SiLU that follows it) is one `torch.compile`d kernel, statistics in float32. "auto" (the
            default): on for CUDA; off on CPU, where `onednn_conv` is the fast path (True runs this path on
            a CPU too, compiled by inductor's C++ backend: what the tests do). Frames equal `vae.decode`'s
            in the same dtype within `FUSED_DECODE_ATOL` (docs/exactness.md).
        max_warm_sessions: warm caches per decoder (0 = no cap). A session that starts its first
            window while the cap is reached stays stateless for its whole life. The cap counts
            sessions, not bytes: size it from `cache_bytes` at the served resolution and dtype.
        batch_sessions: decode the windows of a step's sessions in one set of decoder calls, their causal-conv
            caches stacked along the batch (sessions of different latent grids, window lengths or cache layouts
            never share a call): one call per group instead of one per session. Kernels may round differently
            at another batch size, so frames are within `BATCHED_DECODE_ATOL` of the per-session path (at most
            1 uint8 level on at most 1e-3 of values; docs/exactness.md). Off: each session runs its own calls,
            and its frames are bit-identical to a single-env run's given the same latents.
        dtype: the dtype the decoder runs in: "auto" (the default) is bfloat16 on CUDA and float32 on CPU
            (where bf16 convs are slower); None the VAE's own. Another dtype than the VAE's runs on a private
            copy of the decoder in that dtype (the shared VAE keeps its weights); bfloat16 halves the
            cache and the bytes every conv and elementwise pass moves on a GPU, at bf16 rounding: measured
            against float32 in docs/exactness.md. The de-normalisation and `post_quant_conv` run in the
            wider of the VAE's dtype and this one (float32 for a float32 VAE), a pointwise prelude.
        context_latents: latents a session retains and re-decodes ahead of a window that has no
            warm cache (stateless sessions, or a warm session whose cache was dropped by a failed
            decode). At least 1: a later window's first latent needs a predecessor to yield its 4
            frames.
    """

    warm_cache: bool = True
    latents_per_call: NonNegativeInt = 1
    channels_last: AutoSwitch = "auto"
    cudnn_benchmark: AutoSwitch = "auto"
    fused: AutoSwitch = "auto"
    onednn_conv: bool = False
    max_warm_sessions: NonNegativeInt = 0
    context_latents: PositiveInt = 8
    batch_sessions: bool = False
    dtype: DecoderDtype = "auto"

    def validate_for_window(self, latents_per_window: int) -> None:
        """Raise ValueError when `latents_per_call` exceeds a window's latent frames.

        Args:
            latents_per_window: latent frames of a full (not the short last) window.
        """
        check_int("latents_per_window", latents_per_window, 1)
        if self.latents_per_call > latents_per_window:
            raise ValueError(
                f"latents_per_call = {self.latents_per_call} is larger than a window's "
                f"{latents_per_window} latents; allowed 0..{latents_per_window} (0 = a whole window per call)"
            )
