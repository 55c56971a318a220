"""What one rollout looks like in Rerun: the entity paths, the (window, frame) timeline and the encoded frames.

``RolloutLog`` writes one episode (one env, or one index of a vector env) under an entity root
(``env`` or ``env/3``). Frame ``f`` of an episode sits at ``frame=f``; the frames and actions of window
``k`` also carry ``window=k``; an ``episode`` timeline counts resets. What is logged where:

| entity | what | when |
|---|---|---|
| ``{root}/frame`` | the model's frame, JPEG (or PNG) | every frame, the first frame at ``frame=0`` |
| ``{root}/action/{embodiment}`` | a scalar series per action dimension, named (``dx``, ``dy``) | the frame it drives |
| ``{root}/reward``, ``{root}/success`` | the window's reward and success (0/1) | the window's last frame |
| ``{root}/kv/pages_in_use`` | KV pages the episode holds | reset and every window's last frame |
| ``{root}/timings`` | series ``denoise_s``, ``commit_s``, ``decode_s``, ``other_s``, ``total_s`` | as the reward |
| ``{root}/truth/frame``, ``{root}/truth/psnr_db`` | the simulator's frame, the window's mean PSNR | as the model's |

Frames are logged encoded (a 480x640 JPEG is tens of KB), so a long rollout does not hold raw frames; the
viewer tells JPEG from PNG by the bytes. Series of one entity are logged in one call: a window costs a handful
of calls (``worldstep bench view`` measures them against the step).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from PIL import Image

from ..measures.frames import psnr

ImageFormat = Literal["jpeg", "png"]
IMAGE_FORMATS = ("jpeg", "png")
PHASES = ("denoise_s", "commit_s", "decode_s", "other_s")  # a window's share of its step (PhaseTimings)
TIMING_SERIES = (*PHASES, "total_s")

# Names of the action dimensions of embodiments whose layout is known (else the index names the dimension).
_POSE10 = ("x", "y", "z", "rot_c0_x", "rot_c0_y", "rot_c0_z", "rot_c1_x", "rot_c1_y", "rot_c1_z", "gripper")
ACTION_DIM_NAMES: dict[str, tuple[str, ...]] = {
    "pusher": ("dx", "dy"),  # PushSim's effector velocity
    "droid_lerobot": _POSE10,  # worldstep.action_data.relative_pose_actions: translation, rotation columns, gripper
}


def rerun_module():
    """``rerun``, or an ImportError that says how to install it (an optional extra)."""
    try:
        import rerun
    except ImportError as err:
        raise ImportError("the Rerun viewer needs rerun-sdk: pip install 'worldstep[view]'") from err
    return rerun


def action_dim_names(embodiment: str | None, width: int) -> tuple[str, ...]:
    """Series names of ``width`` action dimensions: the embodiment's layout when known, else the indices."""
    names = ACTION_DIM_NAMES.get(embodiment or "")
    return names if names is not None and len(names) == width else tuple(str(i) for i in range(width))


def encode_frame(frame: np.ndarray, image_format: ImageFormat, quality: int) -> bytes:
    """One ``(H, W, 3)`` uint8 frame as JPEG or PNG bytes."""
    buffer = io.BytesIO()
    if image_format == "jpeg":
        Image.fromarray(frame).save(buffer, format="JPEG", quality=quality)
    else:
        Image.fromarray(frame).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


