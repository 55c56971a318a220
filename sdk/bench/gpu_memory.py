"""`bench gpu`: what each section will allocate on the device, checked against its free memory before it runs.

A section that cannot fit is skipped with the reason instead of running out of memory (and taking the
sections after it along). The plan is the bytes a section adds to what is allocated when it starts (the
weights and the KV pool are already there), per session it opens:

- the sdpa gathers: every layer's committed K/V plus the fresh tokens, per CFG stream
  (``kv_bytes_per_token * (context + window tokens)``; the flashinfer path reads pages in place, so this
  over-counts it);
- one layer's activations over the window's tokens (``ACTIVATION_COPIES`` live tensors of the MLP width);
- when it decodes, the warm VAE decoder's feature maps (``DECODE_COPIES`` live tensors of its largest stage,
  channels times pixels at that stage's resolution, over the frames of one decoder call: the warm decoder
  takes one latent per call, which becomes `scale_factor_temporal` frames, in the VAE's dtype).

These constants are reasoned, not measured: each section records its plan next to the peak it measured
(`measured_extra_bytes`), which is how the first GPU run calibrates them. `PLAN_MARGIN` covers the allocator's
rounding and fragmentation. The per-session terms and constants are ``worldstep.session_memory``'s, which the
product's CUDA plan (``worldstep info``) shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..session_memory import PLAN_MARGIN, SessionShape, planned_session_bytes

GIB = 2**30


@dataclass(frozen=True)
class SectionLoad:
    """What a section opens at once: sessions, whether they decode and use CFG, extra KV pools it allocates."""

    sessions: int
    decodes: bool = True
    cfg: bool = False
    extra_pools: int = 0


def section_load(section: str, settings) -> SectionLoad:
    """The largest set of sessions each section has open at one time (see the sections in gpu.py)."""
    most = max(settings.sessions)
    cfg = any(g > 1 for g in settings.guidance)
    return {
        "windows": SectionLoad(1, cfg=cfg),
        "sessions": SectionLoad(most),
        "official": SectionLoad(2),  # the diffusers recipe's whole sequence next to one engine session
        "backends": SectionLoad(most, decodes=False, extra_pools=1),  # a model per backend, decode off
        "overlap": SectionLoad(most, extra_pools=1),
        "cadence": SectionLoad(max(8, most)),
        "ab": SectionLoad(2 * max(settings.ab_sessions), extra_pools=2),  # both paths' sessions, a model each
        "profile": SectionLoad(1, extra_pools=2),  # one path's session at a time, but both models built
        "decoder": SectionLoad(2),  # a decoding session per path, no transformer
    }[section]


def session_bytes(model, settings, load: SectionLoad) -> int:
    """Planned device bytes of one session of ``model`` in a section of ``load`` (module docstring)."""
    config, spec = model.transformer.config, model.spec
    shape = SessionShape(model.kv_bytes_per_token, spec.tokens_per_frame, settings.context_frames,
                         max(config.intermediate_size, config.hidden_size), model.dtype.itemsize, model.vae.config,
                         spec.height, spec.width, next(model.vae.parameters()).dtype.itemsize)
    return planned_session_bytes(shape, load.cfg, load.decodes)


def section_plan(section: str, model, settings) -> dict[str, Any]:
    """The section's planned bytes (margin included) and what they are made of."""
    load = section_load(section, settings)
    per_session = session_bytes(model, settings, load)
    pools = load.extra_pools * model.kv.kv.numel() * model.kv.kv.element_size()
    planned = int(PLAN_MARGIN * (load.sessions * per_session + pools))
    return {"plan_bytes": planned, "sessions": load.sessions, "per_session_bytes": per_session,
            "extra_pool_bytes": pools, "reasoned": True}


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` now (None on a CPU: nothing to check)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])


def fit_problem(plan: dict[str, Any], device: torch.device) -> str | None:
    """Why the section cannot fit (None: it fits, or there is no device memory to check); records ``free_bytes``."""
    free = free_device_bytes(device)
    plan["free_bytes"] = free
    if free is None or plan["plan_bytes"] <= free:
        return None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    return (f"skipped: its plan needs {plan['plan_bytes'] / GIB:.1f} GiB ({plan['sessions']} session(s)) and "
            f"{name} has {free / GIB:.1f} GiB free")


def start_measuring(device: torch.device) -> int | None:
    """Bytes allocated now, with the peak reset (None on a CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def measured_extra(device: torch.device, before: int | None) -> int | None:
    """The peak a section allocated beyond what was there when it started."""
    if before is None:
        return None
    return int(torch.cuda.max_memory_allocated(device)) - before
