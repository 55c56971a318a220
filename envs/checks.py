"""Checks on what a user hands the env, run before any engine work.

Each failure raises ``ValueError`` naming the field, the value and the allowed range; nothing has been
changed when it does, so the env keeps working after a rejected call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from worldstep.engine.models.cosmos3.validation import check_prompt as engine_check_prompt

MIN_IMAGE_SIZE = 16


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(field: str, value: Any, low: int, high: int | None = None) -> int:
    """An int in ``[low, high)`` (``high=None``: no upper bound)."""
    allowed = f"an int in [{low}, {high})" if high is not None else f"an int >= {low}"
    if not is_int(value) or value < low or (high is not None and value >= high):
        raise ValueError(f"{field}={value!r} is invalid; allowed: {allowed}")
    return int(value)


def check_prompt(field: str, value: Any) -> str:
    """A non-empty string within the engine's length limit (the engine's own check, run up front)."""
    return engine_check_prompt(value, field)


def check_image(field: str, value: Any) -> np.ndarray:
    """An ``(H, W, 3)`` uint8 frame with ``H, W >= 16``; returned as a private copy."""
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{field} of type {type(value).__name__} is invalid; allowed: a numpy array (H, W, 3) uint8")
    if value.dtype != np.uint8:
        raise ValueError(f"{field}.dtype={value.dtype} is invalid; allowed: uint8")
    if value.ndim != 3 or value.shape[2] != 3 or min(value.shape[:2]) < MIN_IMAGE_SIZE:
        raise ValueError(
            f"{field}.shape={tuple(value.shape)} is invalid; allowed: (H, W, 3) with H, W >= {MIN_IMAGE_SIZE}"
        )
    return value.copy()


def check_callable(field: str, value: Any) -> Callable | None:
    if value is not None and not callable(value):
        raise TypeError(f"{field}={value!r} is invalid; allowed: a callable or None")
    return value


def check_actions(actions: Any, shape: tuple[int, int], field: str = "actions") -> np.ndarray:
    """A finite array of exactly ``shape`` with values in [-1, 1]; returned as float32."""
    if hasattr(actions, "detach"):  # a torch tensor
        actions = actions.detach().cpu().numpy()
    array = np.asarray(actions)
    if array.dtype.kind not in "fiu":
        raise ValueError(f"{field}.dtype={array.dtype} is invalid; allowed: a real float (or int) dtype")
    if array.shape != shape:
        raise ValueError(f"{field}.shape={array.shape} is invalid; allowed: {shape} (chunk_size, action_width)")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{field} contain NaN or inf at {np.argwhere(~np.isfinite(array))[0].tolist()}; allowed: finite")
    if array.size and (array.min() < -1.0 or array.max() > 1.0):
        raise ValueError(f"{field} range [{array.min():.4g}, {array.max():.4g}] is invalid; allowed: [-1, 1]")
    return array.astype(np.float32)
