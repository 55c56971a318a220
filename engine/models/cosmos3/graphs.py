"""A window's denoise steps as a CUDA graph: captured once per (window geometry, batch), replayed ever after.

Every denoise step of a window runs the same generation layers on the same shapes; only the input hidden states
change. What else a step reads (the rotary tables and each row's committed K/V, gathered from the pages) changes
from window to window but not its shape, as long as every row has the same fresh-token count and committed
length: `graph_key`. So a `GraphCache` keeps one `GraphedSteps` per key, captured before the first window's loop,
and each later window of that key copies its rotary tables and regathers its rows' context into the graph's
static buffers (before its loop), then replays. Capturing syncs the device, so it happens once per key, not per
window. Each graph keeps its own gather buffers (one window's committed K/V), so the cache holds at most
`MAX_GRAPHS` (least recently used out) and is freed by the model's `close_all`. The committed length settles
once the context is full only when a window's tokens fill whole pages (retention frees whole pages); otherwise it
cycles within a page and a key recurs only every few windows. CUDA only, with the sdpa backend (flashinfer's
wrappers re-plan outside any graph); off by default.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ...attention import AttentionBackendName, PagedAttentionBatch, prime, regather
from .runner import gen_forward

MAX_GRAPHS = 4


def check_cuda_graphs(enabled: bool, device: torch.device, backend: AttentionBackendName) -> bool:
    """``cuda_graphs`` is allowed here (ValueError naming the reason otherwise)."""
    if not isinstance(enabled, bool):
        raise ValueError(f"cuda_graphs={enabled!r} is invalid; allowed: True or False")
    if enabled and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True is invalid on device={str(device)!r}; allowed: a CUDA device")
    if enabled and backend is not AttentionBackendName.SDPA:
        raise ValueError(f"cuda_graphs=True is invalid with attention_backend={backend.value!r}; allowed: 'sdpa'")
    return enabled


def graph_key(batch: PagedAttentionBatch, hidden_size: int) -> tuple:
    """What a captured graph's shapes depend on: per row its fresh tokens and committed length, and the width."""
    return tuple(batch.q_lens), tuple(t.seq_len for t in batch.tables), hidden_size


class GraphedSteps:
    """`gen_forward` over one window geometry: captured at construction, `bind` a window, then call per step."""

    def __init__(self, transformer: nn.Module, cos: torch.Tensor, sin: torch.Tensor,
                 batch: PagedAttentionBatch) -> None:
        self.transformer = transformer
        # its own batch: gather buffers the graph reads, refilled for every window it serves
        self.batch = PagedAttentionBatch(batch.cache, batch.tables, batch.q_lens, batch.backend)
        prime(self.batch, transformer.config.num_attention_heads)
        self.cos, self.sin = cos.clone(), sin.clone()  # [N, head_dim] static
        self.static_in = cos.new_zeros((batch.num_tokens, transformer.config.hidden_size))  # [N, hidden]
        self.graph, self.static_out = self._capture()
        self.replays = 0

    def bind(self, cos: torch.Tensor, sin: torch.Tensor, batch: PagedAttentionBatch) -> GraphedSteps:
        """Serve ``batch``'s window (same `graph_key`): its rotary tables and context into the static buffers."""
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        regather(self.batch, batch.tables)
        return self

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Args: hidden ``[N, hidden]``. Returns the final generation hidden states ``[N, hidden]``."""
        self.static_in.copy_(hidden)
        self.graph.replay()
        self.replays += 1
        return self.static_out.clone()  # the next replay overwrites the static output

    def _capture(self) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            gen_forward(self.transformer, self.static_in, self.cos, self.sin, self.batch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = gen_forward(self.transformer, self.static_in, self.cos, self.sin, self.batch).hidden
        return graph, out


class GraphCache:
    """The model's captured `GraphedSteps`, one per `graph_key`, least recently used dropped past `MAX_GRAPHS`."""

    def __init__(self, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple, GraphedSteps] = OrderedDict()
        self.captures = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def steps(self, transformer: nn.Module, cos: torch.Tensor, sin: torch.Tensor,
              batch: PagedAttentionBatch) -> GraphedSteps:
        """The graph for ``batch``'s geometry, bound to this window (captured now if the key is new)."""
        key = graph_key(batch, transformer.config.hidden_size)
        graphed = self._graphs.get(key)
        if graphed is None:
            graphed = self._graphs[key] = GraphedSteps(transformer, cos, sin, batch)
            self.captures += 1
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
            return graphed
        self._graphs.move_to_end(key)
        return graphed.bind(cos, sin, batch)

    def clear(self) -> None:
        """Free every captured graph (its memory pool and static buffers)."""
        self._graphs.clear()
