"""Device work in two lanes, and clocks that time it without stalling the device.

On CUDA a `DecodeLane` runs decodes on their own stream, each ordered after the work that produced its input
by an event (never a device-wide synchronize), so the decode of one group overlaps the denoise of the next.
On a CPU there is one lane: work runs in place, in submission order. A `PhaseClock` times phases with CUDA
events on CUDA (read once the work is done, when the results are fetched anyway) and with the host clock on a
CPU, so timing never adds a synchronisation point.

Memory that crosses streams is handed over with `hand_over`, the one place that rule lives: the reading stream
waits for the event recorded after the memory was last written (`written_event`), and each tensor is recorded
on the reading stream, so the caching allocator gives its memory to no other work (on the stream that made it)
until the reader's queued work is done, even when the host drops the tensor at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


class PhaseClock:
    """Marks on one device; `seconds(a, b)` is the time between two marks."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: dict[str, Any] = {}

    def mark(self, name: str, stream: torch.cuda.Stream | None = None) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
            self._marks[name] = event
        else:
            self._marks[name] = time.perf_counter()

    def seconds(self, start: str, end: str) -> float:
        """Seconds from mark ``start`` to mark ``end`` (on CUDA, waits for ``end`` to have happened)."""
        a, b = self._marks[start], self._marks[end]
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a


class DecodeLane:
    """A second lane for decodes: its own CUDA stream on CUDA, the calling thread's lane on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextmanager
    def after_current_work(self) -> Iterator[torch.cuda.Stream | None]:
        """Run the body on the lane, after everything already queued on the current stream."""
        if self.stream is None:
            yield None
            return
        ready = torch.cuda.Event()
        ready.record()  # on the current (denoise) stream
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            yield self.stream

    def join(self) -> None:
        """Make the current stream wait for everything queued on the lane (an event, not a synchronize)."""
        if self.stream is not None:
            done = torch.cuda.Event()
            done.record(self.stream)
            torch.cuda.current_stream().wait_event(done)

    def run(self, fn: Callable[[], Any]) -> Any:
        with self.after_current_work():
            return fn()


def streams_enabled(device: torch.device) -> bool:
    """Whether work on ``device`` is queued on CUDA streams (the only case in which memory can cross them)."""
    return device.type == "cuda"


def hand_over(device: torch.device, tensors: Iterable[torch.Tensor], written: Any = None) -> None:
    """Let the current stream use ``tensors``, whichever stream made them and last wrote them (``written``: the
    event `written_event` recorded there, or None): it waits for that event, and records each tensor, so its
    memory is not reused before the current stream's work on it has run."""
    if not streams_enabled(device):
        return
    stream = torch.cuda.current_stream(device)
    if written is not None:
        stream.wait_event(written)
    for t in tensors:
        t.record_stream(stream)


def written_event(device: torch.device) -> Any:
    """An event after the work queued so far on the current stream (None without streams): what a reader on
    another stream passes to `hand_over`."""
    if not streams_enabled(device):
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
