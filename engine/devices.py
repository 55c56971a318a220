"""Canonical devices: the one form of a device the engine stores and compares.

torch has several spellings of one device, and they do not compare equal: ``torch.device("cuda")``
differs from ``torch.device("cuda:0")``, yet every CUDA tensor reports the indexed form, and a tensor
made on ``"cpu:0"`` reports plain ``cpu``. A cache that kept the spelling it was given would refuse
its own tensors (the first GPU run's bug). So every device the engine keeps goes through
`canonical_device` once, where it enters, and is then the form its tensors report:

| given                                   | canonical            |
|-----------------------------------------|----------------------|
| ``"cpu"``, ``"cpu:0"``, ``torch.device("cpu", 3)`` | ``cpu`` (CPU tensors never carry an index) |
| ``"cuda"``, ``torch.device("cuda")``    | ``cuda:<torch.cuda.current_device()>`` |
| ``"cuda:1"``, ``1`` (an index: CUDA)    | ``cuda:1``           |
| any other type with an index            | unchanged            |
"""

from __future__ import annotations

import torch

DEVICE_SPELLINGS = "'cpu', 'cuda', 'cuda:N', a torch.device or a CUDA index N >= 0"


def canonical_device(spec: str | int | torch.device, *, name: str = "device") -> torch.device:
    """The form tensors made on ``spec`` report; ValueError naming ``name`` for a spelling torch refuses,
    a negative index, or CUDA where this machine has none."""
    if isinstance(spec, bool) or not isinstance(spec, (str, int, torch.device)):
        raise ValueError(f"{name}={spec!r} is invalid; allowed: {DEVICE_SPELLINGS}")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"{name}={spec!r} is invalid; allowed: {DEVICE_SPELLINGS}")
        spec = torch.device("cuda", spec)  # torch's int means the current accelerator; the engine's is CUDA
    try:
        device = torch.device(spec)
    except RuntimeError as err:
        raise ValueError(f"{name}={spec!r} is not a torch device ({err}); allowed: {DEVICE_SPELLINGS}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={spec!r}: CUDA is not available on this machine (torch {torch.__version__});"
                             " allowed: 'cpu'")
        if device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_device(spec: str | int | torch.device, *, name: str = "device") -> torch.device:
    """``"auto"`` (CUDA when this machine has it, else the CPU) or any `canonical_device` spelling, as its
    canonical device: the one place ``auto`` is decided. ValueError naming ``name`` as `canonical_device`."""
    if isinstance(spec, str) and spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    return canonical_device(spec, name=name)
