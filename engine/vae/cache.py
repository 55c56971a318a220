"""The Wan decoder's causal-conv cache: one slot per `WanCausalConv3d`, owned by one session.

diffusers' decoder reads and writes a plain list `feat_cache` (one slot per causal conv, in call
order). A slot is `None` before the conv has run, the string ``"Rep"`` for an `upsample3d`
time-conv after latent 0 (latent 0 is not doubled in time), or a tensor holding the last time steps
the conv saw. diffusers replaces slots and never edits a stored tensor in place, and so does this
package; a shallow copy of the list is therefore a valid snapshot (fork, retry).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
from torch import nn

Slot = torch.Tensor | str | None


def count_slots(decoder: nn.Module) -> int:
    """Number of cache slots `decoder.forward` indexes (one per causal conv, in any layout copy)."""
    return sum(isinstance(m, WanCausalConv3d) for m in decoder.modules())


def empty_cache(num_slots: int) -> list[Slot]:
    return [None] * num_slots


def slot_tensors(slots: list[Slot]) -> Iterator[torch.Tensor]:
    """The tensors of a cache, skipping `None` and `"Rep"` slots."""
    return (s for s in slots if isinstance(s, torch.Tensor))


def session_tensors(session) -> list[torch.Tensor]:
    """Every tensor a `DecodeSession` holds between windows: its cache slots and its retained context."""
    context = [] if session.context is None else [session.context]
    return [*slot_tensors(session.slots or []), *context]


def cache_nbytes(slots: list[Slot] | None) -> int:
    return 0 if slots is None else sum(t.nbytes for t in slot_tensors(slots))


def owns_storage(t: torch.Tensor) -> bool:
    """True when `t` is not a view pinning a larger buffer (its storage is exactly its bytes)."""
    return t.untyped_storage().nbytes() == t.nbytes


def compact(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when it owns its storage, else an owning copy (same memory format when dense)."""
    return t if owns_storage(t) else t.clone()


def compact_slots(slots: list[Slot]) -> None:
    """Replace every slot that is a view of a larger activation by a compact copy."""
    for i, s in enumerate(slots):
        if isinstance(s, torch.Tensor):
            slots[i] = compact(s)


def slot_signature(slots: list[Slot] | None) -> tuple:
    """What a cache holds, slot by slot (marker or tensor shape and dtype): caches with equal signatures stack."""
    if slots is None:
        return ()
    return tuple(s if not isinstance(s, torch.Tensor) else (tuple(s.shape), s.dtype) for s in slots)


def stack_slots(caches: list[list[Slot]]) -> list[Slot]:
    """One cache for a batch of sessions: each tensor slot concatenated along the batch (the sessions' caches must
    have one `slot_signature`; marker slots are then equal and kept as they are)."""
    return [_cat_batch(group) if isinstance(group[0], torch.Tensor) else group[0] for group in zip(*caches)]


def _cat_batch(group: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """`torch.cat(group)` in the layout of `group[0]`: `cat` infers its output's layout from the strides, and
    those of a one-frame channels-last slot are ambiguous, so it would fall back to the standard layout."""
    first = group[0]
    channels_last = first.dim() == 5 and first.is_contiguous(memory_format=torch.channels_last_3d)
    fmt = torch.channels_last_3d if channels_last and not first.is_contiguous() else torch.contiguous_format
    out = torch.empty((sum(t.shape[0] for t in group), *first.shape[1:]), dtype=first.dtype, device=first.device,
                      memory_format=fmt)
    return torch.cat(group, out=out)


def split_slots(slots: list[Slot], batch: int) -> list[list[Slot]]:
    """The per-session caches of a stacked cache: views along the batch (`compact_slots` makes them own storage)."""
    return [[s[b : b + 1] if isinstance(s, torch.Tensor) else s for s in slots] for b in range(batch)]
