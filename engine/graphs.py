"""A window's denoise steps and its commit as CUDA graphs: captured once per (window geometry, batch), replayed
ever after.

Every denoise step of a window runs the same generation layers on the same shapes; only the input hidden states
change. What else a step reads (the rotary tables and each row's committed K/V) changes from window to window, and
so does each row's committed length: retention frees whole pages, so at a page size that does not divide a
window's tokens the length shifts within a page from window to window. A graph therefore gives each row room for
the most committed tokens its retention policy ever lets the stream hold (`padded_length`) and attends through
`PaddedContext`: static gather buffers of that length plus the fresh tokens, and a key mask, refilled for every
window before its loop, that hides the padding. Its key (`graph_key`) is then the window geometry and batch only:
per row its fresh tokens and padded length. A `GraphCache` keeps one `GraphedSteps` per key, captured before the
first window's loop, and each later window of that key refills the static buffers and replays. Capturing syncs
the device, so it happens once per key: one graph for a rollout's first window (frame 0 leads it, so it has more
tokens) and one for every later window. Each key holds two graphs in one memory pool: a denoise step, and the
commit pass (the same layers keeping their K/V), which runs against the same bound context right after the loop.
The graphs read the adapter's layer weights (its ``weights()``, e.g. Cosmos3's `fused.gen_weights`); when the
modules' weights change, the cache drops every graph and captures anew. What a graph records is the adapter's
generation layers (``layers``), so the loop captures any model's; it reads no model code itself. The eager path
attends without padding or masks; masked keys get exact
zero weight, so the two differ only in the order of floating-point sums (tests/test_gpu_regime.py measures it).
The cache holds at most `MAX_GRAPHS` (least recently used out) and is freed by the loop's `close_all`. CUDA
only, with the sdpa backend (flashinfer's wrappers re-plan outside any graph); off by default.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .attention import AttentionBackendName, PagedAttentionBatch
from .kv import PagedKVCache, PageTable
from .windowing import RetentionPolicy

MAX_GRAPHS = 4

Layers = Callable[..., Any]
"""``layers(hidden, cos, sin, attend, collect_kv) -> out`` (``out.hidden`` ``[N, hidden]``; with ``collect_kv``,
``out.keys``/``out.values`` ``[layers, N, Hkv, D]``): the adapter's generation layers, what a graph records."""


def check_cuda_graphs(enabled: bool, device: torch.device, backend: AttentionBackendName) -> bool:
    """``cuda_graphs`` is allowed here (ValueError naming the reason otherwise)."""
    if not isinstance(enabled, bool):
        raise ValueError(f"cuda_graphs={enabled!r} is invalid; allowed: True or False")
    if enabled and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True is invalid on device={str(device)!r}; allowed: a CUDA device")
    if enabled and backend is not AttentionBackendName.SDPA:
        raise ValueError(f"cuda_graphs=True is invalid with attention_backend={backend.value!r}; allowed: 'sdpa'")
    return enabled


