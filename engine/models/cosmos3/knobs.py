"""`RolloutKnobs`: how each window of a session is generated. The YAML config's ``rollout`` section is
this model, so the engine and the config validate a knob once, the same way."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ...settings import NonNegativeInt, PositiveInt, StrictModel

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
