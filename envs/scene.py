"""The default first frame: a tabletop drawn from the env's RNG when no image is given."""

from __future__ import annotations

import numpy as np


def draw_tabletop(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A dark table with a blue block and a red end-effector at positions drawn from ``rng``.

    Returns an ``(height, width, 3)`` uint8 frame. Only ``rng`` varies the frame, so the same
    generator state gives the same frame.
    """
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    frame = (np.array([18, 20, 26], np.float32) + rows * np.array([40, 36, 30], np.float32)).repeat(width, 1)
    size = max(2, min(height, width) // 8)
    for colour in ((40, 90, 220), (220, 40, 40)):  # block, then effector
        top = int(rng.integers(0, height - size))
        left = int(rng.integers(0, width - size))
        frame[top : top + size, left : left + size] = colour
    return frame.astype(np.uint8)
