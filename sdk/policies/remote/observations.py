"""How a policy server's observation keys are filled from a worldstep observation (``ObsField``), and the key
tables of the common servers (``DROID_OBS_KEYS``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
from worldstep.envs.pose import matrix_to_euler_xyz, rot6d_to_matrix

__all__ = ["DEFAULT_OBS_KEYS", "DROID_OBS_KEYS", "ObsField", "ObsSource", "check_image_size", "check_obs_keys"]


class ObsSource(str, Enum):
    """What a server observation key is filled from (see :class:`ObsField` for the camera and column forms)."""

    FRAMES = "frames"
    """the window's frames, ``(chunk_size, H, W, 3)`` uint8 (``frames:<camera>``: that camera's)"""
    IMAGE = "image"
    """the latest frame, ``(H, W, 3)`` uint8 (resized to ``image_size`` when given; ``image:<camera>``: that
    camera's)"""
    PROMPT = "prompt"
    """the policy's ``prompt`` string"""
    STATE = "state"
    """the latest row of ``obs["state"]`` (``RobotStateObservation``), float32 (``state[a:b]``: columns a..b-1)"""
    POSE_EULER = "pose_euler"
    """``pose_euler[a:b]``: 9 state columns (position 3, 6-D rotation 6) as position + extrinsic ``xyz`` Euler
    angles in radians, float32 (6,): DROID's ``cartesian_position`` form (scipy ``as_euler("xyz")``, as in
    DROID's ``droid/misc/transformations.py``)"""


_FIELD = re.compile(r"^(?P<source>[a-z_]+)(?::(?P<camera>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<a>\d+):(?P<b>\d+)\])?$")


@dataclass(frozen=True)
class ObsField:
    """One server key's source: ``"image"``, ``"image:wrist"``, ``"frames:exterior"``, ``"prompt"``, ``"state"``,
    ``"state[9:10]"`` or ``"pose_euler[0:9]"`` (strings convert with :meth:`parse`)."""

    source: ObsSource
    camera: str | None = None  # FRAMES and IMAGE: a camera of a MultiCameraObservation (None: obs["frames"])
    columns: tuple[int, int] | None = None  # STATE (None: every column) and POSE_EULER (required, 9 wide)

    @classmethod
    def parse(cls, value: str | ObsSource | ObsField, key: str) -> ObsField:
        if isinstance(value, ObsField):
            return value
        allowed = (f"one of {[s.value for s in ObsSource]}, 'image:<camera>', 'frames:<camera>', 'state[a:b]' or "
                   "'pose_euler[a:a+9]'")
        match = _FIELD.match(value.value if isinstance(value, ObsSource) else value) if isinstance(value, str) else None
        source = next((s for s in ObsSource if match and s.value == match["source"]), None)
        columns = None if not match or match["a"] is None else (int(match["a"]), int(match["b"]))
        camera = None if not match else match["camera"]
        ok = source is not None and (
            (camera is None or source in (ObsSource.FRAMES, ObsSource.IMAGE))
            and (columns is None or (source in (ObsSource.STATE, ObsSource.POSE_EULER) and columns[1] > columns[0]))
            and (source is not ObsSource.POSE_EULER or (columns is not None and columns[1] - columns[0] == 9)))
        if not ok:
            raise ValueError(f"obs_keys[{key!r}]={value!r} is invalid; allowed: {allowed}")
        return cls(source, camera, columns)

    def read(self, obs: Mapping[str, Any], prompt: str | None, image_size: tuple[int, int] | None) -> Any:
        """This field's value in a worldstep observation."""
        if self.source is ObsSource.PROMPT:
            return prompt
        if self.source in (ObsSource.FRAMES, ObsSource.IMAGE):
            frames = np.asarray(_obs_entry(obs, "frames" if self.camera is None else self.camera, self))
            return frames if self.source is ObsSource.FRAMES else _resize(frames[-1], image_size)
        row = np.asarray(_obs_entry(obs, "state", self), np.float64)[-1]
        if self.columns is not None and self.columns[1] > len(row):
            raise ValueError(f"source {str(self)!r} is invalid for a state {len(row)} wide; allowed: columns within "
                             f"[0, {len(row)})")
        row = row if self.columns is None else row[self.columns[0]:self.columns[1]]
        if self.source is ObsSource.STATE:
            return row.astype(np.float32)
        euler = matrix_to_euler_xyz(rot6d_to_matrix(row[3:9], f"obs['state'] columns {self.columns}"))
        return np.concatenate([row[:3], euler]).astype(np.float32)

    def __str__(self) -> str:
        if self.camera is not None:
            return f"{self.source.value}:{self.camera}"
        if self.columns is None:
            return self.source.value
        return f"{self.source.value}[{self.columns[0]}:{self.columns[1]}]"


def _obs_entry(obs: Mapping[str, Any], key: str, field: ObsField) -> Any:
    if key not in obs:
        hint = (" (wrap the env in RobotStateObservation: make_env(..., robot_state=True))" if key == "state"
                else " (a MultiCameraObservation names its cameras: make_env(..., cameras=(...)))")
        raise ValueError(f"source {str(field)!r} needs obs[{key!r}]; the observation has {sorted(obs)}{hint}")
    return obs[key]


DEFAULT_OBS_KEYS = {"observation/image": "image", "prompt": "prompt"}

DROID_OBS_KEYS = {
    "observation/exterior_image_1_left": "image:exterior",
    "observation/wrist_image_left": "image:wrist",
    "observation/cartesian_position": "pose_euler[0:9]",
    "observation/gripper_position": "state[9:10]",
    "prompt": "prompt",
}
"""openpi's DROID observation keys (``examples/droid/main.py``, ``DroidInputs``) filled from an env made with
``cameras=("exterior", "wrist")``, ``robot_state=True`` and ``embodiment="droid_lerobot"``: the two cameras'
latest frames, the commanded end-effector pose as DROID's ``cartesian_position`` (position + ``xyz`` Euler), the
commanded gripper and the prompt. openpi's DROID policies also read ``observation/joint_position`` (7 joint
angles), which a world model's commanded end-effector state cannot give: send it with ``static_obs`` if the
policy needs it. openpi's own client resizes with padding to 224x224; pass ``image_size=(224, 224)`` for a plain
resize."""


def check_obs_keys(obs_keys: Mapping[str, str | ObsSource | ObsField]) -> dict[str, ObsField]:
    """``obs_keys`` as server key -> :class:`ObsField`; ValueError naming the key at fault."""
    if not isinstance(obs_keys, Mapping) or not obs_keys:
        raise ValueError(f"obs_keys={obs_keys!r} is invalid; allowed: a non-empty mapping server key -> one of "
                         f"{[s.value for s in ObsSource]}")
    out = {}
    for key, source in obs_keys.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"obs_keys key {key!r} is invalid; allowed: a non-empty string")
        out[key] = ObsField.parse(source, key)
    return out


def check_image_size(size: tuple[int, int] | None) -> tuple[int, int] | None:
    """``image_size`` as ``(height, width)`` ints, or None; ValueError else."""
    if size is None:
        return None
    if not (isinstance(size, (tuple, list)) and len(size) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in size)):
        raise ValueError(f"image_size={size!r} is invalid; allowed: None or (height, width) of positive ints")
    return int(size[0]), int(size[1])


def _resize(image: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    if size is None or image.shape[:2] == size:
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), Image.Resampling.BILINEAR))
