"""A wrapper that turns the model's one frame into one observation per camera (see ``cameras.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .cameras import CameraGrid, CameraLayout, check_cameras, check_layout

CONCAT_VIEW = "concat_view"


class MultiCameraObservation(gym.ObservationWrapper):
    """Several cameras through one world model: a dict of first frames in, one ``Box`` per camera out.

    The env's ``frames`` ``(chunk, H, W, 3)`` are split into ``obs[camera]`` ``(chunk, h, w, 3)`` uint8 by a
    :class:`CameraGrid` (``layout``: ``"row"``, side by side, or ``"column"``, stacked; no published source
    fixes Cosmos3's arrangement, so it is an explicit argument). Other observation keys (``state``) pass
    through. ``reset(options={"image": {camera: (h', w', 3) uint8, ...}})`` composes the views into the
    first frame, each view of another size than its camera's ``h x w`` cover-cropped into it the way a single
    first frame is into the model's frame (``CameraGrid.fit_views``); a missing or unknown camera, or a view
    that is not ``(h', w', 3)`` uint8, is a ``ValueError`` naming the camera, raised before the env does any
    work. ``images`` gives the default first views.

    The env's caption must frame the video as ``concat_view`` ("This video contains concatenated views from
    multiple camera perspectives.", diffusers' ``_ACTION_VIEWPOINT_TEMPLATES``): an env whose view point is
    another is refused. ``render()`` is the env's composed frame, so ``RecordVideo`` shows every camera, side
    by side with the ``row`` layout.
    """

    def __init__(self, env: gym.Env, cameras: Sequence[str], layout: str | CameraLayout = CameraLayout.ROW, *,
                 images: Mapping[str, np.ndarray] | None = None) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        cameras, layout = check_cameras(cameras), check_layout(layout)
        frames = frames_box(env)
        view_point = getattr(getattr(env.unwrapped, "conditioning", None), "view_point", None)
        if view_point != CONCAT_VIEW:
            raise ValueError(f"the env's caption view point {view_point!r} is invalid for several cameras; allowed: "
                             f"{CONCAT_VIEW!r} (make the env with view_point='concat_view', or an embodiment whose "
                             "default it is, e.g. 'droid_lerobot')")
        super().__init__(env)
        chunk, height, width = frames.shape[:3]
        self.grid = CameraGrid(cameras, layout, height, width)
        if images is not None:
            images = self.grid.fit_views(images)
            self.grid.check_views(images, "images")
            images = {name: np.array(images[name]) for name in cameras}
        self.images = images
        others = {k: v for k, v in env.observation_space.spaces.items() if k != "frames"}
        clash = sorted(set(others) & set(cameras))
        if clash:
            raise ValueError(f"cameras {clash} are invalid: the env's observation already has those keys; allowed: "
                             "other names")
        boxes = {name: spaces.Box(0, 255, (chunk, h, w, 3), np.uint8)
                 for name, (h, w) in self.grid.view_shapes().items()}
        self.observation_space = spaces.Dict({**boxes, **others})

    @property
    def cameras(self) -> tuple[str, ...]:
        return self.grid.cameras

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        views = options.get("image", self.images)
        if views is not None:  # composed before the env does any work; a bad view raises here
            views = self.grid.fit_views(views)
            options["image"] = self.grid.compose(views, "options['image']" if "image" in options else "images")
        return super().reset(seed=seed, options=options or None)

    def observation(self, observation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.grid.split(np.asarray(observation["frames"]))
        out.update((k, v) for k, v in observation.items() if k != "frames")
        return out


def frames_box(env: gym.Env) -> spaces.Box:
    """The ``frames`` Box of a worldstep-style observation space, or TypeError."""
    obs_space = env.observation_space
    frames = obs_space.spaces.get("frames") if isinstance(obs_space, spaces.Dict) else None
    if not (isinstance(frames, spaces.Box) and frames.dtype == np.uint8 and len(frames.shape) == 4
            and frames.shape[-1] == 3):
        raise TypeError(f"env observation_space={obs_space} is invalid; allowed: a Dict with uint8 'frames' of "
                        "shape (chunk, H, W, 3)")
    return frames
