"""A side-by-side mp4 of clips (recorded | model | baseline), as replay and the fidelity report write them."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def side_by_side_mp4(path: Path, columns: list[np.ndarray], fps: int = 8, scale: int = 4) -> Path:
    """Write clips `[T, H, W, 3]` (equal T) next to each other, upscaled `scale`x (nearest), as H.264/MPEG-4."""
    import av

    frames = np.concatenate(columns, axis=2)  # [T, H, sum W, 3]
    frames = frames.repeat(scale, axis=1).repeat(scale, axis=2)
    height, width = frames.shape[1] - frames.shape[1] % 2, frames.shape[2] - frames.shape[2] % 2
    with av.open(str(path), mode="w") as container:
        try:
            stream = container.add_stream("libx264", rate=fps)
        except Exception:  # noqa: BLE001 - any missing encoder: fall back to MPEG-4 part 2
            stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for f in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(f[:height, :width]), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
