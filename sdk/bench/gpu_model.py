"""The few engine calls the GPU bench and the GPU checks make: a model over in-memory modules, sessions, rows,
warm-up to full context.

Several models may share one set of modules (`Cosmos3Components`), each with its own KV pool and attention
backend: that is how the bench and `tests/gpu/check_cosmos3_backends.py` compare backends on identical
weights without building Edge twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .archs import PROMPT, first_frame


def edge_model(components, arch, device: torch.device, backend: str, *, height: int | None = None,
               width: int | None = None, num_pages: int = 512, **knobs):
    """A `Cosmos3WorldModel` over in-memory modules (several may share them, each with its own KV pool);
    ``knobs``: more constructor keywords (`gpu_variants.model_kwargs`: decoder options, CUDA graphs, ...).

    Decode overlap is off: the engine's overlap splits a group of sessions in halves (two forwards per
    denoise step), and every figure here says "N sessions" for ONE forward of N.
    """
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

    return Cosmos3WorldModel(components, device=device, num_pages=num_pages, page_size=arch.page_size,
                             attention_backend=backend, height=height or arch.height,
                             width=width or arch.width, name=f"bench-{arch.name}", overlap_decode=False, **knobs)


@contextmanager
def counting_forwards(model) -> Iterator[list[int]]:
    """A one-item list counting the transformer's generation forwards inside the block: the calls of its
    final norm (the engine runs the layer internals itself; every generation forward, denoise step or
    commit, ends in `norm_moe_gen` once, whatever its number of rows)."""
    calls = [0]

    def hook(*_) -> None:
        calls[0] += 1

    handle = model.transformer.norm_moe_gen.register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def open_sessions(model, arch, knobs, count: int, seed: int = 0, domains: list[int] | None = None) -> list:
    """`count` sessions on the bench's first frame and prompt, each with its own generator (and embodiment:
    `domains[i]`, default the arch's)."""
    frame = first_frame(model.spec.height, model.spec.width)
    domains = domains or [arch.domain_id] * count
    return [model.open_session(frame, PROMPT, domains[i], knobs=knobs,
                               generator=torch.Generator().manual_seed(seed + i), action_width=arch.action_width)
            for i in range(count)]


def rows(model, sessions: list) -> list[tuple[int, int]]:
    """(fresh tokens, attended tokens) per row of the sessions' next window, for the FLOP count."""
    out = []
    for session in sessions:
        q = session.plan.units * model.spec.tokens_per_frame + session.knobs.chunk_size  # the next window's tokens
        out += [(q, model.kv.page_table(key).seq_len + q) for key in session.keys]
    return out


MAX_WARM_UP = 12  # windows; Edge's 8-frame context is full after 2, the tiny arch's after 8


def fill_context(model, session, chunks) -> dict[str, Any]:
    """Step warm-up windows until the context holds all it keeps (the commit released pages behind the
    horizon), so every timed window attends to the same context length; at least one window (it warms
    kernels, allocators and the decoder cache) and at most `MAX_WARM_UP`."""
    main = session.keys[0]
    for count in range(1, MAX_WARM_UP + 1):
        model.step([session], [next(chunks)])
        if model.kv.page_table(main).released_tokens > 0:
            return {"windows": count, "full": True}
    return {"windows": MAX_WARM_UP, "full": False}
