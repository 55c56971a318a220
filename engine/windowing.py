"""Window arithmetic for an autoregressive rollout, and the KV retention it implies.

Pure arithmetic over abstract units (latent frames for video models): which units a window covers, which
of them are clean conditioning, which it newly commits, and which may be released once it has committed.
Freeing pages is the KV cache's job (`StreamTable.apply_retention`); this module imports neither torch nor
model code.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from .checks import check_int


@dataclass(frozen=True)
class RetentionPolicy:
    """What a window commit keeps of its stream: ``protected_tokens`` of head plus ``context_tokens`` behind the
    frontier."""

    protected_tokens: int
    context_tokens: int

    def __post_init__(self) -> None:
        check_int("protected_tokens", self.protected_tokens, 0)
        check_int("context_tokens", self.context_tokens, 0)

    def tokens_to_release(self, seq_len: int) -> int:
        """Tokens past the horizon for a stream holding ``seq_len`` tokens (the cache page-floors it)."""
        check_int("seq_len", seq_len, 0)
        return max(0, seq_len - self.protected_tokens - self.context_tokens)


@dataclass(frozen=True)
class WindowPlan:
    """One window's slice of a windowed generation, in absolute units.

    The leading ``cond_units`` re-pin the tail of the previous window as clean conditioning (the overlap; 0
    for the first window and when there is no overlap). ``commit_start:commit_end`` is the span this window
    newly generates, the span a kv-mode commit appends to the cache (the overlap was committed before).
    """

    index: int
    start: int
    end: int
    cond_units: int

    @property
    def units(self) -> int:
        return self.end - self.start

    @property
    def commit_start(self) -> int:
        return self.start + self.cond_units

    @property
    def commit_end(self) -> int:
        return self.end


@dataclass(frozen=True)
class WindowSchedule:
    """Window arithmetic for one request.

    ``total_units`` are generated in windows of ``window_units`` advancing by ``window_units - overlap_units``;
    the final window may be short, and every unit is generated exactly once (commit spans partition
    ``[0, total)``). ``total_units=None`` is open-ended. ``context_units`` bounds the committed history kept
    after each commit (0 keeps everything); a nonzero one must cover the overlap, or a release would free
    units the next window conditions on.
    """

    total_units: int | None
    window_units: int
    context_units: int = 0
    overlap_units: int = 0

    def __post_init__(self) -> None:
        if self.total_units is not None:
            check_int("total_units", self.total_units, 1)
        check_int("window_units", self.window_units, 1)
        check_int("context_units", self.context_units, 0)
        check_int("overlap_units", self.overlap_units, 0)
        if self.overlap_units >= self.window_units:
            raise ValueError(f"overlap_units={self.overlap_units} is invalid; allowed: an int < window_units="
                             f"{self.window_units} (a window must generate something)")
        if 0 < self.context_units < self.overlap_units:
            raise ValueError(f"context_units={self.context_units} is invalid; allowed: 0 (keep everything) or "
                             f">= overlap_units={self.overlap_units} (a smaller context frees units inside the "
                             "next window)")

    @property
    def stride(self) -> int:
        """Units between the starts of two windows."""
        return self.window_units - self.overlap_units

    @property
    def num_windows(self) -> int | None:
        """Windows needed to generate every unit; None for an open-ended schedule."""
        if self.total_units is None:
            return None
        beyond_first = max(0, self.total_units - self.window_units)
        return 1 + -(-beyond_first // self.stride)

    def window(self, index: int) -> WindowPlan:
        self._check_index(index)
        start = index * self.stride
        end = start + self.window_units
        if self.total_units is not None:
            end = min(end, self.total_units)
        return WindowPlan(index, start, end, self.overlap_units if index else 0)

    def windows(self) -> Iterator[WindowPlan]:
        """Every window in order; endless when the schedule is open-ended."""
        indices = itertools.count() if self.num_windows is None else range(self.num_windows)
        return (self.window(i) for i in indices)

    def released_end(self, index: int) -> int:
        """Units released from the front once window ``index`` committed (0 when context is unbounded)."""
        plan = self.window(index)
        if self.context_units == 0:
            return 0
        return max(0, plan.commit_end - self.context_units)

    def retention(self, tokens_per_unit: int, prefix_tokens: int) -> RetentionPolicy | None:
        """The cache retention a window commit declares: ``prefix_tokens`` protected, the horizon behind.

        None when the schedule keeps everything. The cache page-floors releases and the shortfall is
        re-offered at the next commit, so the realized context tracks the nominal one within a page.
        """
        check_int("tokens_per_unit", tokens_per_unit, 1)
        check_int("prefix_tokens", prefix_tokens, 0)
        if self.context_units == 0:
            return None
        return RetentionPolicy(prefix_tokens, self.context_units * tokens_per_unit)

    def _check_index(self, index: int) -> None:
        check_int("index", index, 0)
        if self.num_windows is not None and index >= self.num_windows:
            raise ValueError(f"index={index} is invalid; allowed: an int < num_windows={self.num_windows}")
