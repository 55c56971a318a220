"""Embodiments: which robot an action chunk belongs to, as the released Cosmos3 models define it.

A Cosmos3 action head has one `DomainAwareLinear` row per domain id; an embodiment names a domain
and fixes the exact width of its raw actions (zero-padded to the model's `action_dim` inside the
engine, as the pipeline does). The names, ids and widths come from the installed diffusers'
`pipeline_cosmos3_omni` tables, read at import time, never copied. worldstep adds what those
tables leave out, each with its source:

* `default_fps`, `default_view_point`, `normalization`: the defaults of the embodiment's dataset
  class in NVIDIA's cosmos-framework (`cosmos_framework/data/generator/action/datasets/*.py`,
  release 2026-08-21), or the fps of its official inference example (`inputs/omni/*.json`).
  `None` where no source publishes one (the pipeline's own defaults then apply: 24 fps, ego view).
* extras: the training-only domains of cosmos-framework's `utils/domain_utils.py` that diffusers
  does not list, and the `libero` family, whose width depends on the dataset's rotation space
  (`libero_pose_utils.LIBERO_ACTION_DIMS`: 3d -> 7, 6d -> 10, 9d -> 13).
* a checkpoint's own embodiments, from the `embodiments` list of its `worldstep.json`.

Lookups go by name, or by a domain id whose embodiments share one width. Every refusal is a
`ValueError` naming the embodiment, its width and the allowed names, raised before any model work.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any


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
    `normalization` says how its actions were scaled in training (None: unpublished).
    """

    name: str
    domain_id: int
    raw_width: int
    default_fps: float | None = None
    default_view_point: str = "ego_view"
    normalization: NormalizationKind | None = None
    source: EmbodimentSource = EmbodimentSource.DIFFUSERS

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"embodiment name={self.name!r} is invalid; allowed: a non-empty string")
        _check_int(f"embodiment {self.name!r}: domain_id", self.domain_id, 0)
        _check_int(f"embodiment {self.name!r}: raw_width", self.raw_width, 1)
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

    def describe(self) -> str:
        return f"{self.name!r} (domain {self.domain_id}, {self.raw_width}-wide actions)"


def _check_int(field: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field}={value!r} is invalid; allowed: an int >= {minimum}")


