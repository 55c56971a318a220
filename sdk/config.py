"""Configuration models: every knob of a worldstep run, validated before any work starts.

A config file has five sections (see ``configs/tiny.yaml``)::

    model:   name, height, width, fps, attention_backend, cuda_graphs, decode_after_denoise, overlap_decode
             (the engine's ``RuntimeConfig``), checkpoint, architecture, device, dtype,
             trained_horizon
    rollout: chunk_size, num_steps, guidance_scale, context_frames, window_mode, flow_shift, negative_prompt,
             view_point, decode                                  (the engine's ``RolloutKnobs``)
    cache:   page_size, num_pages, cpu_offload_pages                (the engine's ``CacheConfig``)
    decoder: warm_cache, latents_per_call, channels_last, cudnn_benchmark, fused, onednn_conv, max_warm_sessions,
             context_latents, dtype                              (the engine's ``DecoderOptions``)
    env:     max_windows, prompt, domain_id, embodiment, resolution_tier, image, action_width, simulator,
             observation

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
from typing import Any, Literal

import yaml
from pydantic import field_validator, model_validator
from worldstep.engine.config import CacheConfig, RolloutKnobs, RuntimeConfig
from worldstep.engine.models.cosmos3 import Cosmos3Architecture
from worldstep.engine.settings import (
    ConfigError,
    NonNegativeInt,
    PositiveInt,
    StrictModel,
    UnknownKeyError,
)
from worldstep.engine.vae import DecoderOptions

__all__ = [
    "CONFIG_NAMES",
    "CacheConfig",
    "ConfigError",
    "DecoderOptions",
    "UnknownKeyError",
    "EnvConfig",
    "ModelConfig",
    "RolloutKnobs",
    "WorldstepConfig",
    "load_config",
]

EMBEDDED_PREFIX = "embedded:"
_DEVICE_PATTERN = re.compile(r"auto|(cpu|cuda)(:\d+)?")


class ModelConfig(RuntimeConfig):
    """Which checkpoint to load and where to run it; the engine's `RuntimeConfig` (frame size, fps, attention
    backend, the loop's switches) is this model's base, so the engine takes the section as it is."""

    name: str
    """a label for reports and videos"""
    checkpoint: str
    """``embedded:<name>`` (built on first use from ``architecture``), a diffusers-layout directory, or a hub id"""
    architecture: Cosmos3Architecture | None = None
    """the engine's checkpoint builder input; required for ``embedded:`` checkpoints"""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` (``cpu:N`` is the same CPU), ``cuda`` or ``cuda:N``"""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """weights and activations dtype (None: float32, the engine's default)"""
    trained_horizon: PositiveInt | None = None
    """windows the checkpoint's training clips cover (the ``horizon`` trust signal, ``worldstep.trust``); overrides
    the checkpoint's ``worldstep.json`` ``trained_horizon_windows``; None: that value, else no ``horizon``"""

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
            raise ValueError("one of 'auto', 'cpu', 'cpu:N', 'cuda', 'cuda:N'")
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


class EnvConfig(StrictModel):
    """Episode defaults of the gymnasium env (each can be overridden per ``reset``)."""

    max_windows: PositiveInt = 32
    """windows per episode before truncation"""
    prompt: str = "A robot arm pushes a block across a table."
    """default text prompt"""
    domain_id: NonNegativeInt | None = None
    """default action-head domain: an id standing for one embodiment of one width; None: the embodiment's"""
    embodiment: str | None = None
    """embodiment name (``droid_lerobot``, ``pusht``, ...: the README's embodiment table); it fixes the domain, the
    exact action width, the fps and the view point; None: ``domain_id``'s embodiment"""
    resolution_tier: Literal[256, 480, 704, 720, "auto"] | None = None
    """the pipeline's first-frame canvas (tier, aspect bin, padding cropped from the frames); None: the model's
    frame size, the first frame cover-cropped"""
    image: str | None = None
    """path of the default first frame (None: a procedurally drawn scene, seeded per reset)"""
    action_width: PositiveInt | None = None
    """action dimensions the policy controls (<= the model's action_dim; None: all of them)"""
    simulator: str | None = None
    """gymnasium id of the simulator the model was trained on: resets without an image start from its first
    frame for the same seed, and ``worldstep rollout --truth`` steps it beside the model"""
    observation: Literal["frames", "latents"] = "frames"
    """what a step returns: the window's decoded ``frames``, or its ``latents`` with no decode (``render()`` decodes
    on demand; docs/observations.md)"""

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a non-empty string")
        return value


_SECTIONS = ("model", "rollout", "cache", "decoder", "env")


