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
from typing import Any

import torch
import torch.nn.functional as F
from worldstep.engine.kv import PagedKVCache, PageTable, StreamKey

FLASHINFER_HEAD_DIMS = (64, 128, 256)
FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
_FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024


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
    ``head_dim`` (when given), else sdpa. An explicit ``flashinfer`` that cannot run raises
    ValueError naming ``attention_backend`` and the reason.
    """
    try:
        name = AttentionBackendName(name)
    except ValueError:
        allowed = ", ".join(repr(b.value) for b in AttentionBackendName)
        raise ValueError(f"attention_backend must be one of {allowed}, got {name!r}") from None
    device = torch.device(device)
    problems = _flashinfer_problems(device, dtype, head_dim)
    if name is AttentionBackendName.AUTO:
        return AttentionBackendName.SDPA if problems else AttentionBackendName.FLASHINFER
    if name is AttentionBackendName.FLASHINFER and problems:
        raise ValueError(f"attention_backend='flashinfer' cannot run here: {problems[0]}; use 'sdpa' or 'auto'")
    return name


def _flashinfer_problems(device: torch.device, dtype: torch.dtype | None, head_dim: int | None) -> list[str]:
    problems = []
    if device.type != "cuda":
        problems.append(f"it needs a CUDA device, got device={str(device)!r}")
    elif not flashinfer_available():
        problems.append("flashinfer is not installed (pip install 'worldstep[gpu]')")
    if dtype is not None and dtype not in FLASHINFER_DTYPES:
        problems.append(f"its kernels take dtype float16 or bfloat16, got dtype={dtype}")
    if head_dim is not None and head_dim not in FLASHINFER_HEAD_DIMS:
        problems.append(f"its kernels take head_dim in {FLASHINFER_HEAD_DIMS}, got head_dim={head_dim}")
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
    dtype and head_dim. The batch keeps per-(stream, layer) gathers (sdpa) or kernel plans
    (flashinfer) between calls, and drops them with itself. After a commit, take fresh tables (or a
    new batch): a batch whose tables went stale raises `StaleStreamError`.
    """

    cache: PagedKVCache
    tables: list[PageTable]
    q_lens: list[int]
    backend: AttentionBackendName | str
    _gathered: dict[tuple[StreamKey, int], _Gathered] = field(default_factory=dict, init=False, repr=False)
    _flashinfer_plan: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.tables, self.q_lens = list(self.tables), list(self.q_lens)
        if not self.tables or len(self.tables) != len(self.q_lens):
            raise ValueError(
                f"tables and q_lens must be non-empty and of equal length, got {len(self.tables)} "
                f"and {len(self.q_lens)}"
            )
        if not all(isinstance(t, PageTable) for t in self.tables):
            raise ValueError("tables must hold PageTable snapshots from cache.page_table()")
        for n in self.q_lens:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"q_lens must hold ints >= 1, got {self.q_lens}")
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
    entry = batch._gathered.get((table.key, layer))
    needed = table.seq_len + k_new.shape[0]
    if entry is not None and entry.epoch == table.prefix_epoch and entry.k.shape[0] >= needed:
        batch.cache.table.check_current(table)
    else:
        if entry is None or entry.k.shape[0] < needed:
            shape = (needed, *k_new.shape[1:])  # [S+n, Hkv, D]
            entry = _Gathered(table.prefix_epoch, k_new.new_empty(shape), v_new.new_empty(shape))
        batch.cache.gather_table(table, layer, out_k=entry.k, out_v=entry.v)
        entry.epoch = table.prefix_epoch
        batch._gathered[(table.key, layer)] = entry
    committed = slice(0, table.seq_len)
    if torch.is_grad_enabled() and (k_new.requires_grad or v_new.requires_grad):
        # autograd must not see an in-place write into a buffer an earlier graph saved
        return torch.cat([entry.k[committed], k_new]), torch.cat([entry.v[committed], v_new])
    entry.k[table.seq_len : needed] = k_new
    entry.v[table.seq_len : needed] = v_new
    return entry.k[:needed], entry.v[:needed]


# flashinfer


@dataclass
class _FlashinferPlan:
    """Kernel plans for one batch: shared by every layer, since page tables do not depend on the layer."""

    num_qo_heads: int
    ragged: Any  # BatchPrefillWithRaggedKVCacheWrapper over the fresh K/V
    paged: Any  # BatchPrefillWithPagedKVCacheWrapper over committed pages, or None
    rows: torch.Tensor | None  # [M] rows of q whose stream has committed tokens; None = all


def flashinfer_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, batch: PagedAttentionBatch, layer: int
) -> torch.Tensor:
    """Paged prefill over committed pages + ragged prefill over fresh K/V, merged by their LSEs."""
    import flashinfer  # lazily: CUDA only

    for table in batch.tables:
        batch.cache.table.check_current(table)
    plan = batch._flashinfer_plan
    if plan is None or plan.num_qo_heads != q.shape[1]:
        plan = batch._flashinfer_plan = _plan_flashinfer(flashinfer, batch, q.shape[1])
    o_new, lse_new = plan.ragged.run(q, k_new, v_new, return_lse=True)  # [N, H, D], [N, H]
    if plan.paged is None:
        return o_new
    kv_layer = batch.cache.kv[layer]  # [pages, 2, page_size, Hkv, D]
    if plan.rows is None:
        o_ctx, lse_ctx = plan.paged.run(q, kv_layer, return_lse=True)
        return flashinfer.merge_state(o_ctx, lse_ctx, o_new, lse_new)[0]
    o_ctx, lse_ctx = plan.paged.run(q[plan.rows], kv_layer, return_lse=True)  # [M, H, D], [M, H]
    merged, _ = flashinfer.merge_state(o_ctx, lse_ctx, o_new[plan.rows], lse_new[plan.rows])
    o_new[plan.rows] = merged
    return o_new


def _plan_flashinfer(flashinfer: Any, batch: PagedAttentionBatch, num_qo_heads: int) -> _FlashinferPlan:
    cache, device = batch.cache, batch.cache.device
    dims = (num_qo_heads, cache.num_kv_heads, cache.head_dim)
    workspace = torch.empty(_FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    qo_indptr = _indptr(batch.q_lens, device)
    ragged.plan(qo_indptr, qo_indptr, *dims, causal=False, q_data_type=cache.kv.dtype)
    with_ctx = [i for i, t in enumerate(batch.tables) if t.seq_len > 0]
    if not with_ctx:
        return _FlashinferPlan(num_qo_heads, ragged, None, None)
    tables = [batch.tables[i] for i in with_ctx]
    pages = torch.tensor([p for t in tables for p in t.pages], dtype=torch.int32, device=device)
    last_page_len = [t.seq_len - (len(t.pages) - 1) * cache.page_size for t in tables]
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    paged.plan(
        _indptr([batch.q_lens[i] for i in with_ctx], device),
        _indptr([len(t.pages) for t in tables], device),
        pages,
        torch.tensor(last_page_len, dtype=torch.int32, device=device),
        *dims,
        cache.page_size,
        causal=False,
        q_data_type=cache.kv.dtype,
        kv_data_type=cache.kv.dtype,
    )
    rows = None
    if len(with_ctx) < len(batch.tables):
        starts = _indptr(batch.q_lens, "cpu").tolist()
        rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in with_ctx]).to(device)
    return _FlashinferPlan(num_qo_heads, ragged, paged, rows)


def _indptr(lengths: list[int], device: str | torch.device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return out.to(device)


_BACKENDS = {
    AttentionBackendName.SDPA: sdpa_attention,
    AttentionBackendName.FLASHINFER: flashinfer_attention,
}
