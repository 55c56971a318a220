"""Several cameras in one model frame: where each view sits, and the exact compose/split between them.

Cosmos3's action caption has a ``concat_view`` view point whose framing sentence reads "This video contains
concatenated views from multiple camera perspectives." (diffusers ``pipeline_cosmos3_omni.py``,
``_ACTION_VIEWPOINT_TEMPLATES``; the embodiments trained with it, e.g. ``droid_lerobot``, take it as their
default view point). Neither the pipeline nor its resolution bins (``_ACTION_RESOLUTION_BINS``) nor the
Cosmos3 action cookbook states how the views are arranged inside the frame, so the arrangement is an
explicit argument here, ``CameraLayout``:

- ``row``: the views side by side, left to right in camera order (each view the frame's full height);
- ``column``: the views stacked, top to bottom in camera order (each view the frame's full width).

A frame ``W`` pixels wide holds ``n`` views in a row at the column boundaries ``i * W // n`` (so widths
differ by at most one pixel when ``n`` does not divide ``W``); a column splits the height the same way.
Compose and split are pure copies, so ``split(compose(views)) == views`` exactly, for any frame size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

RESERVED_NAMES = ("frames", "state")  # observation keys the cameras share a Dict with


class CameraLayout(str, Enum):
    """How the views tile the model's frame (no published source fixes it; see the module docstring)."""

    ROW = "row"  # side by side, left to right
    COLUMN = "column"  # stacked, top to bottom


def check_cameras(cameras: Any) -> tuple[str, ...]:
    """Camera names: a non-empty sequence of distinct identifiers, none of them an observation key."""
    if isinstance(cameras, str) or not isinstance(cameras, Sequence) or not cameras:
        raise ValueError(f"cameras={cameras!r} is invalid; allowed: a non-empty sequence of camera names, "
                         "e.g. ('exterior', 'wrist')")
    for name in cameras:
        if not isinstance(name, str) or not name.isidentifier() or name in RESERVED_NAMES:
            raise ValueError(f"cameras entry {name!r} is invalid; allowed: a Python identifier other than "
                             f"{list(RESERVED_NAMES)}")
    if len(set(cameras)) != len(cameras):
        raise ValueError(f"cameras={tuple(cameras)!r} is invalid; allowed: distinct names")
    return tuple(cameras)


def check_layout(layout: Any) -> CameraLayout:
    try:
        return CameraLayout(layout)
    except ValueError:
        raise ValueError(f"layout={layout!r} is invalid; allowed: {[m.value for m in CameraLayout]}") from None


