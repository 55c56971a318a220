"""A guard that turns every host read of a tensor into an error, for code that must never wait for the device.

On a GPU each of these blocks the host until the device has caught up: `.item()`, `.tolist()`, `.cpu()`,
`.numpy()`, `bool(t)`, `float(t)`, `int(t)` and `.to()` a CPU device. A CPU run cannot observe the waits, so the
guard refuses the calls themselves; the GPU check runs the same loop under `torch.cuda.set_sync_debug_mode`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


class HostSyncError(AssertionError):
    """A tensor was read on the host where the code must not wait for the device."""


def _to_cpu(args, kwargs) -> bool:
    targets = [*args, kwargs.get("device")]
    return any(isinstance(t, (str, torch.device)) and torch.device(t).type == "cpu" for t in targets)


@contextmanager
def refuse_host_syncs() -> Iterator[list[str]]:
    """Inside the block, the reads above raise `HostSyncError`; yields the names of the reads refused."""
    refused: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in (*READS, "to")}

    def refuse(name):
        def read(self, *args, **kwargs):
            refused.append(name)
            raise HostSyncError(f"Tensor.{name} inside a loop that must not wait for the device")
        return read

    def to(self, *args, **kwargs):
        if _to_cpu(args, kwargs):
            refused.append("to(cpu)")
            raise HostSyncError("Tensor.to(cpu) inside a loop that must not wait for the device")
        return saved["to"](self, *args, **kwargs)

    try:
        for name in READS:
            setattr(torch.Tensor, name, refuse(name))
        torch.Tensor.to = to
        yield refused
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
