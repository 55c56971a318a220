"""How a long run is kept: working stretches of wall time, atomic state files, the JSONL log and the LR schedule."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch


class StretchEnded(Exception):
    """The stretch's wall time is spent; the phase checkpointed the step it reached."""


class Stretch:
    """The wall time of one working stretch of a long run (`--stop-after-minutes`)."""

    def __init__(self, minutes: float) -> None:
        self.deadline = time.monotonic() + minutes * 60 if minutes > 0 else None

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


class RunLog:
    """Append-only JSONL loss log plus wall-clock accounting per phase."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **record: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def cosine_lr(base: float, progress: float, step: int, warmup: int = 50) -> float:
    """Linear warmup over `warmup` steps, constant to 70% of the phase, then cosine down to 5%.

    The phase is time-based on a shared CPU whose speed varies 10x; a cosine over the whole phase
    decays the rate during slow stretches and leaves the fast ones with nothing (seen: a VAE whose
    last 200 of 260 steps ran below 2e-5).
    """
    if step < warmup:
        return base * (step + 1) / warmup
    if progress < 0.7:
        return base
    tail = min(1.0, (progress - 0.7) / 0.3)
    return base * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * tail)))


def save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


class PhaseBudget:
    """Where a phase stands: a fixed step count, or wall time against a budget (the CPU is shared, so a
    step-count plan made from a few probe steps is fragile; time-based phases always end on time)."""

    def __init__(self, budget_s: float, fixed_steps: int, step: int = 0, elapsed: float = 0.0) -> None:
        self.budget_s, self.fixed_steps, self.step, self.elapsed = budget_s, fixed_steps, step, elapsed
        self._mark = time.perf_counter()

    @property
    def fraction(self) -> float:
        if self.fixed_steps > 0:
            return self.step / self.fixed_steps
        return (self.elapsed + time.perf_counter() - self._mark) / self.budget_s

    def advance(self) -> None:
        self.step += 1

    def state(self) -> dict[str, float]:
        return {"step": self.step, "elapsed": self.elapsed + time.perf_counter() - self._mark}
