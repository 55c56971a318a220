"""Analytic FLOPs of the generation layers, and device peaks, for model FLOP utilisation (MFU).

One generation forward over a row of `q` fresh tokens whose queries attend to `kv` tokens
(text + retained committed windows + the `q` fresh ones) costs, per layer (multiply-add = 2 FLOPs):

    projections  2 q h (H d) + 2 * 2 q h (Hkv d) + 2 q (H d) h        (q, k, v, out)
    attention    2 q kv H d + 2 q kv H d                                (Q K^T, P V)
    MLP          2 q h I * 2   (relu2: up, down; a gated silu MLP adds a third matrix)

Norms, RoPE, softmax and the patch embeddings are left out: they are a fraction of a percent at
Edge size, and leaving them out is what makes the count comparable to `torch.utils.flop_counter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, by a substring of the device name.
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 80GB HBM3": 989.0,
    "H100 PCIe": 756.0,
    "H100": 756.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}


@dataclass(frozen=True)
class GenShape:
    """What the FLOP count needs from a `Cosmos3OmniTransformer` config."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    gated_mlp: bool = False

    @classmethod
    def from_config(cls, config: Any) -> GenShape:
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        return cls(hidden=int(get("hidden_size")), intermediate=int(get("intermediate_size")),
                   heads=int(get("num_attention_heads")), kv_heads=int(get("num_key_value_heads")),
                   head_dim=int(get("head_dim")), layers=int(get("num_hidden_layers")),
                   gated_mlp=get("hidden_act", "relu2") == "silu")


@dataclass(frozen=True)
class Flops:
    """FLOPs of one forward, split by kind."""

    projections: float = 0.0
    attention: float = 0.0
    mlp: float = 0.0

    @property
    def total(self) -> float:
        return self.projections + self.attention + self.mlp

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.projections + other.projections, self.attention + other.attention, self.mlp + other.mlp)


def row_flops(shape: GenShape, q_tokens: int, kv_tokens: int) -> Flops:
    """All generation layers over one row: `q_tokens` fresh tokens attending to `kv_tokens` (fresh included)."""
    if q_tokens < 0 or kv_tokens < q_tokens:
        raise ValueError(f"q_tokens={q_tokens}, kv_tokens={kv_tokens} are invalid; allowed: 0 <= q_tokens <= kv_tokens")
    h, d = shape.hidden, shape.head_dim
    q_width, kv_width = shape.heads * d, shape.kv_heads * d
    projections = 2 * q_tokens * h * (2 * q_width + 2 * kv_width)
    attention = 4 * q_tokens * kv_tokens * shape.heads * d
    mlp = 2 * q_tokens * h * shape.intermediate * (3 if shape.gated_mlp else 2)
    n = shape.layers
    return Flops(float(n * projections), float(n * attention), float(n * mlp))


def forward_flops(shape: GenShape, rows: list[tuple[int, int]]) -> Flops:
    """One packed forward over several rows `(q_tokens, kv_tokens)` (sessions, CFG streams)."""
    total = Flops()
    for q_tokens, kv_tokens in rows:
        total = total + row_flops(shape, q_tokens, kv_tokens)
    return total


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a known device (longest matching name first), else None."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_BF16_TFLOPS[key]
    return None
