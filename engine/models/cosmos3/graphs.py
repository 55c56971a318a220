"""The denoise steps of one window as a CUDA graph: captured once, replayed for every later step.

Within a window every denoise step runs the same generation layers on the same shapes with the same attention
metadata (the page tables stay fixed until the commit); only the input hidden states change. The first step
runs eagerly (it fills the attention's per-stream gather buffers), the second is captured, the rest replay it,
so a 30-step window pays Python and launch overhead about twice instead of 30 times. CUDA only, with the sdpa
backend (flashinfer's wrappers re-plan per window outside any graph); off by default (`cuda_graphs`).
"""

from __future__ import annotations

import torch
from torch import nn

from ...attention import AttentionBackendName, PagedAttentionBatch
from .runner import gen_forward


def check_cuda_graphs(enabled: bool, device: torch.device, backend: AttentionBackendName) -> bool:
    """``cuda_graphs`` is allowed here (ValueError naming the reason otherwise)."""
    if not isinstance(enabled, bool):
        raise ValueError(f"cuda_graphs={enabled!r} is invalid; allowed: True or False")
    if enabled and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True is invalid on device={str(device)!r}; allowed: a CUDA device")
    if enabled and backend is not AttentionBackendName.SDPA:
        raise ValueError(f"cuda_graphs=True is invalid with attention_backend={backend.value!r}; allowed: 'sdpa'")
    return enabled


class GraphedSteps:
    """`gen_forward` for one window's denoise steps: eager, then captured, then replayed."""

    def __init__(self, transformer: nn.Module, cos: torch.Tensor, sin: torch.Tensor,
                 batch: PagedAttentionBatch) -> None:
        self.transformer, self.cos, self.sin, self.batch = transformer, cos, sin, batch
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: torch.Tensor | None = None
        self.static_out: torch.Tensor | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Args: hidden ``[N, hidden]``. Returns the final generation hidden states ``[N, hidden]``."""
        self.calls += 1
        if self.calls == 1:  # eager: allocates the gather buffers the graph then reads
            return gen_forward(self.transformer, hidden, self.cos, self.sin, self.batch).hidden
        if self.graph is None:
            self._capture(hidden)
        self.static_in.copy_(hidden)
        self.graph.replay()
        return self.static_out.clone()  # the next replay overwrites the static output

    def _capture(self, hidden: torch.Tensor) -> None:
        self.static_in = hidden.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            gen_forward(self.transformer, self.static_in, self.cos, self.sin, self.batch)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_out = gen_forward(self.transformer, self.static_in, self.cos, self.sin, self.batch).hidden
