"""Configuration models: every knob of a worldstep run, validated before any work starts.

A config file has five sections (see ``configs/tiny.yaml``)::

    model:   name, checkpoint, architecture, height, width, fps, device, dtype, attention_backend
    rollout: chunk_size, num_steps, guidance_scale, context_frames, window_mode, flow_shift, negative_prompt
    cache:   page_size, num_pages, cpu_offload_pages
    decoder: warm_cache, latents_per_call, channels_last, cudnn_benchmark, onednn_conv, max_warm_streams,
             context_latents
    env:     max_windows, prompt, domain_id, image, action_width, simulator

Every model is frozen, rejects unknown keys and uses strict types: an integer knob refuses ``true`` and
``2.0``, a switch refuses the string ``"true"``. Every failure raises :class:`ConfigError` (a
``ValueError``) whose lines read ``<section>.<key> = <value>: must be <allowed range>``.
"""

from __future__ import annotations

import difflib
import importlib.resources
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "CONFIG_NAMES",
    "CacheConfig",
    "ConfigError",
    "DecoderConfig",
    "UnknownKeyError",
    "EnvConfig",
    "ModelConfig",
    "RolloutConfig",
    "WorldstepConfig",
    "load_config",
]

EMBEDDED_PREFIX = "embedded:"
_DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


class ConfigError(ValueError):
    """A config value or key is not allowed; the message names the key, the value and the allowed range."""


class UnknownKeyError(ConfigError, TypeError):
    """An unknown config key, e.g. a keyword argument of ``gym.make`` or ``make_env`` that no section has.

    Both a ``ConfigError`` and a ``TypeError``, as Python reports an unexpected keyword argument: callers
    that probe optional keywords (torchrl passes ``frameskip=`` and retries without it) read it as such.
    """


