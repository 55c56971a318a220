"""The device memory of a CUDA run, planned on any machine (no GPU, no weights): ``worldstep info --device cuda``.

A peak is the weights in the dtypes the loader will use (the transformer in ``model.dtype``, bfloat16 on CUDA by
default; the VAE in float32; a private decoder copy when the decoder runs in another dtype), the KV page pool
(allocated whole at load), and per session the transient memory ``worldstep bench gpu`` plans before each section
(``worldstep.bench.gpu_memory``: attention gathers and activations per CFG stream, the warm decoder's feature
maps), all times ``PLAN_MARGIN``. Checked against the H200's measured peaks (``tests/test_cuda_plan.py``): the
plan is 0.98-1.30x the measured peak at 1, 4 and 8 sessions, CFG included.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import WorldstepConfig
from .memory import MemoryPlan, plan, weights_from_architecture
from .session_memory import PLAN_MARGIN, SessionShape, planned_session_bytes

__all__ = ["CudaPlan", "cuda_plan", "decoder_dtype", "transformer_dtype"]

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
VAE_DTYPE = "float32"
"""The loader's VAE weights dtype (``load_cosmos3``: fp32, so frames match one whole-stream decode)."""


def transformer_dtype(config: WorldstepConfig, device: str) -> str:
    """The transformer's dtype as the loader picks it: ``model.dtype``, else bfloat16 on CUDA, float32 elsewhere."""
    return config.model.dtype or ("bfloat16" if device.startswith("cuda") else "float32")


def decoder_dtype(config: WorldstepConfig, device: str) -> str:
    """The dtype the VAE decoder runs in on ``device``: ``decoder.dtype`` when it names one, else (None or
    ``auto``) bfloat16 on CUDA and the VAE's own float32 elsewhere. The one place the plan reads it."""
    chosen = getattr(config.decoder, "dtype", None)
    if chosen in (None, "auto"):
        return "bfloat16" if device.startswith("cuda") else VAE_DTYPE
    return chosen


@dataclass(frozen=True)
class CudaPlan:
    """Planned device bytes of one model on a CUDA device; ``peak_bytes(n)`` for ``n`` sessions at once."""

    dtype: str
    decoder_dtype: str
    transformer_bytes: int
    vae_bytes: int
    decoder_copy_bytes: int
    pool_bytes: int
    session_bytes: int
    kv_pages_per_session: int
    cfg: bool
    margin: float = PLAN_MARGIN
    sessions: list[int] = field(default_factory=lambda: [1, 4, 8])

    @property
    def weights_bytes(self) -> int:
        return self.transformer_bytes + self.vae_bytes + self.decoder_copy_bytes

    def peak_bytes(self, sessions: int) -> int:
        return int(self.margin * (self.weights_bytes + self.pool_bytes + sessions * self.session_bytes))

    def max_sessions(self, pool_pages: int) -> int:
        """Sessions the KV pool holds at their peak pages."""
        return pool_pages // max(1, self.kv_pages_per_session)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "weights_bytes": self.weights_bytes,
                "peak_bytes": {str(n): self.peak_bytes(n) for n in self.sessions}}


def cuda_plan(config: WorldstepConfig, *, windows: int, text_tokens: int,
              sessions: list[int] | None = None) -> tuple[CudaPlan, MemoryPlan]:
    """The plan of ``config`` on CUDA from its ``model.architecture`` alone, and its KV plan in the same dtype."""
    arch = config.model.architecture
    if arch is None:
        raise ValueError(f"model.architecture of {config.model.name!r} is needed to plan a CUDA run without the "
                         "model (it has no transformer/vae block)")
    dtype, decoder = transformer_dtype(config, "cuda"), decoder_dtype(config, "cuda")
    memory = plan(config.with_overrides(**{"model.dtype": dtype}), windows=windows, text_tokens=text_tokens)
    weights = weights_from_architecture(config.with_overrides(**{"model.dtype": dtype}))
    vae_bytes = weights.vae_bytes // _ITEMSIZE[dtype] * _ITEMSIZE[VAE_DTYPE]
    decoder_copy = 0 if decoder == VAE_DTYPE else _decoder_params(config) * _ITEMSIZE[decoder]
    t = arch.transformer
    shape = SessionShape(memory.kv_bytes_per_token, memory.tokens_per_frame, config.rollout.context_frames,
                         max(t["intermediate_size"], t["hidden_size"]), _ITEMSIZE[dtype], dict(arch.vae),
                         config.model.height or arch.height, config.model.width or arch.width, _ITEMSIZE[decoder])
    cfg = memory.streams == 2
    return CudaPlan(dtype=dtype, decoder_dtype=decoder, transformer_bytes=weights.transformer_bytes,
                    vae_bytes=vae_bytes, decoder_copy_bytes=decoder_copy, pool_bytes=memory.pool_bytes,
                    session_bytes=planned_session_bytes(shape, cfg), cfg=cfg,
                    kv_pages_per_session=memory.peak_pages_per_episode, sessions=sessions or [1, 4, 8]), memory


H200_JSON = Path(__file__).resolve().parents[1] / "docs" / "bench" / "gpu" / "h200-141gb" / "bench_gpu_headline.json"
"""The committed GPU run (a source checkout has it; an installed wheel does not)."""


@dataclass(frozen=True)
class MeasuredPeak:
    """One measured peak of ``worldstep bench gpu``, with the settings it ran under."""

    sessions: int
    cfg: bool
    peak_bytes: int
    ms_per_step: float | None


def measured_peaks(path: Path = H200_JSON) -> tuple[str, dict[str, Any], list[MeasuredPeak]]:
    """(device name, the run's settings, its peaks: N sessions at 4 steps without CFG, and one session with CFG)
    from a ``bench gpu`` JSON; empty when the file is not there."""
    if not path.is_file():
        return "", {}, []
    data = json.loads(path.read_text())
    results = data["results"]
    base = results["sessions"][0]["weights_and_pool_bytes"]
    peaks = [MeasuredPeak(r["sessions"], False, r["peak_device_bytes"], r["ms_per_batched_step"])
             for r in results["sessions"]]
    cfg = results["memory"]["windows"]
    if cfg.get("measured_extra_bytes") is not None and cfg["sessions"] == 1:
        peaks.append(MeasuredPeak(1, True, base + cfg["measured_extra_bytes"], None))
    settings = {"dtype": results["dtype"], "decoder_dtype": results["vae_dtype"], "height": results["height"],
                "width": results["width"], "page_bytes": results["sessions"][0]["page_bytes"],
                "context_frames": data["settings"]["context_frames"],
                "pool_pages": int((base - results["transformer_params"] * 2 - results["vae_params"] * 4)
                                    / results["sessions"][0]["page_bytes"])}
    return results["device_name"], settings, peaks


def _decoder_params(config: WorldstepConfig) -> int:
    """Parameters of the VAE's decoder half (``post_quant_conv`` and ``decoder``), built on the meta device."""
    import torch
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        vae = AutoencoderKLWan(**config.model.architecture.vae)
    return sum(p.numel() for m in (vae.post_quant_conv, vae.decoder) for p in m.parameters())
