"""What a replay measures per episode: the series it scores and the metrics, and one episode's per-window means."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..measures.frames import psnr, ssim

SERIES = ("model", "first_frame_held", "vae_round_trip")
METRICS = {"psnr_db": psnr, "ssim": ssim}


@dataclass
class EpisodeScores:
    """One replayed episode: per series and metric, the mean of each window (``[windows]``)."""

    index: int
    task: str
    windows: int
    noise_seed: int
    scores: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    video: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {"episode": self.index, "task": self.task, "windows": self.windows, "noise_seed": self.noise_seed,
                "video": self.video, **{s: self.scores[s] for s in SERIES}}
