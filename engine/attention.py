"""Attention over [committed K/V in the paged cache | this step's fresh K/V], for a batch of streams.

One Enum (`AttentionBackendName`), one function per backend, one dispatch point (`paged_attention`).
Every backend computes the same thing: each stream's queries attend, non-causally, to its committed
tokens (read through a `PageTable` snapshot) followed by its fresh tokens of this step, with GQA and
the default scale ``1/sqrt(head_dim)``. Model code builds a `PagedAttentionBatch` once per window,
`prime`s it once per forward (the checks, the staleness check and the gathers or the plan, into an
`AttentionForward`), and each layer's `paged_attention` is dispatch and maths; it never branches on the backend.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from enum import Enum

import torch
import torch.nn.functional as F

from .checks import check_int
from .devices import canonical_device
from .flashinfer_kernels import FlashinferKernels, Layout, load_problem
from .kv import PagedKVCache, PageTable, StreamKey

FLASHINFER_HEAD_DIMS = (64, 128, 256)
FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)


class AttentionBackendName(str, Enum):
    SDPA = "sdpa"
    FLASHINFER = "flashinfer"
    AUTO = "auto"


def flashinfer_available() -> bool:
    """Whether flashinfer is installed, without importing it (it needs CUDA to import cleanly)."""
    return importlib.util.find_spec("flashinfer") is not None


def resolve_backend(
    name: str | AttentionBackendName,
    device: str | torch.device,
    *,
    dtype: torch.dtype | None = None,
    head_dim: int | None = None,
) -> AttentionBackendName:
    """Turn a configured backend into the one that will run on ``device``.

    ``auto`` takes flashinfer when CUDA and flashinfer are there and its kernels fit ``dtype`` and
    ``head_dim`` and load (when both are given), else sdpa. An explicit ``flashinfer`` that cannot run raises
    ValueError naming ``attention_backend`` and the reason.
    """
    try:
        name = AttentionBackendName(name)
    except ValueError:
        allowed = ", ".join(repr(b.value) for b in AttentionBackendName)
        raise ValueError(f"attention_backend must be one of {allowed}, got {name!r}") from None
    device = canonical_device(device)
    problems = flashinfer_problems(device, dtype, head_dim)
    if name is AttentionBackendName.AUTO:
        return AttentionBackendName.SDPA if problems else AttentionBackendName.FLASHINFER
    if name is AttentionBackendName.FLASHINFER and problems:
        raise ValueError(f"attention_backend='flashinfer' cannot run here: {problems[0]}; use 'sdpa' or 'auto'")
    return name


def flashinfer_problems(device: torch.device, dtype: torch.dtype | None, head_dim: int | None) -> list[str]:
    problems = []
    if device.type != "cuda":
        problems.append(f"it needs a CUDA device, got device={str(device)!r}")
    elif not flashinfer_available():
        problems.append("flashinfer is not installed (pip install 'worldstep[gpu]')")
    if dtype is not None and dtype not in FLASHINFER_DTYPES:
        problems.append(f"its kernels take dtype float16 or bfloat16, got dtype={dtype}")
    if head_dim is not None and head_dim not in FLASHINFER_HEAD_DIMS:
        problems.append(f"its kernels take head_dim in {FLASHINFER_HEAD_DIMS}, got head_dim={head_dim}")
    if not problems and dtype is not None and head_dim is not None:  # importable is not loadable: try them once
        problem = load_problem(device, dtype, head_dim)
        problems += [problem] if problem else []
    return problems


@dataclass
class _Gathered:
    """One stream-layer's committed K/V, gathered at ``epoch`` into buffers with room for the fresh tokens."""

    epoch: int
    k: torch.Tensor  # [capacity, Hkv, D]
    v: torch.Tensor  # [capacity, Hkv, D]


@dataclass
class PagedAttentionBatch:
    """The streams one packed attention call serves; build it once per window and `prime` it every forward.

    ``tables[i]`` is stream ``i``'s committed context and ``q_lens[i]`` its number of fresh tokens in
    the packed ``q``. ``backend`` may be ``"auto"``; it is resolved here against the cache's device,
    dtype and head_dim. The batch keeps per-(stream, layer) gathers (sdpa) between forwards and drops them
    with itself; flashinfer plans live in ``kernels`` (the model's `FlashinferKernels`, reused while the
    page layout is unchanged; a batch without one makes its own). After a commit, take fresh tables (or a
    new batch): `prime` on a batch whose tables went stale raises `StaleStreamError`.
    """

    cache: PagedKVCache
    tables: list[PageTable]
    q_lens: list[int]
    backend: AttentionBackendName | str
    kernels: FlashinferKernels | None = None
    _gathered: dict[tuple[StreamKey, int], _Gathered] = field(default_factory=dict, init=False, repr=False)
    _forward: AttentionForward | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.tables, self.q_lens = list(self.tables), list(self.q_lens)
        if not self.tables or len(self.tables) != len(self.q_lens):
            raise ValueError(
                f"tables and q_lens must be non-empty and of equal length, got {len(self.tables)} "
                f"and {len(self.q_lens)}"
            )
        if not all(isinstance(t, PageTable) for t in self.tables):
            raise ValueError("tables must hold PageTable snapshots from cache.page_table()")
        for i, n in enumerate(self.q_lens):
            check_int(f"q_lens[{i}]", n, 1)
        if not isinstance(self.backend, AttentionBackendName):  # a model hands its resolved backend
            self.backend = resolve_backend(
                self.backend, self.cache.device, dtype=self.cache.kv.dtype, head_dim=self.cache.head_dim
            )

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)


