"""The embodiment registry: every embodiment the released Cosmos3 models know, as the installed diffusers
defines them, plus what its tables leave out (each with its source) and a checkpoint's own.

* names, ids and widths: the installed diffusers' `pipeline_cosmos3_omni` tables, read at import time,
  never copied;
* `default_fps`, `default_view_point`, `normalization`: the defaults of the embodiment's dataset class in
  NVIDIA's cosmos-framework (`cosmos_framework/data/generator/action/datasets/*.py`, release 2026-08-21),
  or the fps of its official inference example (`inputs/omni/*.json`); `None` where no source publishes
  one (the pipeline's own defaults then apply: 24 fps, ego view);
* extras: the training-only domains of cosmos-framework's `utils/domain_utils.py` that diffusers does not
  list, and the `libero` family, whose width depends on the dataset's rotation space
  (`libero_pose_utils.LIBERO_ACTION_DIMS`: 3d -> 7, 6d -> 10, 9d -> 13);
* a checkpoint's own embodiments, from the `embodiments` list of its `worldstep.json`;
* action conventions (absolute or delta, layout, source): `action_convention.CONVENTIONS`; unknown elsewhere.

Lookups go by name, or by a domain id whose embodiments share one width. Every refusal is a `ValueError`
naming the embodiment, its width and the allowed names, raised before any model work.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..checks import check_int
from .action_convention import CONVENTIONS
from .embodiment import (
    Embodiment,
    EmbodimentSource,
    NormalizationKind,
    diffusers_tables,
    embodiment_from_json,
)

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
        out.append(Embodiment(name, domain_id, widths[name], fps, view, norm, EmbodimentSource.DIFFUSERS,
                              CONVENTIONS.get(name)))
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
        if isinstance(name, str) and name in _builtin_names():  # known, only not in this checkpoint's domains
            raise ValueError(f"embodiment={name!r} is not supported by this checkpoint (a known embodiment it was "
                             f"not trained on); allowed: {self._allowed()}")
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
        check_int("num_domains", num_domains, 1)
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


@functools.cache
def _builtin_names() -> frozenset[str]:
    """The names of the built-in registry (diffusers' tables and the extras), built once."""
    return frozenset(EmbodimentRegistry.default().names)
