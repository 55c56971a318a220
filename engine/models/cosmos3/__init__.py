"""Cosmos3: the maths of a window, the loader and the checkpoint layout, and `model.Cosmos3WorldModel`, the engine
loop over them.

The package re-exports the settings models the YAML config uses, which import without torch; import the rest
from its module (``from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel``).
"""

from __future__ import annotations

from .architecture import FAMILY_SWITCHES, Cosmos3Architecture, PipelineOptions

__all__ = ["FAMILY_SWITCHES", "Cosmos3Architecture", "PipelineOptions"]
