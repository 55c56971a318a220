"""The engine's config sections: the validated models a loaded model takes (``cache``, ``runtime``) and each
session takes (``rollout``); the decoder's is `vae.DecoderOptions`. The YAML config's sections are these same
models (`worldstep.WorldstepConfig` composes them), so a default is defined once and a bad value is explained
the same way from code and YAML. No torch here: the config imports without it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from .checks import MAX_PROMPT_CHARS
from .settings import ConfigError, NonNegativeInt, PositiveInt, StrictModel, UnknownKeyError, unknown_key_message

WindowMode = Literal["kv", "chained"]
ViewPoint = Literal["ego_view", "third_person_view", "wrist_view", "concat_view"]
TEMPORAL_COMPRESSION = 4
"""Pixel frames per latent frame of the Wan VAE family Cosmos3 uses: a window's actions come in fours."""


class RolloutKnobs(StrictModel):
    """Per-session rollout settings (YAML section ``rollout``); a bad value raises `ConfigError` naming it."""

    chunk_size: int = 4
    """actions (and pixel frames) per window; a multiple of 4 (the VAE's temporal compression), >= 4"""
    num_steps: PositiveInt = 4
    """denoising steps per window"""
    guidance_scale: Annotated[float, Field(ge=1.0, allow_inf_nan=False)] = 1.0
    """text classifier-free guidance; 1 disables the unconditional stream"""
    context_frames: NonNegativeInt = 0
    """committed LATENT frames (4 pixel frames each) kept in the KV cache behind the prompt; 0 keeps all"""
    window_mode: WindowMode = "kv"
    """``kv`` attends to committed K/V of past windows; ``chained`` conditions on the previous window's tail"""
    flow_shift: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 5.0
    """shift of the flow-matching sigma schedule"""
    negative_prompt: str = ""
    """text of the unconditional stream when guidance_scale > 1"""
    view_point: ViewPoint | None = None
    """camera framing the JSON caption states (None: the embodiment's default view point, else ego_view)"""
    decode: bool = True
    """decode each window to frames (off: latents only, e.g. for planners scoring in latent space)"""
    context_noise: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.0
    """flow-matching level at which a committed window's latents are noised before the commit pass, given to the
    model as their timestep (kv mode; a model fine-tuned with context noise, ``--context-level``); 0: committed
    clean with no timestep, as released Cosmos3 checkpoints expect"""

    @field_validator("negative_prompt")
    @classmethod
    def _negative_prompt(cls, value: str) -> str:
        if len(value) > MAX_PROMPT_CHARS:  # checked here, where the knobs enter, not again at every open
            raise ValueError(f"a string of at most {MAX_PROMPT_CHARS} characters (got {len(value)})")
        return value

    @field_validator("chunk_size")
    @classmethod
    def _chunk(cls, value: int) -> int:
        if value < TEMPORAL_COMPRESSION or value % TEMPORAL_COMPRESSION:
            raise ValueError(f"a multiple of {TEMPORAL_COMPRESSION} and >= {TEMPORAL_COMPRESSION}")
        return value

    @model_validator(mode="after")
    def _context_noise_in_kv_mode(self) -> RolloutKnobs:
        if self.context_noise > 0 and self.window_mode != "kv":
            raise ValueError(f"context_noise={self.context_noise} is invalid with window_mode="
                             f"{self.window_mode!r}; allowed: 0 (only kv mode commits windows)")
        return self

    @property
    def latents_per_window(self) -> int:
        return self.chunk_size // TEMPORAL_COMPRESSION

    @property
    def uses_cfg(self) -> bool:
        return self.guidance_scale > 1.0


class CacheConfig(StrictModel):
    """The paged KV cache shared by every session of one loaded model (YAML section ``cache``)."""

    page_size: PositiveInt = 16
    """tokens per page"""
    num_pages: PositiveInt = 512
    """pages in the device pool"""
    cpu_offload_pages: NonNegativeInt = 0
    """pages in the CPU pool sessions can be offloaded to"""


class RuntimeConfig(StrictModel):
    """How a loaded model runs: its frame size and fps, attention backend and the loop's switches (the YAML
    ``model`` section adds the checkpoint, device and dtype to these)."""

    name: str | None = None
    """a label for reports and videos (None: the checkpoint folder's name)"""
    height: PositiveInt | None = None
    """frame height in pixels (None: the checkpoint's)"""
    width: PositiveInt | None = None
    """frame width in pixels (None: the checkpoint's)"""
    fps: PositiveInt | None = None
    """frames per second the model is conditioned on (None: the checkpoint's)"""
    attention_backend: Literal["sdpa", "flashinfer", "auto"] = "auto"
    """``sdpa`` runs anywhere, ``flashinfer`` uses paged kernels on CUDA, ``auto`` picks"""
    cuda_graphs: bool = False
    """replay each window's denoise steps and commit from CUDA graphs captured once per (window geometry, batch)
    (CUDA with ``sdpa`` only)"""
    decode_after_denoise: bool = True
    """queue a window's decode as soon as it is denoised, its commit beside it (False: decode after the commit)"""
    overlap_decode: bool | None = None
    """split a group of decoding sessions in halves so one half's decode overlaps the other's denoise (None: on
    for CUDA, off on a CPU, where nothing can overlap)"""


def sections(cache: CacheConfig | None, runtime: RuntimeConfig | None,
             settings: dict) -> tuple[CacheConfig, RuntimeConfig]:
    """The cache and runtime sections, with ``settings`` (fields of either, by name) applied over them: the one way
    a caller without the section models passes ``num_pages=64, height=32``. An unknown name is an `UnknownKeyError`
    (a TypeError) listing the allowed ones."""
    cache, runtime = cache or CacheConfig(), runtime or RuntimeConfig()
    allowed = (*CacheConfig.model_fields, *RuntimeConfig.model_fields)
    for key, value in settings.items():
        if key not in allowed:
            raise UnknownKeyError(unknown_key_message(key, allowed))
        if key in CacheConfig.model_fields:
            cache = _set(cache, key, value)
        else:
            runtime = _set(runtime, key, value)
    return cache, runtime


def _set(section: StrictModel, key: str, value) -> StrictModel:
    """``section`` with ``key`` set; a bad value is a `ConfigError` spelled as the keyword argument was
    (``cuda_graphs='yes' is invalid; allowed: True or False``)."""
    try:
        return section.replace(**{key: value})
    except ConfigError as err:
        is_switch = type(section).model_fields[key].annotation in (bool, "bool")
        allowed = "True or False" if is_switch else str(err).partition(": must be ")[2] or str(err)
        raise ConfigError(f"{key}={value!r} is invalid; allowed: {allowed}") from None
