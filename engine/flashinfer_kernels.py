"""flashinfer's batch-prefill kernels for paged attention: made once per model, planned once per page layout.

A model keeps one `FlashinferKernels`: its 128 MiB workspace and its two wrappers (ragged prefill over this
step's fresh K/V, paged prefill over the committed pages) live as long as the model. `plan` runs only when the
layout of the batch (its streams' pages, lengths and fresh-token counts) differs from the last one planned, so
every denoise step of a window and every layer reuse one plan. Plans take host index tensors, so planning
never copies from the device. The wrappers are imported lazily: flashinfer needs CUDA to import cleanly.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch
from worldstep.engine.devices import canonical_device
from worldstep.engine.kv import PageTable

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


def _indptr(lengths: list[int] | tuple[int, ...]) -> torch.Tensor:
    """Host int32 prefix sums ``[0, l0, l0 + l1, ...]``."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return out
