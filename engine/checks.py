"""Checks on what a caller hands worldstep, run before any work: the one definition of each rule.

Every failure raises ``ValueError`` (``TypeError`` for a non-callable callback) reading
``<field>=<value> is invalid; allowed: <range>``. Nothing has changed when a check fails, so the caller's
objects stay usable. A bad ``domain_id`` must never reach an embedding lookup on a GPU (a device-side
assert takes the whole CUDA context with it), so ids, actions, images and prompts are checked on the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

MAX_PROMPT_CHARS = 20_000
MIN_IMAGE_SIDE = 16  # px; smaller images carry too little to condition a rollout on


def is_int(value: Any) -> bool:
    """A Python or numpy integer, not a bool (``True`` as a window size is always a mistake)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(field: str, value: Any, low: int, high: int | None = None) -> int:
    """An int in ``[low, high)`` (``high=None``: no upper bound), returned as a Python int."""
    allowed = f"an int in [{low}, {high})" if high is not None else f"an int >= {low}"
    if not is_int(value) or value < low or (high is not None and value >= high):
        raise ValueError(f"{field}={value!r} is invalid; allowed: {allowed}")
    return int(value)


def check_fps(field: str, fps: Any) -> float:
    """A positive finite number (frames or actions per second), returned as a float."""
    if isinstance(fps, (bool, np.bool_)) or not isinstance(fps, (int, float, np.integer, np.floating)) or \
            not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"{field}={fps!r} is invalid; allowed: a number > 0")
    return float(fps)


def check_prompt(field: str, value: Any, *, allow_empty: bool = False) -> str:
    """A (non-empty unless ``allow_empty``) string of at most `MAX_PROMPT_CHARS` characters."""
    allowed = f"{'a' if allow_empty else 'a non-empty'} string of at most {MAX_PROMPT_CHARS} characters"
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ValueError(f"{field}={value!r} is invalid; allowed: {allowed}")
    if len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"{field} of {len(value)} characters is invalid; allowed: {allowed}")
    return value


def check_image(field: str, value: Any) -> np.ndarray:
    """An RGB frame ``(H, W, 3)`` with ``H, W >= MIN_IMAGE_SIDE``: uint8 (0..255), or float in [0, 1].

    Returns a private copy, so the caller may reuse its array.
    """
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{field} of type {type(value).__name__} is invalid; allowed: a numpy array (H, W, 3)")
    if value.ndim != 3 or value.shape[2] != 3 or min(value.shape[:2]) < MIN_IMAGE_SIDE:
        raise ValueError(f"{field}.shape={tuple(value.shape)} is invalid; allowed: (H, W, 3) with "
                         f"H, W >= {MIN_IMAGE_SIDE}")
    if value.dtype == np.uint8:
        return value.copy()
    if value.dtype.kind != "f":
        raise ValueError(f"{field}.dtype={value.dtype} is invalid; allowed: uint8 (0..255) or float (0..1)")
    if not np.all(np.isfinite(value)):
        raise ValueError(f"{field} contains NaN or inf; allowed: finite float values in [0, 1]")
    if value.min() < 0 or value.max() > 1:
        raise ValueError(f"{field} float values in [{value.min():.4g}, {value.max():.4g}] are invalid; "
                         "allowed: finite values in [0, 1]")
    return value.copy()


def check_actions(field: str, actions: Any, shape: tuple[int, int], *, low: float | None = None,
                  high: float | None = None) -> np.ndarray:
    """A finite real array (numpy, list or torch tensor) of exactly ``shape``, within ``[low, high]`` when
    given; returned as a float32 copy."""
    if hasattr(actions, "detach"):  # a torch tensor
        actions = actions.detach().cpu().numpy()
    array = np.asarray(actions)
    if array.dtype.kind not in "fiu":
        raise ValueError(f"{field}.dtype={array.dtype} is invalid; allowed: a real float (or int) dtype")
    if array.shape != tuple(shape):
        raise ValueError(f"{field}.shape={array.shape} is invalid; allowed: {tuple(shape)} "
                         "(chunk_size, action width)")
    if not np.all(np.isfinite(array)):
        where = np.argwhere(~np.isfinite(array))[0].tolist()
        raise ValueError(f"{field} contain NaN or inf at {where}; allowed: finite values")
    lo, hi = (float(array.min()), float(array.max())) if array.size else (0.0, 0.0)
    if (low is not None and lo < low) or (high is not None and hi > high):
        bounds = f"[{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
        raise ValueError(f"{field} range [{lo:.4g}, {hi:.4g}] is invalid; allowed: {bounds}")
    return array.astype(np.float32, copy=True)


def check_callable(field: str, value: Any) -> Callable | None:
    """A callable or None (a ``TypeError`` otherwise, as Python's own calls raise)."""
    if value is not None and not callable(value):
        raise TypeError(f"{field}={value!r} is invalid; allowed: a callable or None")
    return value
