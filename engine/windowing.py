"""Window arithmetic for an autoregressive rollout, and the KV retention it implies.

Pure arithmetic over abstract units (latent frames for video models): which units a window covers,
which it newly commits, and which may be released once it has committed. Freeing pages is the KV
cache's job (`PagedAllocationManager.apply_retention`); this module imports neither torch nor model
code.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass


def _check_int(name: str, value: object, minimum: int) -> int:
    # bool is an int subclass; True as a window size is always a mistake
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class RetentionPolicy:
    """What a window commit keeps of its stream: ``protected_tokens`` of head plus ``context_tokens`` behind the frontier."""

    protected_tokens: int
    context_tokens: int

    def __post_init__(self) -> None:
        _check_int("protected_tokens", self.protected_tokens, 0)
        _check_int("context_tokens", self.context_tokens, 0)

    def tokens_to_release(self, seq_len: int) -> int:
        """Tokens past the horizon for a stream holding ``seq_len`` tokens (the cache page-floors it)."""
        _check_int("seq_len", seq_len, 0)
        return max(0, seq_len - self.protected_tokens - self.context_tokens)


@dataclass(frozen=True)
class WindowPlan:
    """One window's slice of the rollout, in absolute units.

    The leading ``cond_units`` re-pin the tail of the previous window as clean conditioning (the
    overlap; 0 for the first window). ``commit_start:commit_end`` is the span this window newly
    generates and appends to the cache.
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
    """Window arithmetic for one rollout.

    ``total_units`` are generated in windows of ``window_units`` advancing by
    ``window_units - overlap_units``; the last window may be short, and commit spans partition
    ``[0, total_units)``. ``total_units=None`` is open-ended: windows go on for ever. ``context_units``
    bounds the committed history kept after each commit; 0 keeps everything. A nonzero
    ``context_units`` must cover the overlap, or a release would free units the next window
    conditions on.
    """

    total_units: int | None
    window_units: int
    context_units: int = 0
    overlap_units: int = 0

    def __post_init__(self) -> None:
        if self.total_units is not None:
            _check_int("total_units", self.total_units, 1)
        _check_int("window_units", self.window_units, 1)
        _check_int("context_units", self.context_units, 0)
        _check_int("overlap_units", self.overlap_units, 0)
        if self.overlap_units >= self.window_units:
            raise ValueError(
                f"overlap_units ({self.overlap_units}) must be < window_units ({self.window_units}), "
                "or windows never advance"
            )
        if 0 < self.context_units < self.overlap_units:
            raise ValueError(
                f"context_units ({self.context_units}) must be 0 (keep everything) or >= overlap_units "
                f"({self.overlap_units}): a smaller context frees units inside the next window"
            )

    @property
    def stride(self) -> int:
        return self.window_units - self.overlap_units

    @property
    def num_windows(self) -> int | None:
        """Windows needed to commit every unit; None for an open-ended schedule."""
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
        return WindowPlan(index, start, end, self.overlap_units if index > 0 else 0)

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
        _check_int("tokens_per_unit", tokens_per_unit, 1)
        _check_int("prefix_tokens", prefix_tokens, 0)
        if self.context_units == 0:
            return None
        return RetentionPolicy(prefix_tokens, self.context_units * tokens_per_unit)

    def _check_index(self, index: int) -> None:
        _check_int("index", index, 0)
        if self.num_windows is not None and index >= self.num_windows:
            raise ValueError(f"index must be < num_windows={self.num_windows}, got {index}")