def unknown_key_message(key: str, allowed: list[str] | tuple[str, ...]) -> str:
    """``KEY: unknown key (unexpected keyword argument 'KEY'; did you mean 'NEAR'?); allowed keys: ...``."""
    near = difflib.get_close_matches(key.split(".")[-1], allowed, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"{key}: unknown key (unexpected keyword argument {key.split('.')[-1]!r}{hint}); allowed keys: " + \
        ", ".join(allowed)


# Messages for pydantic's error types, phrased as what the value must be.
_MUST_BE = {
    "int_type": "an integer (not a bool, float or string)",
    "float_type": "a number",
    "bool_type": "a boolean true/false (not a string or number)",
    "string_type": "a string",
    "dict_type": "a mapping",
    "model_type": "a mapping",
}


def _describe(error: dict[str, Any], owner: type[BaseModel] | None) -> str:
    key = ".".join(str(part) for part in error["loc"])
    kind, ctx = error["type"], error.get("ctx", {})
    nested = ctx.get("error")
    if isinstance(nested, ConfigError):  # a section's own __init__ already described it
        return "\n".join(f"{key}.{line}" if key else line for line in str(nested).splitlines())
    if kind == "value_error" and not key:  # a check across fields states its own message
        return str(nested or error["msg"])
    if kind == "missing":
        return f"{key}: required key is missing"
    if kind == "extra_forbidden":
        return unknown_key_message(key, list(owner.model_fields) if owner is not None else [])
    if kind == "value_error":
        must = str(ctx.get("error", error["msg"]))
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
        must = f"{sign[kind]} {next(iter(ctx.values()))}"
    elif kind == "literal_error":
        must = f"one of {ctx.get('expected', error['msg'])}"
    else:
        must = _MUST_BE.get(kind, error["msg"])
    return f"{key} = {error.get('input')!r}: must be {must}"


def _owner_of(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that holds the field at ``loc[:-1]`` (for listing allowed keys)."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


class _Config(BaseModel):
    """Frozen, strict, no unknown keys; validation errors come out as one :class:`ConfigError`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            lines = [_describe(e, _owner_of(type(self), e["loc"])) for e in exc.errors()]
            unknown = all(e["type"] == "extra_forbidden" for e in exc.errors())
            raise (UnknownKeyError if unknown else ConfigError)("\n".join(lines)) from None

    def replace(self, **changes: Any):
        """A validated copy with ``changes`` applied (the same rules as the constructor)."""
        return type(self)(**{**self.model_dump(), **changes})


NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]


class ModelConfig(_Config):
    """Which checkpoint to load and where to run it."""

    name: str
    """a label for reports and videos"""
    checkpoint: str
    """``embedded:<name>`` (built on first use from ``architecture``), a diffusers-layout directory, or a hub id"""
    architecture: dict[str, Any] | None = None
    """passed verbatim to the engine's checkpoint builder; required for ``embedded:`` checkpoints"""
    height: PositiveInt | None = None
    """frame height in pixels (None: the checkpoint's)"""
    width: PositiveInt | None = None
    """frame width in pixels (None: the checkpoint's)"""
    fps: PositiveInt | None = None
    """frames per second the model is conditioned on (None: the checkpoint's)"""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``"""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """weights and activations dtype (None: float32, the engine's default)"""
    attention_backend: Literal["sdpa", "flashinfer", "auto"] = "auto"
    """``sdpa`` runs anywhere, ``flashinfer`` uses paged kernels on CUDA, ``auto`` picks"""

    @field_validator("name", "checkpoint")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a non-empty string")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE_PATTERN.fullmatch(value):
            raise ValueError("one of 'auto', 'cpu', 'cuda', 'cuda:N'")
        return value

    @model_validator(mode="after")
    def _embedded_needs_architecture(self) -> ModelConfig:
        if self.checkpoint.startswith(EMBEDDED_PREFIX) and self.architecture is None:
            raise ValueError(f"architecture: required for checkpoint {self.checkpoint!r} (the builder's input)")
        return self

    @property
    def embedded_name(self) -> str | None:
        """``tiny`` for ``checkpoint: embedded:tiny``; None for a directory or hub id."""
        if self.checkpoint.startswith(EMBEDDED_PREFIX):
            return self.checkpoint[len(EMBEDDED_PREFIX) :]
        return None


class RolloutConfig(_Config):
    """How each window is generated (the engine's ``RolloutKnobs``)."""

    chunk_size: int = 4
    """actions (and pixel frames) per window; a multiple of 4 (the VAE's temporal compression), >= 4"""
    num_steps: PositiveInt = 4
    """denoising steps per window"""
    guidance_scale: Annotated[float, Field(ge=1.0)] = 1.0
    """text classifier-free guidance; 1 disables the unconditional stream"""
    context_frames: NonNegativeInt = 0
    """committed pixel frames kept in the KV cache behind the prompt; 0 keeps everything"""
    window_mode: Literal["kv", "chained"] = "kv"
    """``kv`` attends to committed K/V of past windows; ``chained`` conditions on the previous window's tail"""
    flow_shift: Annotated[float, Field(gt=0.0)] = 5.0
    """shift of the flow-matching sigma schedule"""
    negative_prompt: str = ""
    """text of the unconditional stream when guidance_scale > 1"""

    @field_validator("chunk_size")
    @classmethod
    def _chunk(cls, value: int) -> int:
        if value < 4 or value % 4:
            raise ValueError("a multiple of 4 and >= 4")
        return value


class CacheConfig(_Config):
    """The paged KV cache shared by every session of one loaded model."""

    page_size: PositiveInt = 16
    """tokens per page"""
    num_pages: PositiveInt = 512
    """pages in the device pool"""
    cpu_offload_pages: NonNegativeInt = 0
    """pages in the CPU pool sessions can be offloaded to"""


class DecoderConfig(_Config):
    """The warm streaming VAE decoder (the engine's ``DecoderOptions``)."""

    warm_cache: bool = True
    """keep each stream's causal-conv cache so a window decodes only its new latents"""
    latents_per_call: NonNegativeInt = 1
    """latents per decoder call; 0 decodes a window's latents in one call (larger peak memory)"""
    channels_last: bool = False
    """run the decoder in channels-last layout"""
    cudnn_benchmark: bool = False
    """set cudnn.benchmark around the decode"""
    onednn_conv: bool = False
    """on CPU, run the decoder's 3-D convs through oneDNN: several times faster, equal to ``vae.decode``
    within float32 rounding instead of bit for bit"""
    max_warm_streams: NonNegativeInt = 0
    """cap on streams holding a warm cache; 0 means no cap"""
    context_latents: PositiveInt = 8
    """latents re-decoded ahead of a window by a stream without a warm cache"""

    def to_options(self):
        """The engine's ``DecoderOptions`` with these values."""
        from worldstep.engine.vae import DecoderOptions

        return DecoderOptions(**self.model_dump())


class EnvConfig(_Config):
    """Episode defaults of the gymnasium env (each can be overridden per ``reset``)."""

    max_windows: PositiveInt = 32
    """windows per episode before truncation"""
    prompt: str = "A robot arm pushes a block across a table."
    """default text prompt"""
    domain_id: NonNegativeInt = 0
    """default embodiment domain (< the checkpoint's number of domains)"""
    image: str | None = None
    """path of the default first frame (None: a procedurally drawn scene, seeded per reset)"""
    action_width: PositiveInt | None = None
    """action dimensions the policy controls (<= the model's action_dim; None: all of them)"""
    simulator: str | None = None
    """gymnasium id of the simulator the model was trained on: resets without an image start from its first
    frame for the same seed, and ``worldstep rollout --truth`` steps it beside the model"""

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a non-empty string")
        return value


_SECTIONS = ("model", "rollout", "cache", "decoder", "env")


class WorldstepConfig(_Config):
    """A whole run: the five sections of a config YAML."""

    model: ModelConfig
    rollout: RolloutConfig = RolloutConfig()
    cache: CacheConfig = CacheConfig()
    decoder: DecoderConfig = DecoderConfig()
    env: EnvConfig = EnvConfig()

    @classmethod
    def from_dict(cls, data: Any) -> WorldstepConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"config = {type(data).__name__}: must be a mapping with sections {_SECTIONS}")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> WorldstepConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {str(path)!r} does not exist")
        with path.open() as f:
            return cls.from_dict(yaml.safe_load(f))

    def to_yaml(self, path: str | os.PathLike | None = None) -> str:
        """The config as YAML text (written to ``path`` when given); ``from_yaml`` reads it back equal."""
        text = yaml.safe_dump(self.model_dump(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    def with_overrides(self, **overrides: Any) -> WorldstepConfig:
        """A copy with overrides applied.

        Each key is either a section name with a mapping (``rollout={"num_steps": 2}``) or the name of a
        field of exactly one section (``num_steps=2``, ``num_pages=64``, ``max_windows=3``).
        """
        data = self.model_dump()
        for key, value in overrides.items():
            if key in _SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"{key} = {value!r}: must be a mapping of {key} keys")
                data[key].update(value)
                continue
            section = _section_of(key)
            data[section][key] = value
        return WorldstepConfig(**data)


def _section_of(key: str) -> str:
    for section in _SECTIONS:
        if key in WorldstepConfig.model_fields[section].annotation.model_fields:
            return section
    allowed = sorted(k for s in _SECTIONS for k in WorldstepConfig.model_fields[s].annotation.model_fields)
    raise UnknownKeyError(unknown_key_message(key, [*_SECTIONS, *allowed]))


CONFIG_NAMES = ("tiny", "cosmos3_edge", "pusher")
"""Configs shipped as package data (``worldstep.configs``)."""


def load_config(name_or_path: str | os.PathLike) -> WorldstepConfig:
    """A shipped config by name (``tiny``, ``cosmos3_edge``; ``-`` and ``_`` interchangeable) or a YAML path."""
    name = str(name_or_path)
    key = name.replace("-", "_").lower()
    if key in CONFIG_NAMES:
        with importlib.resources.as_file(importlib.resources.files("worldstep.configs") / f"{key}.yaml") as p:
            return WorldstepConfig.from_yaml(p)
    if name.endswith((".yaml", ".yml")) or Path(name).is_file():
        return WorldstepConfig.from_yaml(name)
    raise ConfigError(f"config = {name!r}: must be one of {CONFIG_NAMES} or a path to a .yaml file")
