"""mp4 writing with PyAV: H.264 (libx264) when the installed av has it, else MPEG-4 Part 2.

Videos are written under a temporary name next to the target and renamed onto it when complete, so an
interrupted run never leaves a partial mp4 where a finished one (or the previous run's) is expected.
"""

from __future__ import annotations

import contextlib
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
from worldstep.engine.checks import check_fps

CODECS = ("libx264", "mpeg4")


def frame_fps(env) -> float:
    """Frames per second of the frames in an env's observations (``metadata["frame_fps"]``; an env without
    it renders every observation frame, at ``render_fps``)."""
    metadata = env.metadata
    return float(metadata.get("frame_fps", metadata["render_fps"]))


def partial_path(path: str | os.PathLike) -> Path:
    """The temporary name a file is written under before it is renamed onto ``path``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.partial")


def pick_codec() -> str:
    """The first of ``CODECS`` the installed av can encode with."""
    import av

    for name in CODECS:
        try:
            av.codec.Codec(name, "w")
        except Exception:  # noqa: BLE001 - av raises UnknownCodecError or ValueError by version
            continue
        return name
    raise RuntimeError(f"none of the mp4 encoders {CODECS} is available in av {av.__version__}")


class Mp4Writer:
    """Stream uint8 RGB frames into an mp4 file at ``fps``.

    ``yuv420p`` needs even sizes: odd heights or widths are padded by repeating the last row/column.
    Frames go to ``partial_path(path)``; ``close()`` (idempotent) finishes the file and renames it onto
    ``path``; ``abort()`` deletes it instead. As a context manager it closes, or aborts on an exception.
    """

    def __init__(self, path: str | os.PathLike, fps: float, codec: str | None = None, crf: int = 18) -> None:
        import av

        check_fps("fps", fps)
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"video path {str(self.path)!r} is invalid: it is a folder; allowed: a file path")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fps = fps
        self.codec = codec or pick_codec()
        self.frames_written = 0
        self.partial = partial_path(self.path)
        self._container = av.open(str(self.partial), mode="w", format="mp4")
        self._stream = self._container.add_stream(self.codec, rate=Fraction(fps).limit_denominator(1001))
        self._stream.pix_fmt = "yuv420p"
        if self.codec == "libx264":
            self._stream.options = {"crf": str(crf)}
        self._size: tuple[int, int] | None = None
        self.closed = False

    def write(self, frames: np.ndarray) -> None:
        """Append one ``(H, W, 3)`` frame or a ``(T, H, W, 3)`` batch of uint8 frames."""
        import av

        if self.closed:
            raise ValueError(f"Mp4Writer for {str(self.path)!r} is closed")
        frames = np.asarray(frames)
        if frames.ndim == 3:
            frames = frames[None]
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(f"frames {frames.dtype}{tuple(frames.shape)} are invalid; allowed: uint8 (T, H, W, 3)")
        size = frames.shape[1:3]
        if self._size is None:
            self._size = size
            self._stream.height, self._stream.width = (s + s % 2 for s in size)
        elif size != self._size:
            raise ValueError(f"frame size {size} differs from the first frame's {self._size}")
        pad = ((0, 0), (0, size[0] % 2), (0, size[1] % 2), (0, 0))
        for frame in np.pad(frames, pad, mode="edge") if any(p[1] for p in pad) else frames:
            video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            self._container.mux(self._stream.encode(video_frame))
            self.frames_written += 1

    def close(self) -> None:
        """Finish the file and rename it onto ``path``."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._size is not None:
                self._container.mux(self._stream.encode(None))  # flush the encoder
        except BaseException:
            self._discard()
            raise
        self._container.close()
        os.replace(self.partial, self.path)

    def abort(self) -> None:
        """Stop writing and delete the partial file; ``path`` keeps whatever it held before."""
        if self.closed:
            return
        self.closed = True
        self._discard()

    def _discard(self) -> None:
        try:
            self._container.close()
        finally:
            self.partial.unlink(missing_ok=True)

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def video_writer(path: str | os.PathLike | None, fps: float) -> contextlib.AbstractContextManager:
    """``Mp4Writer(path, fps)`` as a context (the file lands on success, an exception leaves ``path`` as it
    was), or a context yielding None when ``path`` is None: one ``with`` for episodes with and without video."""
    return contextlib.nullcontext() if path is None else Mp4Writer(path, fps)


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: float, codec: str | None = None) -> Path:
    """Write ``(T, H, W, 3)`` uint8 frames to ``path`` as mp4; returns the path."""
    with Mp4Writer(path, fps, codec) as writer:
        writer.write(frames)
    return writer.path


def read_video(path: str | os.PathLike) -> np.ndarray:
    """Every frame of a video file as ``(T, H, W, 3)`` uint8 RGB."""
    import av

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    if not frames:
        return np.zeros((0, 0, 0, 3), np.uint8)
    return np.stack(frames)