def _enum(kind: type[Enum], value: Any, field: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{field}={value!r} is invalid; allowed: {[m.value for m in kind]}") from None


# --- worldstep's annotations of diffusers' names (sources in the module docstring) ----------------

_Q, _RAW = NormalizationKind.QUANTILE, NormalizationKind.NONE
# name: (default fps, default view point, training normalization)
TRAINING_DEFAULTS: dict[str, tuple[float | None, str, NormalizationKind | None]] = {
    "av": (10.0, "ego_view", None),  # inputs/omni/action_forward_dynamics_av.json
    "camera_pose": (30.0, "ego_view", None),  # inputs/omni/action_forward_dynamics_camera.json
    "hand_pose": (15.0, "ego_view", _Q),  # HumanHandPoseLeRobotDataset
    "pusht": (None, "ego_view", None),
    "umi": (10.0, "wrist_view", _Q),  # UMILeRobotDataset (stats file is 20-wide; the first 10 apply)
    "bridge_orig_lerobot": (5.0, "ego_view", _Q),  # BridgeOrigLeRobotDataset
    "droid_lerobot": (15.0, "concat_view", _RAW),  # DROIDLeRobotDataset
    "robomind-franka": (10.0, "concat_view", _Q),  # RoboMINDFrankaDataset
    "robomind-franka-dual": (10.0, "concat_view", _Q),  # RoboMINDFrankaDataset
    "robomind-ur": (10.0, "third_person_view", _RAW),  # RoboMINDURDataset
    "galbot": (None, "ego_view", None),
    "agibotworld": (10.0, "concat_view", _Q),  # AgiBotWorldBetaLeRobotDataset
    "agibot_gear_gripper": (None, "ego_view", None),
    "agibot_gear_gripper_ext": (None, "ego_view", None),
    "fractal": (3.0, "ego_view", _RAW),  # FractalLeRobotDataset
}

# Names diffusers maps to an id but gives no width, and why.
_WIDTHLESS_REASONS = {
    "no_action": "it carries no actions",
    "libero": "its width depends on the dataset's rotation space; use libero_3d (7), libero_6d (10) or "
              "libero_9d (13)",
}

_CF = EmbodimentSource.COSMOS_FRAMEWORK
# Training-only domains of cosmos-framework's domain_utils (not in diffusers). The libero rates: the
# bundled LIBERO stats were computed on a 20 fps conversion (libero_lerobot_dataset.py).
EXTRAS: tuple[Embodiment, ...] = (
    Embodiment("libero_3d", 5, 7, 20.0, "concat_view", _Q, _CF),
    Embodiment("libero_6d", 5, 10, 20.0, "concat_view", _Q, _CF),
    Embodiment("libero_9d", 5, 13, 20.0, "concat_view", _Q, _CF),
    Embodiment("xdof_yam", 16, 20, source=_CF),
    Embodiment("molmoact2_yam", 16, 20, source=_CF),
    Embodiment("abc_yam", 16, 20, source=_CF),
    Embodiment("robotwin", 17, 14, source=_CF),
    Embodiment("drawanything", 21, 3, source=_CF),
    Embodiment("behavior1k_lerobot", 22, 23, source=_CF),
    Embodiment("maniparena", 23, 20, source=_CF),
)


def diffusers_embodiments() -> tuple[Embodiment, ...]:
    """Every name the installed diffusers accepts for action inference, in its table's order."""
    ids, widths, _ = diffusers_tables()
    out = []
    for name, domain_id in ids.items():
        if name not in widths:
            continue
        fps, view, norm = TRAINING_DEFAULTS.get(name, (None, "ego_view", None))
        out.append(Embodiment(name, domain_id, widths[name], fps, view, norm, EmbodimentSource.DIFFUSERS))
    return tuple(out)


class EmbodimentRegistry:
    """Embodiments by name, and by domain id where an id's embodiments share one width.

    Built-in: `EmbodimentRegistry.default()` (diffusers' embodiments plus the cosmos-framework
    extras). A checkpoint folder adds its own with `with_checkpoint(meta)`.
    """

    def __init__(self, embodiments: Iterable[Embodiment], widthless: Mapping[str, str] | None = None):
        self._by_name: dict[str, Embodiment] = {}
        for embodiment in embodiments:
            if not isinstance(embodiment, Embodiment):
                raise ValueError(f"registry entries must be Embodiment records, got {type(embodiment).__name__}")
            if embodiment.name in self._by_name:
                raise ValueError(f"embodiment name {embodiment.name!r} is registered twice")
            self._by_name[embodiment.name] = embodiment
        self._widthless = {k: v for k, v in (widthless or {}).items() if k not in self._by_name}

    @classmethod
    def default(cls) -> EmbodimentRegistry:
        """diffusers' embodiments plus the cosmos-framework extras."""
        ids, widths, _ = diffusers_tables()
        widthless = {name: _WIDTHLESS_REASONS.get(name, "diffusers gives it no action width")
                     for name in ids if name not in widths}
        return cls((*diffusers_embodiments(), *EXTRAS), widthless)

    # --- queries ---------------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Embodiment]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Embodiment:
        """The embodiment called `name`; a `ValueError` naming the allowed names otherwise."""
        if isinstance(name, str) and name in self._by_name:
            return self._by_name[name]
        if isinstance(name, str) and name in self._widthless:
            raise ValueError(f"embodiment={name!r} cannot drive forward dynamics: {self._widthless[name]}; "
                             f"allowed: {self._allowed()}")
        raise ValueError(f"embodiment={name!r} is unknown; allowed: {self._allowed()}")

    def with_domain(self, domain_id: int) -> tuple[Embodiment, ...]:
        """Every embodiment of `domain_id`, in registration order."""
        return tuple(e for e in self._by_name.values() if e.domain_id == domain_id)

    def by_domain_id(self, domain_id: int) -> Embodiment:
        """The embodiment of a domain id whose embodiments share one width: the first registered
        (diffusers' order: `droid_lerobot` for 8, `agibotworld` for 15). Pass a name for another's defaults."""
        if isinstance(domain_id, bool) or not isinstance(domain_id, int):
            raise ValueError(f"domain_id={domain_id!r} is invalid; allowed: an int naming one of "
                             f"{self._allowed_ids()}")
        matches = self.with_domain(domain_id)
        if not matches:
            raise ValueError(f"domain_id={domain_id} has no embodiment with an action width; allowed ids: "
                             f"{self._allowed_ids()}; allowed names: {self._allowed()}")
        widths = sorted({e.raw_width for e in matches})
        if len(widths) > 1:
            options = ", ".join(e.describe() for e in matches)
            raise ValueError(f"domain_id={domain_id} is ambiguous: its embodiments take widths {widths} "
                             f"({options}); pass embodiment= one of {[e.name for e in matches]}")
        return matches[0]

    def resolve(self, embodiment: str | None = None, *, domain_id: int | None = None, width: int | None = None,
                num_domains: int | None = None, action_dim: int | None = None) -> Embodiment:
        """Check a user's combination and return its embodiment, before any model work.

        Args:
            embodiment: a registered name, or None to look `domain_id` up.
            domain_id: must equal the embodiment's id when both are given.
            width: the raw action width the caller will send; must equal the embodiment's.
            num_domains, action_dim: the checkpoint's action head; the embodiment must fit it.
        """
        if embodiment is None and domain_id is None:
            raise ValueError(f"embodiment=None and domain_id=None: give one; allowed names: {self._allowed()}")
        if domain_id is not None and (isinstance(domain_id, bool) or not isinstance(domain_id, int)):
            raise ValueError(f"domain_id={domain_id!r} is invalid; allowed: an int, one of {self._allowed_ids()}")
        if embodiment is not None:
            found = self.get(embodiment)
            if domain_id is not None and domain_id != found.domain_id:
                raise ValueError(f"domain_id={domain_id!r} contradicts embodiment {found.describe()}; "
                                 f"allowed: domain_id={found.domain_id} or None")
        else:
            found = self.by_domain_id(domain_id)
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)):
            raise ValueError(f"width={width!r} is invalid; allowed: an int ({found.describe()} takes "
                             f"{found.raw_width})")
        if width is not None and width != found.raw_width:
            same = [e.name for e in self if e.raw_width == width]
            hint = f"; {width}-wide embodiments: {same}" if same else ""
            raise ValueError(f"actions {width!r} wide do not fit embodiment {found.describe()}: it takes exactly "
                             f"{found.raw_width}{hint}; allowed names: {self._allowed()}")
        if num_domains is not None and found.domain_id >= num_domains:
            raise ValueError(f"embodiment {found.describe()} is outside this checkpoint's {num_domains} domains; "
                             f"allowed: {[e.name for e in self if e.domain_id < num_domains]}")
        if action_dim is not None and found.raw_width > action_dim:
            raise ValueError(f"embodiment {found.describe()} is wider than this checkpoint's action_dim="
                             f"{action_dim}; allowed: {[e.name for e in self if e.raw_width <= action_dim]}")
        return found

    def within(self, num_domains: int) -> EmbodimentRegistry:
        """The embodiments whose domain a checkpoint with `num_domains` domains has."""
        _check_int("num_domains", num_domains, 1)
        return EmbodimentRegistry([e for e in self if e.domain_id < num_domains], self._widthless)

    def _allowed(self) -> list[str]:
        return sorted(self._by_name)

    def _allowed_ids(self) -> list[int]:
        return sorted({e.domain_id for e in self._by_name.values()})

    # --- a checkpoint's own embodiments -----------------------------------------------------------

    def with_checkpoint(self, meta: Mapping[str, Any]) -> EmbodimentRegistry:
        """This registry plus the embodiments a checkpoint's `worldstep.json` declares.

        `meta["embodiments"]`: a list of `{"name", "domain_id", "raw_width", "fps", "view_point",
        "normalization"}` (the last three optional). `meta["builtin_embodiments"] = false` means the
        checkpoint's domains are its own (trained from scratch), so the built-in names are dropped.
        """
        entries = meta.get("embodiments", [])
        if not isinstance(entries, list):
            raise ValueError(f"worldstep.json: embodiments={entries!r} is invalid; allowed: a list of objects")
        own = [embodiment_from_json(entry) for entry in entries]
        keep_builtin = meta.get("builtin_embodiments", True)
        if not isinstance(keep_builtin, bool):
            raise ValueError(f"worldstep.json: builtin_embodiments={keep_builtin!r} is invalid; allowed: true or "
                             "false")
        base = list(self) if keep_builtin else []
        clash = sorted({e.name for e in own} & {e.name for e in base})
        if clash:
            raise ValueError(f"worldstep.json: embodiments {clash} are already registered; allowed: new names, "
                             "or builtin_embodiments: false")
        return EmbodimentRegistry([*base, *own], self._widthless if keep_builtin else None)


