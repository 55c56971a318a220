"""Dependency-free PNG charts (PIL): line and bar charts for replay and the fidelity report; matplotlib is not a
worldstep dependency."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127)]


def _frame(draw: ImageDraw.ImageDraw, box, title: str, xlabel: str, ylabel: str, lo: float, hi: float) -> None:
    x0, y0, x1, y1 = box
    draw.rectangle(box, outline=(0, 0, 0))
    draw.text((x0, 8), title, fill=(0, 0, 0))
    draw.text(((x0 + x1) // 2 - 20, y1 + 22), xlabel, fill=(0, 0, 0))
    draw.text((4, y0 - 14), ylabel, fill=(0, 0, 0))
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        y = y1 - (y1 - y0) * i / 4
        draw.line([(x0 - 4, y), (x0, y)], fill=(0, 0, 0))
        draw.text((4, y - 6), f"{v:.3g}", fill=(0, 0, 0))


def line_chart(path: Path, series: dict[str, list[float]], title: str, xlabel: str, ylabel: str,
               intervals: dict[str, tuple[list[float], list[float]]] | None = None) -> Path:
    """One line per series over x = 1..len (NaNs and Nones skipped), legend on the right; ``intervals`` (a series'
    ``(low, high)`` per point) draws a vertical bar through each point."""
    series = {k: [np.nan if v is None else v for v in s] for k, s in series.items()}
    bands = {k: [[np.nan if v is None else v for v in side] for side in pair] for k, pair in (intervals or {}).items()}
    img = Image.new("RGB", (720, 420), "white")
    draw = ImageDraw.Draw(img)
    box = (60, 30, 540, 370)
    values = [v for s in [*series.values(), *(side for pair in bands.values() for side in pair)] for v in s
              if np.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    lo, hi = (lo - 0.5, hi + 0.5) if hi - lo < 1e-9 else (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    _frame(draw, box, title, xlabel, ylabel, lo, hi)

    def at(i: int, v: float) -> tuple[float, float]:
        return box[0] + (box[2] - box[0]) * (i / max(1, n - 1)), box[3] - (box[3] - box[1]) * (v - lo) / (hi - lo)

    n = max((len(s) for s in series.values()), default=1)
    for k, (name, s) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        pts = [at(i, v) for i, v in enumerate(s) if np.isfinite(v)]
        for i, (low, high) in enumerate(zip(*bands.get(name, ([], [])))):
            if np.isfinite(low) and np.isfinite(high):
                draw.line([at(i, low), at(i, high)], fill=colour, width=1)
        if len(pts) > 1:
            draw.line(pts, fill=colour, width=2)
        for p in pts:
            draw.ellipse([p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2], fill=colour)
        draw.text((552, 40 + 16 * k), name, fill=colour)
    for i in range(n):
        draw.text((box[0] + (box[2] - box[0]) * (i / max(1, n - 1)) - 3, box[3] + 4), str(i + 1), fill=(0, 0, 0))
    img.save(path)
    return path


def bar_chart(path: Path, labels: list[str], groups: dict[str, list[float]], title: str, ylabel: str,
              intervals: dict[str, list[list[float]]] | None = None) -> Path:
    """Grouped bars (one group per label, one bar per series), values in [0, 1]; `intervals` draws a
    whisker [low, high] on each bar of the series it names."""
    img = Image.new("RGB", (760, 420), "white")
    draw = ImageDraw.Draw(img)
    box = (60, 30, 600, 360)
    _frame(draw, box, title, "", ylabel, 0.0, 1.0)
    width = (box[2] - box[0]) / max(1, len(labels))
    bar = width * 0.8 / max(1, len(groups))
    for g, (name, values) in enumerate(groups.items()):
        colour = COLOURS[g % len(COLOURS)]
        for i, v in enumerate(values):
            x = box[0] + i * width + width * 0.1 + g * bar
            draw.rectangle([x, box[3] - (box[3] - box[1]) * float(v), x + bar - 1, box[3]], fill=colour)
            low, high = (intervals or {}).get(name, [[None, None]] * len(values))[i]
            if low is not None and high is not None and np.isfinite(low) and np.isfinite(high):
                xc = x + bar / 2
                y_low, y_high = (box[3] - (box[3] - box[1]) * float(b) for b in (low, high))
                draw.line([(xc, y_low), (xc, y_high)], fill=(0, 0, 0), width=1)
                draw.line([(xc - 3, y_low), (xc + 3, y_low)], fill=(0, 0, 0))
                draw.line([(xc - 3, y_high), (xc + 3, y_high)], fill=(0, 0, 0))
        draw.text((612, 40 + 16 * g), name, fill=colour)
    for i, label in enumerate(labels):
        draw.text((box[0] + i * width + 2, box[3] + 6 + 12 * (i % 3)), label[:16], fill=(0, 0, 0))
    img.save(path)
    return path
