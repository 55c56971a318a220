"""What one session adds to the device beyond the weights and the KV pool: the sdpa gathers, one layer's
activations and the warm decoder's feature maps, planned from a loaded model or from a config alone.

The product's CUDA plan (``cuda_plan``, ``worldstep info``) and ``bench gpu`` (``bench/gpu_memory.py``, which
explains each term and records the plan next to the peak it measured) share this one model.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATION_COPIES = 4  # MLP input, its relu2 output, the gate's square, the layer's output (reasoned)
DECODE_COPIES = 4  # a causal conv's input, output, cache and the upsampler's output (reasoned)
PLAN_MARGIN = 1.25
TEXT_TOKENS = 512  # a generous prompt: the bench's is shorter (the plan is made before any session opens)


def decoder_stage_elements(vae: dict, height: int, width: int) -> int:
    """Elements of one frame's feature map at the decoder's largest stage. The widest stages run at the lowest
    resolution: stage i has `base * dim_mult[i]` channels at 1/2**i of the decoder's output size (the frame
    over `patch_size`), and its upsampler briefly holds twice its channels at the next size up."""
    base = int(vae.get("decoder_base_dim") or vae.get("base_dim"))
    patch = int(vae.get("patch_size") or 1)
    h, w = height // patch, width // patch
    return max(2 * base * m * (h >> i) * (w >> i) for i, m in enumerate(vae.get("dim_mult", [1])))


@dataclass(frozen=True)
class SessionShape:
    """What one session's transient device memory depends on (from a loaded model or from a config alone)."""

    kv_bytes_per_token: int
    tokens_per_frame: int
    context_frames: int
    mlp_width: int
    itemsize: int
    vae: dict
    height: int
    width: int
    decoder_itemsize: int


def planned_session_bytes(shape: SessionShape, cfg: bool, decodes: bool = True) -> int:
    """Planned device bytes of one session (module docstring): gathers and activations per CFG stream, and the
    warm decoder's feature maps."""
    window = 4 * shape.tokens_per_frame + 16  # a 16-action window: 4 latent frames and their action tokens
    context = TEXT_TOKENS + shape.context_frames * (shape.tokens_per_frame + 4)
    gathers = shape.kv_bytes_per_token * (context + window)
    activations = ACTIVATION_COPIES * window * shape.mlp_width * shape.itemsize
    decode = 0
    if decodes:
        frames = int(shape.vae.get("scale_factor_temporal") or 4)  # one latent per decoder call
        stage = decoder_stage_elements(shape.vae, shape.height, shape.width)
        decode = DECODE_COPIES * frames * stage * shape.decoder_itemsize
    return (2 if cfg else 1) * (gathers + activations) + decode
