"""An embodiment: which robot an action chunk belongs to, and the exact width of its raw actions.

A Cosmos3 action head has one `DomainAwareLinear` row per domain id; an embodiment names a domain and fixes
the width of its raw actions (zero-padded to the model's `action_dim` inside the engine, as the pipeline
does). `embodiments.py` builds the registry of every known one from diffusers' own tables.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..checks import check_int
from .action_convention import ActionConvention, convention_from_json, convention_to_json


class NormalizationKind(str, Enum):
    """How raw actions were mapped before training (cosmos-framework's `action_normalization`)."""

    QUANTILE = "quantile"  # per dimension, [q01, q99] -> [-1, 1]
    MEAN_STD = "meanstd"  # per dimension, (a - mean) / std
    NONE = "none"  # raw values


class EmbodimentSource(str, Enum):
    """Where an embodiment's name, id and width come from."""

    DIFFUSERS = "diffusers"  # the installed diffusers' pipeline tables
    COSMOS_FRAMEWORK = "cosmos-framework"  # NVIDIA's training framework, not in diffusers
    CHECKPOINT = "checkpoint"  # a checkpoint folder's worldstep.json


@functools.cache
def diffusers_tables() -> tuple[dict[str, int], dict[str, int], tuple[str, ...]]:
    """(name -> domain id, name -> raw width, view points) exactly as the installed diffusers defines them.

    The tables are module-level names of `pipeline_cosmos3_omni` with no public alias; reading them
    here, in one place, is what keeps worldstep's embodiments equal to the pipeline's validation.
    """
    from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as omni

    return (dict(omni._EMBODIMENT_TO_DOMAIN_ID), dict(omni._EMBODIMENT_TO_RAW_ACTION_DIM),
            tuple(omni._ACTION_VIEWPOINT_TEMPLATES))


def view_points() -> tuple[str, ...]:
    """The view points the action caption knows (diffusers' `_ACTION_VIEWPOINT_TEMPLATES` keys)."""
    return diffusers_tables()[2]


@dataclass(frozen=True)
class Embodiment:
    """One embodiment: a name, its domain id, the exact width of its raw actions and its defaults.

    `default_fps` is the rate its actions were recorded at in training (None: unpublished), the fps
    of the temporal RoPE and of recorded videos; `default_view_point` frames the caption;
    `normalization` says how its actions were scaled in training (None: unpublished); `convention` says
    what an action row means (absolute or delta, its layout, the source; None: unknown, and then no robot
    state is offered, `action_convention.py`).
    """

    name: str
    domain_id: int
    raw_width: int
    default_fps: float | None = None
    default_view_point: str = "ego_view"
    normalization: NormalizationKind | None = None
    source: EmbodimentSource = EmbodimentSource.DIFFUSERS
    convention: ActionConvention | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"embodiment name={self.name!r} is invalid; allowed: a non-empty string")
        check_int(f"embodiment {self.name!r}: domain_id", self.domain_id, 0)
        check_int(f"embodiment {self.name!r}: raw_width", self.raw_width, 1)
        fps = self.default_fps
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float))
                                or not math.isfinite(fps) or fps <= 0):
            raise ValueError(f"embodiment {self.name!r}: default_fps={fps!r} is invalid; allowed: a number > 0 "
                             "or None")
        if fps is not None:
            object.__setattr__(self, "default_fps", float(fps))
        if self.default_view_point not in view_points():
            raise ValueError(f"embodiment {self.name!r}: default_view_point={self.default_view_point!r} is "
                             f"invalid; allowed: {list(view_points())}")
        object.__setattr__(self, "normalization", None if self.normalization is None
                           else _enum(NormalizationKind, self.normalization, f"embodiment {self.name!r}: "
                                      "normalization"))
        object.__setattr__(self, "source", _enum(EmbodimentSource, self.source, f"embodiment {self.name!r}: source"))
        if self.convention is not None and (not isinstance(self.convention, ActionConvention)
                                            or self.convention.width != self.raw_width):
            raise ValueError(f"embodiment {self.name!r}: convention={self.convention!r} is invalid; allowed: None "
                             f"or an ActionConvention of width {self.raw_width}")

    def describe(self) -> str:
        return f"{self.name!r} (domain {self.domain_id}, {self.raw_width}-wide actions)"


def _enum(kind: type[Enum], value: Any, field: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{field}={value!r} is invalid; allowed: {[m.value for m in kind]}") from None


_JSON_KEYS = {"name", "domain_id", "raw_width", "fps", "view_point", "normalization", "convention"}


def embodiment_from_json(entry: Any) -> Embodiment:
    """An `Embodiment` from one `worldstep.json` entry (unknown keys refused)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"worldstep.json: embodiment entry {entry!r} is invalid; allowed: an object with keys "
                         f"{sorted(_JSON_KEYS)}")
    unknown = sorted(set(entry) - _JSON_KEYS)
    if unknown:
        raise ValueError(f"worldstep.json: embodiment entry has unknown keys {unknown}; allowed: {sorted(_JSON_KEYS)}")
    missing = sorted({"name", "domain_id", "raw_width"} - set(entry))
    if missing:
        raise ValueError(f"worldstep.json: embodiment entry {dict(entry)!r} lacks {missing}")
    return Embodiment(
        name=entry["name"], domain_id=entry["domain_id"], raw_width=entry["raw_width"],
        default_fps=entry.get("fps"), default_view_point=entry.get("view_point", "ego_view"),
        normalization=entry.get("normalization"), source=EmbodimentSource.CHECKPOINT,
        convention=None if entry.get("convention") is None else convention_from_json(
            entry["convention"], check_int(f"embodiment {entry['name']!r}: raw_width", entry["raw_width"], 1),
            f"worldstep.json: embodiment {entry['name']!r}: convention"),
    )


def embodiment_to_json(embodiment: Embodiment) -> dict[str, Any]:
    """The `worldstep.json` entry of an embodiment (inverse of `embodiment_from_json`)."""
    entry: dict[str, Any] = {"name": embodiment.name, "domain_id": embodiment.domain_id,
                             "raw_width": embodiment.raw_width, "view_point": embodiment.default_view_point}
    if embodiment.default_fps is not None:
        entry["fps"] = embodiment.default_fps
    if embodiment.normalization is not None:
        entry["normalization"] = embodiment.normalization.value
    if embodiment.convention is not None:
        entry["convention"] = convention_to_json(embodiment.convention)
    return entry
