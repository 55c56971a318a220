"""Side-by-side timing on a shared, noisy machine.

Absolute times on a 2-core box shared with other work drift by 2x within a minute, so every
comparison runs its alternatives interleaved round by round (rotating who goes first), drops
warm-up rounds, and reports medians and ratios of medians: drift then hits every alternative alike.
Each call is also timed in process CPU seconds: with one intra-op thread (`--threads 1`) that is about
what the call takes on an idle core, the figure to read when the machine is loaded.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Samples:
    """Wall-clock and process CPU seconds of one alternative, warm-up rounds excluded."""

    name: str
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return median(self.seconds)

    @property
    def median_ms(self) -> float:
        return 1e3 * self.median_s

    @property
    def median_cpu_ms(self) -> float:
        return 1e3 * median(self.cpu_seconds)


class Stopwatch:
    """Wall-clock and process CPU seconds since it was made: `wall, cpu = watch.elapsed()`."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def elapsed(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


class SyncedStopwatch(Stopwatch):
    """A `Stopwatch` for work queued on a device: ``sync`` (`device_sync`) runs before it starts and before each
    reading, so the time is the device's work and not the host's queueing of it (CUDA launches return at once)."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        sync()  # work queued before the stopwatch is not charged to it
        super().__init__()

    def elapsed(self) -> tuple[float, float]:
        self.sync()
        return super().elapsed()


def device_sync(device) -> Callable[[], None]:
    """What a host stopwatch must call to wait for ``device`` (a `torch.device` or its name): a CUDA
    synchronize of that device, nothing on a CPU (its work has finished when the call returns)."""
    import torch
    from worldstep.engine.devices import canonical_device

    device = canonical_device(device)
    if device.type != "cuda":
        return lambda: None
    return lambda: torch.cuda.synchronize(device)


def interleave(alternatives: dict[str, Callable[[], object]], rounds: int, warmup: int) -> dict[str, Samples]:
    """Run every alternative once per round, the starting one rotating; keep rounds after `warmup`.

    Args:
        alternatives: name -> a callable doing one unit of work (one env step, one rollout, ...).
        rounds: measured rounds (each alternative runs once per round).
        warmup: rounds run first and discarded (first calls allocate, fill caches, warm allocators).
    """

    def timed(fn: Callable[[], object]) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            watch = Stopwatch()
            fn()
            return watch.elapsed()

        return run

    return interleave_timed({name: timed(fn) for name, fn in alternatives.items()}, rounds, warmup)


def interleave_timed(alternatives: dict[str, Callable[[], tuple[float, float]]], rounds: int,
                     warmup: int) -> dict[str, Samples]:
    """`interleave` for callables that time themselves (to leave their setup out) and return
    `Stopwatch.elapsed()`: (wall, CPU) seconds."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds={rounds}, warmup={warmup} are invalid; allowed: rounds >= 1, warmup >= 0")
    names = list(alternatives)
    samples = {name: Samples(name) for name in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = alternatives[name]()
            if r >= warmup:
                samples[name].seconds.append(wall)
                samples[name].cpu_seconds.append(cpu)
    return samples


def ratio_estimate(numerator: Sequence[float], denominator: Sequence[float]):
    """median(numerator) / median(denominator) with its 95% bootstrap interval over paired rounds (round i of
    each alternative ran in the same interleaved round): an `Estimate` (`worldstep.measures.intervals`)."""
    import numpy as np

    from ..measures.intervals import bootstrap

    a, b = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"paired rounds are {len(a)} and {len(b)}; allowed: the same number, at least 1")
    return bootstrap(lambda idx: ratio(float(np.median(a[idx])), float(np.median(b[idx]))), len(a))


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else float("nan")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if len(values) else float("nan")


def rss_bytes() -> int:
    """Resident set size of this process from /proc/self/statm (psutil is not a dependency)."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: peak RSS is the best we have
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