@dataclass(frozen=True)
class CameraGrid:
    """Where each camera's view sits in a ``height x width`` model frame.

    ``compose`` and ``split`` act on the last three axes, ``(..., H, W, 3)``, so a window's frames
    ``(chunk, H, W, 3)`` go through in one call.
    """

    cameras: tuple[str, ...]
    layout: CameraLayout
    height: int
    width: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", check_cameras(self.cameras))
        object.__setattr__(self, "layout", check_layout(self.layout))
        side = self.width if self.layout is CameraLayout.ROW else self.height
        if side < len(self.cameras):
            raise ValueError(f"{len(self.cameras)} cameras do not fit a {self.height}x{self.width} frame in a "
                             f"{self.layout.value}; allowed: at most {side} cameras")

    def _bounds(self) -> list[int]:
        side, n = (self.width if self.layout is CameraLayout.ROW else self.height), len(self.cameras)
        return [i * side // n for i in range(n + 1)]

    def regions(self) -> dict[str, tuple[slice, slice]]:
        """camera -> (rows, columns) of its view in the frame."""
        b = self._bounds()
        full_h, full_w = slice(0, self.height), slice(0, self.width)
        if self.layout is CameraLayout.ROW:
            return {name: (full_h, slice(b[i], b[i + 1])) for i, name in enumerate(self.cameras)}
        return {name: (slice(b[i], b[i + 1]), full_w) for i, name in enumerate(self.cameras)}

    def view_shapes(self) -> dict[str, tuple[int, int]]:
        """camera -> (height, width) of its view."""
        return {name: (rows.stop - rows.start, cols.stop - cols.start)
                for name, (rows, cols) in self.regions().items()}

    def check_views(self, views: Any, field: str) -> None:
        """A ValueError naming the camera when ``views`` lacks one, has an unknown one, or a view is not
        ``(..., h, w, 3)`` uint8 with this camera's ``h x w`` and one leading shape for all."""
        if not isinstance(views, Mapping):
            got = f"of shape {views.shape}" if isinstance(views, np.ndarray) else f"of type {type(views).__name__}"
            raise ValueError(f"{field} {got} is invalid; allowed: a dict camera -> (h, w, 3) uint8 view for cameras "
                             f"{list(self.cameras)}")
        unknown = [name for name in views if name not in self.cameras]
        if unknown:
            raise ValueError(f"{field}[{unknown[0]!r}] is invalid: no such camera; allowed: {list(self.cameras)}")
        missing = [name for name in self.cameras if name not in views]
        if missing:
            raise ValueError(f"{field} lacks camera {missing[0]!r}; allowed: one view for each of "
                             f"{list(self.cameras)}")
        lead = None
        for name, (h, w) in self.view_shapes().items():
            view = views[name]
            if not isinstance(view, np.ndarray) or view.dtype != np.uint8:
                got = f"dtype {view.dtype}" if isinstance(view, np.ndarray) else f"type {type(view).__name__}"
                raise ValueError(f"{field}[{name!r}] of {got} is invalid; allowed: a uint8 array (..., {h}, {w}, 3)")
            if view.ndim < 3 or view.shape[-3:] != (h, w, 3) or (lead is not None and view.shape[:-3] != lead):
                allowed = (*(lead or ()), h, w, 3)
                raise ValueError(f"{field}[{name!r}].shape={tuple(view.shape)} is invalid; allowed: {allowed} (camera "
                                 f"{name!r} is {h}x{w} of the {self.height}x{self.width} frame, {self.layout.value} "
                                 f"layout)")
            lead = view.shape[:-3]

    def fit_views(self, views: Any) -> Any:
        """First views of any size: each ``(h', w', 3)`` uint8 view of another size than its camera's is
        cover-cropped into it exactly as a single first frame is into the model's frame
        (``engine.vae.encoder.cover_crop``); anything else is returned as it is, for ``check_views`` to judge."""
        if not isinstance(views, Mapping):
            return views
        from worldstep.engine.vae.encoder import cover_crop

        shapes = self.view_shapes()
        fitted = dict(views)
        for name, view in views.items():
            if (name in shapes and isinstance(view, np.ndarray) and view.dtype == np.uint8 and view.ndim == 3
                    and view.shape[-1] == 3 and view.shape[:2] != shapes[name] and min(view.shape[:2]) > 0):
                fitted[name] = cover_crop(view, *shapes[name])
        return fitted

    def compose(self, views: Mapping[str, np.ndarray], field: str = "views") -> np.ndarray:
        """The model frame(s) ``(..., H, W, 3)`` holding every camera's view in its region."""
        self.check_views(views, field)
        lead = views[self.cameras[0]].shape[:-3]
        frame = np.empty((*lead, self.height, self.width, 3), np.uint8)
        for name, (rows, cols) in self.regions().items():
            frame[..., rows, cols, :] = views[name]
        return frame

    def split(self, frame: np.ndarray) -> dict[str, np.ndarray]:
        """camera -> its view ``(..., h, w, 3)`` of ``frame`` (contiguous copies)."""
        if not isinstance(frame, np.ndarray) or frame.ndim < 3 or frame.shape[-3:] != (self.height, self.width, 3):
            got = getattr(frame, "shape", type(frame).__name__)
            raise ValueError(f"frame of shape {got} is invalid; allowed: (..., {self.height}, {self.width}, 3)")
        return {name: np.ascontiguousarray(frame[..., rows, cols, :]) for name, (rows, cols) in self.regions().items()}