class WorldstepConfig(StrictModel):
    """A whole run: the five sections of a config YAML."""

    model: ModelConfig
    rollout: RolloutKnobs = RolloutKnobs()
    cache: CacheConfig = CacheConfig()
    decoder: DecoderOptions = DecoderOptions()
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

        Each key is a section name with a mapping (``rollout={"num_steps": 2}``), a dotted ``SECTION.KEY``
        (``**{"decoder.dtype": "bfloat16"}``, the form ``--set`` and error messages use), or the name of a field
        (``num_steps=2``, ``num_pages=64``, ``max_windows=3``; a name two sections share, ``dtype``, is the
        first's: ``model``).
        """
        data = self.model_dump()
        by_section = _by_section(overrides)
        env = by_section.get("env", {})
        if "embodiment" in env and "domain_id" not in env:
            data["env"]["domain_id"] = None  # a new embodiment brings its own domain id
        for section, values in by_section.items():
            data[section].update(values)
        return WorldstepConfig(**data)


def _fields(section: str) -> dict[str, Any]:
    return WorldstepConfig.model_fields[section].annotation.model_fields


def _by_section(overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Overrides grouped as ``{section: {field: value}}``, whichever of the three forms each key has."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{key} = {value!r}: must be a mapping of {key} keys")
            grouped.setdefault(key, {}).update(value)
            continue
        section, dot, field = key.partition(".")
        if dot and section in _SECTIONS and field and "." not in field:
            grouped.setdefault(section, {})[field] = value  # an unknown field is named by the section's model
            continue
        if dot:
            raise UnknownKeyError(_unknown_key(key))
        grouped.setdefault(_section_of(key), {})[key] = value
    return grouped


def check_override_keys(overrides: dict[str, Any]) -> None:
    """UnknownKeyError (a TypeError and a ConfigError) naming the first key that is no section, ``SECTION.KEY`` or
    field name, whatever its value (a key given as None is checked too)."""
    for key in overrides:
        section, dot, field = key.partition(".")
        if key in _SECTIONS or (dot and section in _SECTIONS and field in _fields(section)):
            continue
        if dot:
            raise UnknownKeyError(_unknown_key(key))
        _section_of(key)


def _section_of(key: str) -> str:
    for section in _SECTIONS:
        if key in _fields(section):
            return section
    raise UnknownKeyError(_unknown_key(key))


def _unknown_key(key: str) -> str:
    """``KEY: unknown key (...; did you mean 'SECTION.NEAR'?); allowed keys: SECTION.KEY, ...``: each key once,
    with its section (a bare name two sections share would read as a duplicate)."""
    dotted = [f"{s}.{k}" for s in _SECTIONS for k in _fields(s)]
    names = {k: [d for d in dotted if d.endswith(f".{k}")] for s in _SECTIONS for k in _fields(s)}
    near = difflib.get_close_matches(key.rpartition(".")[2], list(names), n=1)
    hint = f"; did you mean {' or '.join(repr(d) for d in names[near[0]])}?" if near else ""
    return (f"{key}: unknown key (unexpected keyword argument {key!r}{hint}); allowed: a section "
            f"({', '.join(_SECTIONS)}) with a mapping, SECTION.KEY or a KEY of one section: {', '.join(dotted)}")


CONFIG_NAMES = ("tiny", "cosmos3_edge", "cosmos3_nano", "pusher")
"""Configs shipped as package data (``worldstep.configs``)."""


def _shipped_yaml(name: str) -> dict[str, Any]:
    with importlib.resources.as_file(importlib.resources.files("worldstep.configs") / f"{name}.yaml") as p:
        return yaml.safe_load(p.read_text())


def shipped_env_section(name: str) -> EnvConfig:
    """A shipped config's ``env`` section alone (validated; cheap: no model code is imported)."""
    return EnvConfig(**(_shipped_yaml(name).get("env") or {}))


def load_config(name_or_path: str | os.PathLike) -> WorldstepConfig:
    """A shipped config by name (``tiny``, ``cosmos3_edge``, ``cosmos3_nano``; ``-`` and ``_`` interchangeable) or a
    YAML path."""
    name = str(name_or_path)
    key = name.replace("-", "_").lower()
    if key in CONFIG_NAMES:
        return WorldstepConfig.from_dict(_shipped_yaml(key))
    if name.endswith((".yaml", ".yml")) or Path(name).is_file():
        return WorldstepConfig.from_yaml(name)
    raise ConfigError(f"config = {name!r}: must be one of {CONFIG_NAMES} or a path to a .yaml file")
