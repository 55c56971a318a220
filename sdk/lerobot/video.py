"""One episode's frames of one camera, decoded with PyAV (AV1 through dav1d, H.264 through FFmpeg's decoder).

A v3.0 video file holds many episodes back to back, so an episode is a time span of the file: seek to the
key frame before its start, decode, and keep the ``count`` frames from the first one whose timestamp is
within half a frame of the start. Nothing outside that span is kept in memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .format import DatasetError


def decode_span(path: Path, from_s: float, count: int, fps: float) -> np.ndarray:
    """``count`` RGB frames ``[count, H, W, 3]`` uint8 of the video at ``path`` from ``from_s`` seconds on.

    A missing file, a file PyAV cannot decode, or one holding fewer frames than ``count`` from ``from_s`` is a
    DatasetError naming the file.
    """
    import av

    if not path.is_file():
        raise DatasetError(f"video {path} does not exist")
    tolerance = 0.5 / fps
    frames: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DatasetError(f"video {path} has no video stream")
            stream = container.streams.video[0]
            if from_s > 0:
                container.seek(int(from_s / stream.time_base), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                if frame.time is not None and frame.time < from_s - tolerance:
                    continue
                frames.append(frame.to_ndarray(format="rgb24"))
                if len(frames) == count:
                    break
    except av.error.FFmpegError as e:
        raise DatasetError(f"video {path} cannot be decoded: {e}") from None
    if len(frames) < count:
        raise DatasetError(f"video {path} holds {len(frames)} frames from {from_s:.3f} s; the episode needs {count}")
    return np.stack(frames)