@dataclass(frozen=True)
class AttentionForward:
    """One forward's attention, made by `prime`: checked, current, and gathered (sdpa) or planned (flashinfer).

    The per-forward context of the layers (nano-vllm's ``set_context``, passed as an argument): every layer's
    `paged_attention` reads it and only dispatches and computes, so nothing a forward fixes is redone per layer.
    """

    backend: AttentionBackendName
    spans: tuple[tuple[int, int, int], ...]  # per stream: (first query row, end row, committed tokens)
    epochs: tuple[tuple[StreamKey, int], ...]  # per stream: the snapshot it was made from
    num_qo_heads: int
    k: tuple[tuple[torch.Tensor, ...], ...] = ()  # sdpa: [layer][stream] ``[S + n, Hkv, D]``, committed part filled
    v: tuple[tuple[torch.Tensor, ...], ...] = ()
    kv: torch.Tensor | None = None  # flashinfer: the cache's pages ``[layers, pages, 2, page_size, Hkv, D]``
    kernels: FlashinferKernels | None = None
    layout: Layout | None = None


def prime(batch: PagedAttentionBatch, num_qo_heads: int, tokens: torch.Tensor | None = None) -> AttentionForward:
    """Everything a forward's layers share, once: the checks, the staleness check, the gathers or the plan.

    Call it for every forward (cheap when nothing changed: the gathers and the plan are kept while the tables are
    current) and before a window's denoise loop (so that loop never copies page indices from the host).

    Args:
        num_qo_heads: query heads of every layer (a multiple of the cache's kv heads).
        tokens: the forward's input ``[N, hidden]``; checked against the batch (N) and the cache (dtype, device).
            The layers make q, k and v from it, so their shapes and dtype follow.
    Raises:
        StaleStreamError: a table no longer describes its stream (a commit, release or offload since it was taken).
    """
    cache = batch.cache
    for table in batch.tables:
        cache.check_current(table)
    if tokens is not None:
        _check_tokens(tokens, batch)
    epochs = tuple((t.key, t.prefix_epoch) for t in batch.tables)
    forward = batch._forward
    if forward is not None and forward.epochs == epochs and forward.num_qo_heads == num_qo_heads:
        return forward
    if num_qo_heads % cache.num_kv_heads:
        raise ValueError(f"q heads ({num_qo_heads}) must be a multiple of kv heads ({cache.num_kv_heads})")
    spans, start = [], 0
    for table, n in zip(batch.tables, batch.q_lens):
        spans.append((start, start + n, table.seq_len))
        start += n
    fields = dict(backend=batch.backend, spans=tuple(spans), epochs=epochs, num_qo_heads=num_qo_heads)
    if batch.backend is AttentionBackendName.FLASHINFER:
        if batch.kernels is None:  # a batch made outside a model plans with kernels of its own
            batch.kernels = FlashinferKernels(cache.device)
        layout = Layout.of(batch.tables, batch.q_lens, num_qo_heads, cache.num_kv_heads, cache.head_dim,
                           cache.page_size, cache.kv.dtype)
        with batch.kernels.lock:
            layout = batch.kernels.plan(layout).layout  # an equal layout planned before is kept: compare by identity
        forward = AttentionForward(**fields, kv=cache.kv, kernels=batch.kernels, layout=layout)
    else:
        gathered = [[_gathered(batch, table, layer, table.seq_len + n) for table, n in zip(batch.tables, batch.q_lens)]
                    for layer in range(cache.num_layers)]
        forward = AttentionForward(**fields, k=tuple(tuple(g.k for g in row) for row in gathered),
                                   v=tuple(tuple(g.v for g in row) for row in gathered))
    batch._forward = forward
    return forward