class RolloutLog:
    """Logs one episode's (window, frame)-indexed data into a Rerun recording."""

    def __init__(self, recording: Any, root: str, embodiment: str | None, action_width: int,
                 image_format: ImageFormat, jpeg_quality: int) -> None:
        self.rr = rerun_module()
        self.recording = recording
        self.root = root
        self.action_path = f"{root}/action/{embodiment}" if embodiment else f"{root}/action"
        self.dim_names = action_dim_names(embodiment, action_width)
        recording.log(self.action_path, self.rr.SeriesLines(names=list(self.dim_names)), static=True)
        recording.log(f"{root}/timings", self.rr.SeriesLines(names=list(TIMING_SERIES)), static=True)
        self.image_format: ImageFormat = image_format
        self.jpeg_quality = jpeg_quality
        self.episode = -1
        self.last_frames: np.ndarray | None = None  # the model's frames of the last reset or window

    # --- per episode -----------------------------------------------------------------------------

    def reset(self, first_frame: np.ndarray, kv: Any | None) -> None:
        """A new episode: its first frame (and the pages its prompt holds) at ``frame=0``."""
        self.episode += 1
        self.last_frames = first_frame[None]
        self._at(frame=0)
        self._frames("frame", first_frame[None], [0], None)
        if kv is not None:
            self._scalar("kv/pages_in_use", _field(kv, "pages_in_use"))

    def window(self, window: int, frame_start: int, frames: np.ndarray, actions: np.ndarray, reward: float,
               success: bool, timings: Any | None, kv: Any | None) -> None:
        """Window ``window``: its frames from ``frame_start``, the actions that drove them, then its outcome."""
        self.last_frames = frames
        indices = list(range(frame_start, frame_start + len(frames)))
        self._frames("frame", frames, indices, window)
        self._actions(np.asarray(actions, np.float64), indices, window)
        self._at(frame=indices[-1], window=window)
        self._scalar("reward", float(reward))
        self._scalar("success", float(bool(success)))
        if kv is not None:
            self._scalar("kv/pages_in_use", _field(kv, "pages_in_use"))
        if timings is not None:
            phases = [float(_field(timings, name)) for name in PHASES]
            self.recording.log(f"{self.root}/timings", self.rr.Scalars([*phases, sum(phases)]))

    def truth(self, frames: np.ndarray, window: int | None, frame_start: int) -> float | None:
        """The simulator's frames beside the model's last ones; after a window, its mean PSNR (returned)."""
        indices = list(range(frame_start, frame_start + len(frames)))
        self._frames("truth/frame", frames, indices, window)
        if window is None or self.last_frames is None or self.last_frames.shape != frames.shape:
            return None
        psnr_db = float(psnr(self.last_frames, frames).mean())
        self._at(frame=indices[-1], window=window)
        self._scalar("truth/psnr_db", psnr_db)
        return psnr_db

    # --- helpers ---------------------------------------------------------------------------------

    def _at(self, frame: int, window: int | None = None) -> None:
        self.recording.reset_time()
        self.recording.set_time("episode", sequence=self.episode)
        self.recording.set_time("frame", sequence=frame)
        if window is not None:
            self.recording.set_time("window", sequence=window)

    def _indexes(self, indices: Sequence[int], window: int | None) -> list:
        frame = np.asarray(indices, np.int64)
        columns = [self.rr.TimeColumn("episode", sequence=np.full_like(frame, self.episode)),
                   self.rr.TimeColumn("frame", sequence=frame)]
        if window is not None:
            columns.append(self.rr.TimeColumn("window", sequence=np.full_like(frame, window)))
        return columns

    def _frames(self, name: str, frames: np.ndarray, indices: Sequence[int], window: int | None) -> None:
        blobs = [encode_frame(frame, self.image_format, self.jpeg_quality) for frame in frames]
        self.recording.send_columns(
            f"{self.root}/{name}", indexes=self._indexes(indices, window),
            columns=self.rr.EncodedImage.columns(blob=blobs))

    def _actions(self, actions: np.ndarray, indices: Sequence[int], window: int) -> None:
        rows, width = actions.shape
        self.recording.send_columns(self.action_path, indexes=self._indexes(indices, window),
                                    columns=self.rr.Scalars.columns(scalars=actions).partition([width] * rows))

    def _scalar(self, name: str, value: float) -> None:
        self.recording.log(f"{self.root}/{name}", self.rr.Scalars(value))


def _field(record: Any, name: str) -> Any:
    """A field of a ``PhaseTimings``/``KVStats`` record, or of its dict form (vector env and remote infos)."""
    return record[name] if isinstance(record, Mapping) else getattr(record, name)
