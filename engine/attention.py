"""Attention over [committed K/V in the paged cache | this step's fresh K/V], for a batch of streams.

One Enum (`AttentionBackendName`), one function per backend, one dispatch point (`paged_attention`).
Every backend computes the same thing: each stream's queries attend, non-causally, to its committed
tokens (read through a `PageTable` snapshot) followed by its fresh tokens of this step, with GQA and
the default scale ``1/sqrt(head_dim)``. Model code builds a `PagedAttentionBatch` once per window
and never branches on the backend.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from enum import Enum

import torch
import torch.nn.functional as F
from worldstep.engine.checks import check_int
from worldstep.engine.devices import canonical_device
from worldstep.engine.flashinfer_kernels import FlashinferKernels, Layout, load_problem
from worldstep.engine.kv import PagedKVCache, PageTable, StreamKey

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
    """The streams one packed attention call serves; build it once per window and reuse it every step.

    ``tables[i]`` is stream ``i``'s committed context and ``q_lens[i]`` its number of fresh tokens in
    the packed ``q``. ``backend`` may be ``"auto"``; it is resolved here against the cache's device,
    dtype and head_dim. The batch keeps per-(stream, layer) gathers (sdpa) between calls and drops them
    with itself; flashinfer plans live in ``kernels`` (the model's `FlashinferKernels`, reused while the
    page layout is unchanged; a batch without one makes its own). After a commit, take fresh tables (or a
    new batch): a batch whose tables went stale raises `StaleStreamError`.
    """

    cache: PagedKVCache
    tables: list[PageTable]
    q_lens: list[int]
    backend: AttentionBackendName | str
    kernels: FlashinferKernels | None = None
    _gathered: dict[tuple[StreamKey, int], _Gathered] = field(default_factory=dict, init=False, repr=False)

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


def paged_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, batch: PagedAttentionBatch, layer: int
) -> torch.Tensor:
    """Attention of packed queries over each stream's [committed | fresh] K/V.

    Args:
        q: ``[N, H, D]`` queries packed over the batch's streams in order, ``N = sum(q_lens)``.
        k_new: ``[N, Hkv, D]`` this step's fresh keys, packed the same way.
        v_new: ``[N, Hkv, D]`` this step's fresh values.
        batch: the streams, their committed snapshots and the backend.
        layer: which layer's committed K/V to read.

    Returns:
        ``[N, H, D]``, in ``q``'s dtype.
    """
    _check_inputs(q, k_new, v_new, batch)
    return _BACKENDS[batch.backend](q, k_new, v_new, batch, layer)


def prime(batch: PagedAttentionBatch, num_qo_heads: int) -> None:
    """Do before a window's denoise loop what its first step would: gather every row's committed K/V (sdpa)
    or plan the layout (flashinfer). Both copy page indices from the host, so the loop itself then never does."""
    cache = batch.cache
    if batch.backend is AttentionBackendName.FLASHINFER:
        if batch.kernels is None:
            batch.kernels = FlashinferKernels(cache.device)
        layout = Layout.of(batch.tables, batch.q_lens, num_qo_heads, cache.num_kv_heads, cache.head_dim,
                           cache.page_size, cache.kv.dtype)
        with batch.kernels.lock:
            batch.kernels.plan(layout)
        return
    for i, (table, n) in enumerate(zip(batch.tables, batch.q_lens)):
        for layer in range(cache.num_layers):
            _gathered(batch, i, layer, table.seq_len + n)


def _check_inputs(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, batch: PagedAttentionBatch) -> None:
    cache = batch.cache
    kv_shape = (batch.num_tokens, cache.num_kv_heads, cache.head_dim)
    if q.ndim != 3 or q.shape[0] != batch.num_tokens or q.shape[2] != cache.head_dim:
        raise ValueError(f"q must be [N={batch.num_tokens}, H, D={cache.head_dim}], got {tuple(q.shape)}")
    if q.shape[1] % cache.num_kv_heads:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({cache.num_kv_heads})")
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if tuple(t.shape) != kv_shape:
            raise ValueError(f"{name} must be {list(kv_shape)}, got {list(t.shape)}")
    for name, t in (("q", q), ("k_new", k_new), ("v_new", v_new)):
        if t.dtype != cache.kv.dtype or t.device != cache.device:
            raise ValueError(
                f"{name} must be {cache.kv.dtype} on {cache.device} like the KV cache, got {t.dtype} on {t.device}"
            )


# sdpa


def sdpa_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, batch: PagedAttentionBatch, layer: int
) -> torch.Tensor:
    """Per-stream `scaled_dot_product_attention` (exact: no padding, no cross-stream numerics)."""
    out = torch.empty_like(q)  # [N, H, D]
    start = 0
    for i, n in enumerate(batch.q_lens):
        k, v = _stream_kv(batch, i, layer, k_new[start : start + n], v_new[start : start + n])  # [S+n, Hkv, D]
        o = F.scaled_dot_product_attention(
            q[start : start + n].transpose(0, 1).unsqueeze(0),  # [1, H, n, D]
            k.transpose(0, 1).unsqueeze(0),  # [1, Hkv, S+n, D]
            v.transpose(0, 1).unsqueeze(0),  # [1, Hkv, S+n, D]
            enable_gqa=True,
        )  # [1, H, n, D]
        out[start : start + n] = o[0].transpose(0, 1)  # [n, H, D]
        start += n
    return out


def _stream_kv(
    batch: PagedAttentionBatch, i: int, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """[committed | fresh] K/V of stream ``i``; the committed part is gathered once per epoch."""
    table = batch.tables[i]
    needed = table.seq_len + k_new.shape[0]
    entry = _gathered(batch, i, layer, needed)
    committed = slice(0, table.seq_len)
    if torch.is_grad_enabled() and (k_new.requires_grad or v_new.requires_grad):
        # autograd must not see an in-place write into a buffer an earlier graph saved
        return torch.cat([entry.k[committed], k_new]), torch.cat([entry.v[committed], v_new])
    entry.k[table.seq_len : needed] = k_new
    entry.v[table.seq_len : needed] = v_new
    return entry.k[:needed], entry.v[:needed]


def _gathered(batch: PagedAttentionBatch, i: int, layer: int, needed: int) -> _Gathered:
    """Stream ``i``'s gather buffers for ``layer`` with room for ``needed`` tokens, its committed K/V current."""
    table, cache = batch.tables[i], batch.cache
    entry = batch._gathered.get((table.key, layer))
    if entry is not None and entry.epoch == table.prefix_epoch and entry.k.shape[0] >= needed:
        cache.check_current(table)
        return entry
    if entry is None or entry.k.shape[0] < needed:
        shape = (needed, cache.num_kv_heads, cache.head_dim)  # [S+n, Hkv, D]
        entry = _Gathered(table.prefix_epoch, cache.kv.new_empty(shape), cache.kv.new_empty(shape))
    cache.gather_table(table, layer, out_k=entry.k, out_v=entry.v)
    entry.epoch = table.prefix_epoch
    batch._gathered[(table.key, layer)] = entry
    return entry


# flashinfer


def flashinfer_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, batch: PagedAttentionBatch, layer: int
) -> torch.Tensor:
    """Paged prefill over committed pages + ragged prefill over fresh K/V, merged by their LSEs."""
    import flashinfer  # lazily: CUDA only

    for table in batch.tables:
        batch.cache.check_current(table)
    if batch.kernels is None:  # a batch made outside a model plans with kernels of its own
        batch.kernels = FlashinferKernels(batch.cache.device)
    cache = batch.cache
    layout = Layout.of(batch.tables, batch.q_lens, q.shape[1], cache.num_kv_heads, cache.head_dim, cache.page_size,
                       cache.kv.dtype)
    with batch.kernels.lock:  # one plan at a time: the wrappers are shared by the model's batches
        plan = batch.kernels.plan(layout)
        o_new, lse_new = plan.ragged.run(q, k_new, v_new, return_lse=True)  # [N, H, D], [N, H]
        if not plan.has_context:
            return o_new
        kv_layer = cache.kv[layer]  # [pages, 2, page_size, Hkv, D]
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
