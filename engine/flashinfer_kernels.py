"""flashinfer's batch-prefill kernels for paged attention: made once per model, planned once per page layout.

A model keeps one `FlashinferKernels`: its 128 MiB workspace and its two wrappers (ragged prefill over this
step's fresh K/V, paged prefill over the committed pages) live as long as the model. `plan` runs only when the
layout of the batch (its streams' pages, lengths and fresh-token counts) differs from the last one planned, so
every denoise step of a window and every layer reuse one plan. Plans take host index tensors, so planning
never copies from the device. The wrappers are imported lazily: flashinfer needs CUDA to import cleanly.

`load_problem` says whether the kernels load at all: a package that imports may still lack (or fail to build)
the modules its wrappers load at their first plan, so one small batch is planned and run once per process.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import torch

from .devices import canonical_device
from .kv import PageTable

WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class Layout:
    """What a plan depends on: per stream, its committed pages and length, and its fresh tokens."""

    q_lens: tuple[int, ...]
    pages: tuple[tuple[int, ...], ...]
    seq_lens: tuple[int, ...]
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    @classmethod
    def of(cls, tables: list[PageTable], q_lens: list[int], num_qo_heads: int, num_kv_heads: int, head_dim: int,
           page_size: int, dtype: torch.dtype) -> Layout:
        return cls(tuple(q_lens), tuple(t.pages for t in tables), tuple(t.seq_len for t in tables), num_qo_heads,
                   num_kv_heads, head_dim, page_size, dtype)


class FlashinferKernels:
    """The workspace and wrappers of one model; `lock` is held across a plan and the runs that use it."""

    def __init__(self, device: torch.device) -> None:
        self.device = canonical_device(device)
        self.lock = threading.Lock()
        self.layout: Layout | None = None
        self.ragged: Any = None
        self.paged: Any = None
        self.context_rows: torch.Tensor | None = None  # rows of q whose stream has committed tokens
        self.all_rows_have_context = False
        self.plans = 0  # plans computed so far

    def plan(self, layout: Layout) -> FlashinferKernels:
        """Plan for ``layout`` unless it is the layout planned last (the caller holds `lock`)."""
        if layout == self.layout:
            return self
        import flashinfer

        if self.ragged is None:
            workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
            self.ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
            self.paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        dims = (layout.num_qo_heads, layout.num_kv_heads, layout.head_dim)
        qo_indptr = _indptr(layout.q_lens)
        self.ragged.plan(qo_indptr, qo_indptr, *dims, causal=False, q_data_type=layout.dtype)
        with_ctx = [i for i, n in enumerate(layout.seq_lens) if n > 0]
        self.all_rows_have_context = len(with_ctx) == len(layout.seq_lens)
        self.context_rows = None
        if with_ctx:
            pages = [layout.pages[i] for i in with_ctx]
            last_page_len = [layout.seq_lens[i] - (len(pages[j]) - 1) * layout.page_size
                             for j, i in enumerate(with_ctx)]
            self.paged.plan(_indptr([layout.q_lens[i] for i in with_ctx]), _indptr([len(p) for p in pages]),
                            torch.tensor([p for row in pages for p in row], dtype=torch.int32),
                            torch.tensor(last_page_len, dtype=torch.int32), *dims, layout.page_size, causal=False,
                            q_data_type=layout.dtype, kv_data_type=layout.dtype)
            if not self.all_rows_have_context:
                starts = _indptr(layout.q_lens).tolist()
                rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in with_ctx])
                self.context_rows = rows.to(self.device)
        self.layout, self.plans = layout, self.plans + 1
        return self

    @property
    def has_context(self) -> bool:
        return self.all_rows_have_context or self.context_rows is not None


PROBE_QUERIES = 128  # > 64 queries in a row: flashinfer's sm90 `auto` then picks the FA3 module, as for a real window


@functools.cache
def load_problem(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why flashinfer's kernels do not load on ``device`` for ``dtype`` and ``head_dim``, or None when they do.

    Plans and runs one batch shaped like a window row (`PROBE_QUERIES` fresh queries over one committed page) and
    merges the two parts: that loads every module the backend uses (prebuilt, cached or, when flashinfer's JIT is
    on, compiled now). Any failure is the reason, as one line."""
    try:
        import flashinfer

        kernels = FlashinferKernels(device)
        page_size = 16
        pages = torch.zeros(1, 2, page_size, 1, head_dim, dtype=dtype, device=kernels.device)  # [P, 2, page, Hkv, D]
        q = torch.zeros(PROBE_QUERIES, 1, head_dim, dtype=dtype, device=kernels.device)  # [N, H, D]
        layout = Layout((PROBE_QUERIES,), ((0,),), (page_size,), 1, 1, head_dim, page_size, dtype)
        plan = kernels.plan(layout)
        o_new, lse_new = plan.ragged.run(q, q, q, return_lse=True)
        o_ctx, lse_ctx = plan.paged.run(q, pages, return_lse=True)
        flashinfer.merge_state(o_ctx, lse_ctx, o_new, lse_new)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001 - whatever stops the kernels loading is the reason
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        return f"its kernels do not load here ({type(err).__name__}: {first})"
    return None


def _indptr(lengths: list[int] | tuple[int, ...]) -> torch.Tensor:
    """Host int32 prefix sums ``[0, l0, l0 + l1, ...]``."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return out
