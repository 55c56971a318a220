"""A session's window geometry over latent frames, expressed through the reference `WindowSchedule`.

Latent frame 0 is the clean first frame; each window generates ``n = latents_per_window`` new frames.
Chained windows re-pin their predecessor's last frame: the schedule of ``n + 1``-unit windows overlapping by
one, over latent frames from 0, whose first window's leading unit is frame 0 itself. KV windows do not
overlap (they attend to the committed frames): the schedule of ``n``-unit windows over frames 1.., the first
led by frame 0. Either way, a window's plan in latent frames is the schedule's window shifted by ``offset``,
with the first window reaching back to frame 0 as clean conditioning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .config import RolloutKnobs
from .windowing import RetentionPolicy, WindowPlan, WindowSchedule

LEAD_FRAMES = 1
"""Latent frames given before anything is generated: the encoded first image."""


@dataclass(frozen=True)
class LatentWindows:
    """The open-ended windows of one session in latent frames (``schedule`` unit u is frame ``u + offset``)."""

    schedule: WindowSchedule
    offset: int

    @classmethod
    def of(cls, knobs: RolloutKnobs) -> LatentWindows:
        n = knobs.latents_per_window
        if knobs.window_mode == "chained":
            return cls(WindowSchedule(None, n + 1, context_units=knobs.context_frames, overlap_units=1), 0)
        return cls(WindowSchedule(None, n, context_units=knobs.context_frames), LEAD_FRAMES)

    @property
    def context_units(self) -> int:
        return self.schedule.context_units

    def window(self, index: int) -> WindowPlan:
        """Latent frames ``[start, end)`` of window ``index``, the first ``cond_units`` clean."""
        plan = self.schedule.window(index)
        if index == 0:  # frame 0 leads the first window as its clean conditioning
            return WindowPlan(0, 0, plan.end + self.offset, LEAD_FRAMES)
        return WindowPlan(index, plan.start + self.offset, plan.end + self.offset, plan.cond_units)

    def windows(self) -> Iterator[WindowPlan]:
        return (self.window(plan.index) for plan in self.schedule.windows())

    def retention(self, tokens_per_unit: int, prefix_tokens: int) -> RetentionPolicy | None:
        return self.schedule.retention(tokens_per_unit, prefix_tokens)