def paged_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, forward: AttentionForward, layer: int
) -> torch.Tensor:
    """Attention of packed queries over each stream's [committed | fresh] K/V: dispatch, then the maths.

    Args:
        q: ``[N, H, D]`` queries packed over the batch's streams in order, ``N = sum(q_lens)``.
        k_new: ``[N, Hkv, D]`` this step's fresh keys, packed the same way.
        v_new: ``[N, Hkv, D]`` this step's fresh values.
        forward: this forward's `prime` of the batch (the checks were made there, once).
        layer: which layer's committed K/V to read.

    Returns:
        ``[N, H, D]``, in ``q``'s dtype.
    """
    return _BACKENDS[forward.backend](q, k_new, v_new, forward, layer)


def _check_tokens(tokens: torch.Tensor, batch: PagedAttentionBatch) -> None:
    cache = batch.cache
    if tokens.ndim < 2 or tokens.shape[0] != batch.num_tokens:
        raise ValueError(f"tokens must be [N={batch.num_tokens}, ...] (the batch's q_lens), got {tuple(tokens.shape)}")
    if tokens.dtype != cache.kv.dtype or tokens.device != cache.device:
        raise ValueError(f"tokens must be {cache.kv.dtype} on {cache.device} like the KV cache, got {tokens.dtype} "
                         f"on {tokens.device}")


def _gathered(batch: PagedAttentionBatch, table: PageTable, layer: int, needed: int) -> _Gathered:
    """The stream's gather buffers for ``layer`` with room for ``needed`` tokens, its committed K/V current
    (``table`` was just checked current)."""
    entry = batch._gathered.get((table.key, layer))
    if entry is not None and entry.epoch == table.prefix_epoch and entry.k.shape[0] >= needed:
        return entry
    cache = batch.cache
    if entry is None or entry.k.shape[0] < needed:
        shape = (needed, cache.num_kv_heads, cache.head_dim)  # [S+n, Hkv, D]
        entry = _Gathered(table.prefix_epoch, cache.kv.new_empty(shape), cache.kv.new_empty(shape))
    cache.gather_table(table, layer, out_k=entry.k, out_v=entry.v)
    entry.epoch = table.prefix_epoch
    batch._gathered[(table.key, layer)] = entry
    return entry


# sdpa


def sdpa_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, forward: AttentionForward, layer: int
) -> torch.Tensor:
    """Per-stream `scaled_dot_product_attention` (exact: no padding, no cross-stream numerics).

    The fresh K/V are written after the committed part of the stream's gather buffer, except when autograd
    tracks them: it must not see an in-place write into a buffer an earlier graph saved, so they are joined."""
    out = torch.empty_like(q)  # [N, H, D]
    join = torch.is_grad_enabled() and (k_new.requires_grad or v_new.requires_grad)
    for (start, end, committed), k, v in zip(forward.spans, forward.k[layer], forward.v[layer]):
        needed = committed + end - start
        if join:
            k, v = torch.cat([k[:committed], k_new[start:end]]), torch.cat([v[:committed], v_new[start:end]])
        else:
            k[committed:needed], v[committed:needed] = k_new[start:end], v_new[start:end]
            k, v = k[:needed], v[:needed]  # [S+n, Hkv, D]
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),  # [1, H, n, D]
            k.transpose(0, 1).unsqueeze(0),  # [1, Hkv, S+n, D]
            v.transpose(0, 1).unsqueeze(0),  # [1, Hkv, S+n, D]
            enable_gqa=True,
        )  # [1, H, n, D]
        out[start:end] = o[0].transpose(0, 1)  # [n, H, D]
    return out


# flashinfer


def flashinfer_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, forward: AttentionForward, layer: int
) -> torch.Tensor:
    """Paged prefill over committed pages + ragged prefill over fresh K/V, merged by their LSEs."""
    import flashinfer  # lazily: CUDA only

    kernels = forward.kernels
    with kernels.lock:  # one plan at a time: the wrappers are shared by the model's batches
        plan = kernels if kernels.layout is forward.layout else kernels.plan(forward.layout)  # another batch planned
        o_new, lse_new = plan.ragged.run(q, k_new, v_new, return_lse=True)  # [N, H, D], [N, H]
        if not plan.has_context:
            return o_new
        kv_layer = forward.kv[layer]  # [pages, 2, page_size, Hkv, D]
        if plan.all_rows_have_context:
            o_ctx, lse_ctx = plan.paged.run(q, kv_layer, return_lse=True)
            return flashinfer.merge_state(o_ctx, lse_ctx, o_new, lse_new)[0]
        rows = plan.context_rows
        o_ctx, lse_ctx = plan.paged.run(q[rows], kv_layer, return_lse=True)  # [M, H, D], [M, H]
        merged, _ = flashinfer.merge_state(o_ctx, lse_ctx, o_new[rows], lse_new[rows])
        o_new[rows] = merged
        return o_new


_BACKENDS = {
    AttentionBackendName.SDPA: sdpa_attention,
    AttentionBackendName.FLASHINFER: flashinfer_attention,
}