def padded_length(table: PageTable, page_size: int, policy: RetentionPolicy | None) -> int:
    """Committed tokens a graph row has room for: the whole pages its stream can hold at a window's start.

    Under ``policy`` that is the protected pages (the last one partly protected stays), the horizon's pages and
    one page more (releases are page-floored); without one (the context grows, or chained windows never commit)
    it is the stream's pages now. Never less than the stream holds, whatever the policy says.
    """
    pages = -(-table.seq_len // page_size)
    if policy is not None:
        bound = -(-policy.protected_tokens // page_size) + -(-policy.context_tokens // page_size) + 1
        pages = max(pages, bound)
    return pages * page_size


def graph_key(q_lens: Sequence[int], padded: Sequence[int], hidden_size: int) -> tuple:
    """What a captured graph's shapes depend on: per row its fresh tokens and padded committed length, and the width."""
    return tuple(q_lens), tuple(padded), hidden_size


class PaddedContext:
    """Per row and layer static K/V buffers ``[padded + n, Hkv, D]`` and a key mask: what a graph attends through.

    Row ``i`` holds its committed K/V at ``[0, S)`` and this step's fresh K/V at ``[S, S + n)`` (the eager order,
    written at the static ``slots``), and ``mask[i]`` lets the queries see exactly those ``S + n`` keys.
    """

    def __init__(self, cache: PagedKVCache, q_lens: Sequence[int], padded: Sequence[int]) -> None:
        self.cache, self.q_lens = cache, list(q_lens)
        shapes = [(p + n, cache.num_kv_heads, cache.head_dim) for p, n in zip(padded, q_lens)]  # [P+n, Hkv, D]
        # zeros: a masked key gets weight exactly 0, and 0 * its value must stay 0 (never NaN)
        self.k = [[cache.kv.new_zeros(s) for s in shapes] for _ in range(cache.num_layers)]
        self.v = [[cache.kv.new_zeros(s) for s in shapes] for _ in range(cache.num_layers)]
        self.mask = [torch.zeros(s[0], dtype=torch.bool, device=cache.device) for s in shapes]  # [P+n]
        self.slots = [torch.zeros(n, dtype=torch.long, device=cache.device) for n in q_lens]  # [n]

    def fill(self, tables: Sequence[PageTable]) -> None:
        """Gather ``tables``' committed K/V (the same fresh tokens, at most the padded length) and set the masks."""
        for i, (table, n) in enumerate(zip(tables, self.q_lens)):
            seen = table.seq_len + n
            if seen > self.mask[i].shape[0]:
                raise ValueError(f"row {i} holds {table.seq_len} committed tokens; this graph has room for "
                                 f"{self.mask[i].shape[0] - n}")
            for layer in range(self.cache.num_layers):
                self.cache.gather_table(table, layer, out_k=self.k[layer][i], out_v=self.v[layer][i])
            self.slots[i].copy_(torch.arange(table.seq_len, seen, device=self.cache.device))
            self.mask[i].fill_(False)
            self.mask[i][:seen] = True

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer: int) -> torch.Tensor:
        """`runner.Attend` over the static buffers: q ``[N, H, D]``, k/v ``[N, Hkv, D]`` packed -> ``[N, H, D]``."""
        out = torch.empty_like(q)  # [N, H, D]
        start = 0
        for i, n in enumerate(self.q_lens):
            k, v, rows = self.k[layer][i], self.v[layer][i], slice(start, start + n)
            k.index_copy_(0, self.slots[i], k_new[rows])
            v.index_copy_(0, self.slots[i], v_new[rows])
            out[rows] = masked_gqa_attention(q[rows], k, v, self.mask[i])
            start += n
        return out


def masked_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Non-causal sdpa of one row's queries over the keys ``mask`` lets them see.

    The query heads of a KV head are folded into the query length, so no backend needs GQA with a mask (on CUDA
    only the math kernel has both).

    Args:
        q: ``[n, H, D]``; k, v: ``[S, Hkv, D]``; mask: ``[S]`` bool.
    Returns:
        ``[n, H, D]``.
    """
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    q = q.unflatten(1, (kv_heads, group)).permute(1, 2, 0, 3).reshape(1, kv_heads, group * n, dim)  # [1, Hkv, g*n, D]
    o = F.scaled_dot_product_attention(q, k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask[None])  # [1, Hkv, g*n, D]
    return o.view(kv_heads, group, n, dim).permute(2, 0, 1, 3).reshape(n, heads, dim)  # [n, H, D]


class GraphedSteps:
    """``layers`` over one window geometry through a `PaddedContext`: a denoise-step graph and a commit graph
    (the same layers keeping each layer's K/V), captured at construction into one memory pool; `bind` a window,
    then call per step and `commit` once. ``weights()``: the weights the layers read now (compared by identity)."""

    def __init__(self, layers: Layers, weights: Callable[[], object], hidden_size: int, cos: torch.Tensor,
                 sin: torch.Tensor, batch: PagedAttentionBatch, padded: Sequence[int]) -> None:
        self.layers, self.weights_now = layers, weights
        self.context = PaddedContext(batch.cache, batch.q_lens, padded)
        self.cos, self.sin = cos.clone(), sin.clone()  # [N, head_dim] static
        self.static_in = cos.new_zeros((batch.num_tokens, hidden_size))  # [N, hidden]
        self.context.fill(batch.tables)
        self.weights = weights()  # what the graphs read; `current` compares it
        self.graph, self.static_out = self._capture(collect_kv=False)
        self.commit_graph, self.commit_out = self._capture(collect_kv=True)
        self.replays = 0
        self.commits = 0

    def current(self) -> bool:
        """Whether the weights the graphs read are still the modules' (a load or an in-place update makes new
        fused weights, which a captured graph would never see)."""
        return self.weights_now() is self.weights

    def bind(self, cos: torch.Tensor, sin: torch.Tensor, batch: PagedAttentionBatch) -> GraphedSteps:
        """Serve ``batch``'s window (same `graph_key`): its rotary tables, context and masks into the static buffers."""
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        self.context.fill(batch.tables)
        return self

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """A denoise step. Args: hidden ``[N, hidden]``. Returns the final generation hidden states ``[N, hidden]``."""
        self.static_in.copy_(hidden)
        self.graph.replay()
        self.replays += 1
        return self.static_out.hidden.clone()  # the next replay overwrites the static output

    def commit(self, hidden: torch.Tensor) -> Any:
        """The commit pass over the clean window ``[N, hidden]``: each layer's K/V ``[layers, N, Hkv, D]`` (static
        buffers, valid until the next replay of this geometry: the cache copies them into its pages at once)."""
        self.static_in.copy_(hidden)
        self.commit_graph.replay()
        self.commits += 1
        return self.commit_out

    def forward(self, collect_kv: bool = False) -> Any:
        """What a graph records: every generation layer over the static buffers."""
        return self.layers(self.static_in, self.cos, self.sin, self.context.attend, collect_kv)

    def _capture(self, collect_kv: bool) -> tuple[torch.cuda.CUDAGraph, Any]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            self.forward(collect_kv)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        pool = None if not collect_kv else self.graph.pool()  # replayed in capture order, never at once: one pool
        with torch.cuda.graph(graph, pool=pool):
            out = self.forward(collect_kv)
        return graph, out


class GraphCache:
    """The model's captured `GraphedSteps`, one per `graph_key`, least recently used dropped past `MAX_GRAPHS`."""

    def __init__(self, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple, GraphedSteps] = OrderedDict()
        self.captures = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def steps(self, layers: Layers, weights: Callable[[], object], hidden_size: int, cos: torch.Tensor,
              sin: torch.Tensor, batch: PagedAttentionBatch,
              policies: Sequence[RetentionPolicy | None]) -> GraphedSteps:
        """The graph of ``layers`` for ``batch``'s geometry, bound to this window (captured now if the key is new).

        ``policies``: per row the retention its commits apply (None: none, or no commit), which bounds its context.
        """
        page_size = batch.cache.page_size
        padded = [padded_length(t, page_size, p) for t, p in zip(batch.tables, policies, strict=True)]
        key = graph_key(batch.q_lens, padded, hidden_size)
        graphed = self._graphs.get(key)
        if graphed is not None and not graphed.current():  # new weights: every graph reads the old ones
            self.clear()
            graphed = None
        if graphed is None:
            graphed = self._graphs[key] = GraphedSteps(layers, weights, hidden_size, cos, sin, batch, padded)
            self.captures += 1
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
            return graphed
        self._graphs.move_to_end(key)
        return graphed.bind(cos, sin, batch)

    def clear(self) -> None:
        """Free every captured graph (its memory pool and static buffers)."""
        self._graphs.clear()