_JSON_KEYS = {"name", "domain_id", "raw_width", "fps", "view_point", "normalization"}


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
    )


def embodiment_to_json(embodiment: Embodiment) -> dict[str, Any]:
    """The `worldstep.json` entry of an embodiment (inverse of `embodiment_from_json`)."""
    entry: dict[str, Any] = {"name": embodiment.name, "domain_id": embodiment.domain_id,
                             "raw_width": embodiment.raw_width, "view_point": embodiment.default_view_point}
    if embodiment.default_fps is not None:
        entry["fps"] = embodiment.default_fps
    if embodiment.normalization is not None:
        entry["normalization"] = embodiment.normalization.value
    return entry


def checkpoint_registry(meta: Mapping[str, Any], num_domains: int | None = None) -> EmbodimentRegistry:
    """The embodiments a checkpoint can be driven with: the built-ins (unless its `worldstep.json`
    says `builtin_embodiments: false`) plus its own, restricted to its `num_domains` when given."""
    registry = EmbodimentRegistry.default().with_checkpoint(meta)
    return registry if num_domains is None else registry.within(num_domains)


def folder_registry(folder: str | os.PathLike, num_domains: int | None = None) -> EmbodimentRegistry:
    """`checkpoint_registry` of a checkpoint folder's `worldstep.json` (the built-ins when it has none)."""
    path = Path(folder) / "worldstep.json"
    meta = json.loads(path.read_text()) if path.is_file() else {}
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: the top level must be a JSON object, got {type(meta).__name__}")
    return checkpoint_registry(meta, num_domains)
