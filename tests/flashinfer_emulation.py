"""A CPU stand-in for the three flashinfer 0.7.4 APIs worldstep calls, written from their documented contracts.

`BatchPrefillWithRaggedKVCacheWrapper` / `BatchPrefillWithPagedKVCacheWrapper` (`plan(...)` then `run(q, ...,
return_lse=True)`, LSE in log2 as flashinfer returns it) and `merge_state`. Non-causal attention with GQA and
the default scale, computed densely in float32. It lets the CPU suite drive worldstep's flashinfer path: its
plans, its wrapper reuse and its merge of committed and fresh K/V, against the sdpa backend. Counters record
how many wrappers were made and how many plans were computed.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

COUNTS = {"wrappers": 0, "plans": 0, "runs": 0}


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [n, H, D], k/v [s, Hkv, D] -> out [n, H, D], lse [n, H] (log2)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [s, H, D]
    scores = torch.einsum("nhd,shd->hns", q.float(), k.float()) / math.sqrt(q.shape[-1])  # [H, n, s]
    lse = torch.logsumexp(scores, dim=-1)  # [H, n], natural log
    out = torch.einsum("hns,shd->nhd", torch.softmax(scores, dim=-1), v.float())
    return out.to(q.dtype), (lse / math.log(2)).transpose(0, 1)  # [n, H] in log2


def _spans(indptr: torch.Tensor) -> list[tuple[int, int]]:
    bounds = indptr.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


class BatchPrefillWithRaggedKVCacheWrapper:
    def __init__(self, workspace: torch.Tensor, layout: str) -> None:
        assert layout == "NHD"
        COUNTS["wrappers"] += 1
        self.plan_args = None

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, *, causal, q_data_type) -> None:
        assert not causal and qo_indptr.device.type == "cpu", "plans take host indptrs (no device-to-host copy)"
        COUNTS["plans"] += 1
        self.plan_args = SimpleNamespace(q=_spans(qo_indptr), kv=_spans(kv_indptr))

    def run(self, q, k, v, *, return_lse):
        COUNTS["runs"] += 1
        outs, lses = zip(*(_attend(q[a:b], k[c:d], v[c:d])
                           for (a, b), (c, d) in zip(self.plan_args.q, self.plan_args.kv)))
        return torch.cat(outs), torch.cat(lses)


class BatchPrefillWithPagedKVCacheWrapper:
    def __init__(self, workspace: torch.Tensor, layout: str) -> None:
        assert layout == "NHD"
        COUNTS["wrappers"] += 1
        self.plan_args = None

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             *, causal, q_data_type, kv_data_type) -> None:
        assert not causal and qo_indptr.device.type == "cpu", "plans take host indptrs (no device-to-host copy)"
        COUNTS["plans"] += 1
        pages = kv_indices.tolist()
        rows = [(pages[a:b], last) for (a, b), last in zip(_spans(kv_indptr), last_page_len.tolist())]
        self.plan_args = SimpleNamespace(q=_spans(qo_indptr), rows=rows, page_size=page_size)

    def run(self, q, kv_layer, *, return_lse):
        """kv_layer: [pages, 2, page_size, Hkv, D]."""
        COUNTS["runs"] += 1
        outs, lses = [], []
        for (a, b), (pages, last) in zip(self.plan_args.q, self.plan_args.rows):
            blocks = kv_layer[torch.tensor(pages, dtype=torch.long)]  # [P, 2, page_size, Hkv, D]
            n = (len(pages) - 1) * self.plan_args.page_size + last
            k = blocks[:, 0].reshape(-1, *blocks.shape[-2:])[:n]
            v = blocks[:, 1].reshape(-1, *blocks.shape[-2:])[:n]
            out, lse = _attend(q[a:b], k, v)
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs), torch.cat(lses)


def merge_state(v_a, s_a, v_b, s_b):
    """Combine two partial attentions by their log2 LSEs; returns (v, s)."""
    s = torch.logaddexp2(s_a, s_b)  # [n, H]
    w_a, w_b = torch.exp2(s_a - s).unsqueeze(-1), torch.exp2(s_b - s).unsqueeze(-1)
    return (w_a * v_a.float() + w_b * v_b.float()).to(v_a.dtype), s


def install(monkeypatch) -> None:
    """Make `import flashinfer` find this module, and let the flashinfer backend run on a CPU cache."""
    import sys

    from worldstep.engine import attention

    for key in COUNTS:
        COUNTS[key] = 0
    monkeypatch.setitem(sys.modules, "flashinfer", sys.modules[__name__])
    monkeypatch.setattr(attention, "flashinfer_problems", lambda device, dtype, head_dim: [])
