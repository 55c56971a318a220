"""What an embodiment's raw action means: an absolute target or a change, and which entries hold what.

The state a policy sees in a world model is the one its actions command (the model predicts pixels, not
poses), so worldstep can offer a robot state only for an embodiment whose convention a source states.
`CONVENTIONS` holds those; every other embodiment's convention is unknown (`None`) and no state is offered.

Facts and their sources:

* layout: diffusers' ``pipeline_cosmos3_omni.py``, the comment on ``_EMBODIMENT_TO_RAW_ACTION_DIM``: the
  Cosmos 3 unified action representation composes a 9-D pose (3-D translation then the 6-D rotation of
  Zhou et al. 2019) and a 1-D grasp state (gripper open/close); "bridge / droid / fractal / umi -> 10 : one
  arm = 9D effector pose + 1D gripper". The 6-D rotation of Zhou et al. is the first two columns of the
  rotation matrix, recovered by Gram-Schmidt.
* delta: the Cosmos 3 technical report (action representation; read through a public summary of the report)
  treats an action as the change from one frame to the next; community DROID fine-tunes describe the layout as
  single-step SE(3) end-effector pose deltas plus gripper. No source states the frame a delta is expressed in:
  worldstep composes it in the end effector's own frame, ``T[t+1] = T[t] @ delta[t]`` (a delta is the relative
  pose ``T[t]^-1 T[t+1]``).
  The gripper entry is a grasp *state*, so it is taken as commanded, not summed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

_LAYOUT_SOURCE = ("diffusers pipeline_cosmos3_omni.py, comment on _EMBODIMENT_TO_RAW_ACTION_DIM: 9D effector pose "
                  "(3D translation + 6D rotation, Zhou et al. 2019) + 1D gripper")
_DELTA_SOURCE = ("Cosmos 3 technical report, action representation: an action is the change from one frame to the "
                 "next")


class ActionKind(str, Enum):
    """Whether an action row is the commanded state itself or a change of it."""

    ABSOLUTE = "absolute"
    DELTA = "delta"


class RotationKind(str, Enum):
    """How an action row writes a rotation."""

    ROT6D = "rot6d"  # the first two columns of the rotation matrix (Zhou et al. 2019), 6 values


@dataclass(frozen=True)
class ActionConvention:
    """One embodiment's action convention.

    ``position``/``rotation`` are ``(start, stop)`` column ranges of an action row (None: absent);
    ``gripper`` is a column index (None: absent); ``source`` says where the facts come from.
    """

    kind: ActionKind
    width: int
    position: tuple[int, int] | None
    rotation: tuple[int, int] | None
    rotation_kind: RotationKind | None
    gripper: int | None
    source: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ActionKind(self.kind))
        if self.rotation is not None:
            object.__setattr__(self, "rotation_kind", RotationKind(self.rotation_kind))
            if self.rotation[1] - self.rotation[0] != 6:
                raise ValueError(f"rotation={self.rotation!r} is invalid; allowed: 6 columns for rot6d")
        if self.kind is ActionKind.DELTA and (self.position is None or self.position[1] - self.position[0] != 3):
            raise ValueError(f"position={self.position!r} is invalid for a delta convention; allowed: 3 columns")
        used = [*range(*(self.position or (0, 0))), *range(*(self.rotation or (0, 0))),
                *([] if self.gripper is None else [self.gripper])]
        if len(set(used)) != len(used) or any(not 0 <= i < self.width for i in used):
            raise ValueError(f"the layout (position {self.position}, rotation {self.rotation}, gripper "
                             f"{self.gripper}) is invalid for width {self.width}; allowed: disjoint columns in "
                             f"[0, {self.width})")


_JSON_KEYS = ("kind", "position", "rotation", "rotation_kind", "gripper", "source")


def convention_from_json(entry: Any, width: int, field: str) -> ActionConvention:
    """An `ActionConvention` from a `worldstep.json` embodiment's ``convention`` object (unknown keys refused)."""
    if not isinstance(entry, Mapping) or not {"kind", "source"} <= set(entry) or set(entry) - set(_JSON_KEYS):
        raise ValueError(f"{field}={entry!r} is invalid; allowed: an object with keys {list(_JSON_KEYS)} ('kind' and "
                         "'source' required)")
    try:
        return ActionConvention(
            entry["kind"], width, _span(entry.get("position")), _span(entry.get("rotation")),
            entry.get("rotation_kind", RotationKind.ROT6D.value if entry.get("rotation") is not None else None),
            entry.get("gripper"), str(entry["source"]))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{field}={dict(entry)!r} is invalid: {err}") from None


def convention_to_json(convention: ActionConvention) -> dict[str, Any]:
    """The inverse of `convention_from_json`."""
    entry: dict[str, Any] = {"kind": convention.kind.value, "source": convention.source}
    for key in ("position", "rotation", "gripper"):
        value = getattr(convention, key)
        if value is not None:
            entry[key] = list(value) if isinstance(value, tuple) else value
    if convention.rotation_kind is not None:
        entry["rotation_kind"] = convention.rotation_kind.value
    return entry


def _span(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(type(v) is int for v in value)):
        raise ValueError(f"{value!r} is not a [start, stop] pair of ints")
    return int(value[0]), int(value[1])


def pose_gripper_delta(source: str = f"{_LAYOUT_SOURCE}; {_DELTA_SOURCE}") -> ActionConvention:
    """The 10-wide single-arm convention: position delta (3), rot6d delta (6), gripper state (1)."""
    return ActionConvention(ActionKind.DELTA, 10, (0, 3), (3, 9), RotationKind.ROT6D, 9, source)


# The embodiments whose convention a source states (names as in the registry); every other: unknown.
CONVENTIONS: dict[str, ActionConvention] = {
    name: pose_gripper_delta() for name in ("droid_lerobot", "bridge_orig_lerobot", "fractal", "umi")
}
