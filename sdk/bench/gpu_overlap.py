"""`bench gpu --sections overlap`: does splitting a decoding group pay on this GPU?

The engine's decode overlap runs a group of N decoding sessions as two forwards of N/2, the decode of one half
on its own stream while the other half denoises. Whether that beats ONE forward of N (decodes in turn after it)
depends on the GPU and the sizes, so it is measured: the same N sessions stepped with decoding, once on the
bench model (overlap off) and once on a model over the same modules with overlap on. Rows say which they are;
"N sessions" elsewhere always means one forward of N.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .gpu_sessions import measure_sessions
from .measure import ratio
from .progress import Progress
from .results import Table
from .settings import GpuSettings


def measure_overlap(components, model, arch, settings: GpuSettings, progress: Progress) -> dict[str, Any]:
    """ms per decoding step of N = max(``settings.sessions``) sessions, one forward of N vs two halves overlapped."""
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

    count = max(settings.sessions)
    one = dataclasses.replace(settings, sessions=[count])
    split = Cosmos3WorldModel(components, device=model.device, num_pages=model.kv.num_pages,
                              page_size=model.kv.page_size, attention_backend=model.backend.value,
                              height=model.spec.height, width=model.spec.width, overlap_decode=True)
    progress(f"{count} decoding sessions: one forward of {count}, then two halves with the decode overlapped")
    whole = measure_sessions(model, arch, one, progress)[0]
    halves = measure_sessions(split, arch, one, progress)[0]
    return {
        "sessions": count, "num_steps": settings.session_steps,
        "ms_one_forward": whole["ms_per_batched_step"], "forwards_one": whole["forwards_per_window"],
        "ms_overlapped_halves": halves["ms_per_batched_step"], "forwards_halves": halves["forwards_per_window"],
        "overlap_speedup": ratio(whole["ms_per_batched_step"], halves["ms_per_batched_step"]),
        "overlap_wins": halves["ms_per_batched_step"] < whole["ms_per_batched_step"],
    }


def overlap_table(f: dict[str, Any]) -> Table:
    o = f["overlap"]
    table = Table(title=f"decode overlap, {o['sessions']} decoding sessions at {f['height']}x{f['width']}",
                  columns=["sessions", "one forward ms / step", "halves overlapped ms / step", "speedup", "wins"],
                  note="halves: two forwards of N/2 per denoise step, one half's decode on its own stream.")
    table.add(o["sessions"], o["ms_one_forward"], o["ms_overlapped_halves"], o["overlap_speedup"],
              o["overlap_wins"])
    return table
