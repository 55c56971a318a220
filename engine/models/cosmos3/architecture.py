"""`Cosmos3Architecture`: what a random-weight Cosmos3 checkpoint is built from (the embedded models, the test
fixtures, the bench). Its ``transformer`` and ``vae`` blocks are diffusers constructor arguments, checked
against the constructors' own signatures, so an unknown key fails at config load, not at build time."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal

from pydantic import field_validator

from ...settings import PositiveInt, StrictModel

# The switches that tell the released families apart in a ``transformer`` block (the rest is size): Edge
# is a Nemotron-style backbone (relu2 MLP, Nemotron RMSNorm, no text q/k norm, a k-norm on text keys seen
# by generation queries); Nano is Qwen3-style (SwiGLU MLP, RMSNorm, q/k norm on text, no extra k-norm) --
# diffusers' `Cosmos3OmniTransformer` defaults are Nano's.
FAMILY_SWITCHES: dict[str, dict[str, Any]] = {
    "edge": {"hidden_act": "relu2", "qk_norm_for_text": False, "use_und_k_norm_for_gen": True},
    "nano": {"hidden_act": "silu", "qk_norm_for_text": True, "use_und_k_norm_for_gen": False},
}
Family = Literal["edge", "nano"]


# The constructors' arguments in diffusers 0.42.1 (the pinned release), written out so that a config loads without
# importing diffusers and torch (a config error comes out at once); `constructor_keys` reads them off the installed
# classes, and tests/test_sdk_config.py checks the two agree.
CONSTRUCTOR_KEYS: dict[str, frozenset[str]] = {
    "transformer": frozenset({
        "action_dim", "action_gen", "attention_bias", "attention_dropout", "base_fps", "dtype", "enable_fps_modulation",
        "head_dim", "hidden_act", "hidden_size", "intermediate_size", "latent_channel", "latent_patch_size",
        "num_attention_heads", "num_embodiment_domains", "num_hidden_layers", "num_key_value_heads",
        "patch_latent_dim", "qk_norm_for_text", "rms_norm_eps", "rope_axes_dim", "rope_scaling", "rope_theta",
        "sound_dim", "sound_gen", "sound_latent_fps", "timestep_scale", "unified_3d_mrope_reset_spatial_ids",
        "unified_3d_mrope_temporal_modality_margin", "use_und_k_norm_for_gen", "vocab_size"}),
    "vae": frozenset({
        "attn_scales", "base_dim", "decoder_base_dim", "dim_mult", "dropout", "in_channels", "is_residual",
        "latents_mean", "latents_std", "num_res_blocks", "out_channels", "patch_size", "scale_factor_spatial",
        "scale_factor_temporal", "temperal_downsample", "z_dim"}),
}


@cache
def constructor_keys(kind: str) -> frozenset[str]:
    """The installed diffusers class's constructor arguments (imports diffusers and torch)."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    cls = {"transformer": Cosmos3OmniTransformer, "vae": AutoencoderKLWan}[kind]
    return frozenset(inspect.signature(cls.__init__).parameters) - {"self"}


class PipelineOptions(StrictModel):
    """`Cosmos3OmniPipeline` options a checkpoint is saved with."""

    default_use_system_prompt: bool = False
    use_native_flow_schedule: bool = True


class Cosmos3Architecture(StrictModel):
    """A Cosmos3 checkpoint's shape: diffusers constructor arguments of its transformer and VAE, its pipeline
    options, and the frame size and fps it is meant for."""

    transformer: dict[str, Any]
    """`Cosmos3OmniTransformer` constructor arguments"""
    vae: dict[str, Any]
    """`AutoencoderKLWan` constructor arguments (random latent statistics when none are given)"""
    pipeline: PipelineOptions = PipelineOptions()
    height: PositiveInt | None = None
    width: PositiveInt | None = None
    fps: PositiveInt | None = None

    @field_validator("transformer", "vae")
    @classmethod
    def _constructor_arguments(cls, value: dict[str, Any], info) -> dict[str, Any]:
        unknown = sorted(set(value) - CONSTRUCTOR_KEYS[info.field_name])
        if unknown:
            raise ValueError(f"constructor arguments of the diffusers class; unknown: {unknown}")
        return value

    @classmethod
    def of(cls, value: Cosmos3Architecture | Mapping[str, Any]) -> Cosmos3Architecture:
        """An architecture from itself or a mapping (a YAML block), converted at the API boundary."""
        return value if isinstance(value, cls) else cls(**dict(value))

    def shaped_like(self, family: Family) -> Cosmos3Architecture:
        """A copy with the transformer switches of ``family`` (``edge`` or ``nano``), sizes kept."""
        if family not in FAMILY_SWITCHES:
            raise ValueError(f"family={family!r} is invalid; allowed: {sorted(FAMILY_SWITCHES)}")
        return self.replace(transformer={**self.transformer, **FAMILY_SWITCHES[family]})

    @property
    def media(self) -> dict[str, int]:
        """The frame size and fps the checkpoint records in its worldstep.json."""
        return {k: v for k, v in (("height", self.height), ("width", self.width), ("fps", self.fps)) if v}
