"""The tiny Cosmos3 architecture (`configs/tiny.yaml`) the parity and size tests share, Edge- or Nano-shaped,
and its random-weight checkpoint in the real diffusers layout."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import yaml
from worldstep.engine.models.cosmos3 import Cosmos3Architecture
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint

TINY = yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]


def tiny_architecture(shape: str) -> Cosmos3Architecture:
    """`shape`: "edge" (relu2, Nemotron norms) or "nano" (SwiGLU, RMSNorm, q/k norm on text)."""
    return Cosmos3Architecture.of(TINY).shaped_like(shape)


def tiny_checkpoint(folder: Path, shape: str, seed: int = 3) -> Path:
    return build_checkpoint(folder, tiny_architecture(shape), seed=seed)
