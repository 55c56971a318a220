"""`bench gpu` section `profile`: where one window's time goes, from a torch profiler trace.

Each path (`gpu_variants.py`) steps one session to full context, then one window runs under
`torch.profiler.profile`. The events are aggregated by name; the top ``--profile-top`` by self time on the
device (the kernels; on a CPU, the operators' self CPU time) become a small table in the JSON and a markdown
table for a README.
"""

from __future__ import annotations

from typing import Any

import torch

from .archs import action_chunks
from .gpu_ab import path_models
from .gpu_model import MAX_WARM_UP, fill_context, open_sessions
from .measure import device_sync
from .progress import Progress
from .results import Table
from .settings import GpuSettings


def measure_profile(components, model, arch, settings: GpuSettings, progress: Progress) -> dict[str, Any]:
    from worldstep.engine.config import RolloutKnobs

    cuda = model.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=settings.session_steps,
                         context_frames=settings.context_frames)
    out: dict[str, Any] = {"time": "self device time (kernels)" if cuda else "self CPU time (operators)",
                           "num_steps": knobs.num_steps, "paths": {}}
    for name, (m, variant) in path_models(components, model, arch, progress).items():
        progress(f"profile {name}: warm-up to full context, then one profiled window")
        session = open_sessions(m, arch, knobs, 1, seed=500)[0]
        chunks = iter(action_chunks(MAX_WARM_UP + 1, arch))
        sync = device_sync(m.device)
        try:
            fill_context(m, session, chunks)
            sync()
            with torch.profiler.profile(activities=activities) as prof:
                m.step([session], [next(chunks)])
                sync()
        finally:
            m.close(session)
        top = top_events(prof.key_averages(), cuda, settings.profile_top)
        out["paths"][name] = {"knobs": variant.knobs, "refused": variant.refused, **top,
                              "markdown": markdown(top["top"])}
    return out


def _self_us(event, cuda: bool) -> float:
    """An aggregated event's self time in microseconds on the device (CUDA) or the CPU."""
    if not cuda:
        return float(event.self_cpu_time_total)
    for attr in ("self_device_time_total", "self_cuda_time_total"):  # the name changed across torch versions
        if hasattr(event, attr):
            return float(getattr(event, attr))
    return 0.0


def top_events(events, cuda: bool, top: int) -> dict[str, Any]:
    """The ``top`` events by self time: name, calls, ms and share of all events' self time."""
    timed = [(e.key, int(e.count), _self_us(e, cuda)) for e in events]
    total = sum(us for _, _, us in timed)
    timed.sort(key=lambda t: t[2], reverse=True)
    rows = [{"name": name, "calls": calls, "ms": us / 1e3, "share": us / total if total > 0 else float("nan")}
            for name, calls, us in timed[:top] if us > 0]
    return {"total_ms": total / 1e3, "events": len(timed), "top": rows}


def markdown(rows: list[dict[str, Any]], width: int = 60) -> str:
    """A markdown table of `top_events` rows (long kernel names cut to ``width`` characters)."""
    lines = ["| event | calls | ms | share |", "|---|---:|---:|---:|"]
    for r in rows:
        name = r["name"] if len(r["name"]) <= width else r["name"][: width - 1] + "…"
        name = name.replace("|", "\\|")
        lines.append(f"| `{name}` | {r['calls']} | {r['ms']:.2f} | {100 * r['share']:.1f}% |")
    return "\n".join(lines)


def profile_table(f: dict[str, Any]) -> Table:
    p = f["profile"]
    table = Table(title=f"one window at N = 1 under the torch profiler, {f['arch']}, {p['num_steps']} steps: "
                        f"top events by {p['time']}", columns=["path", "event", "calls", "ms", "share"],
                  note="Events aggregated by name over one window at full context; share: of all events' self time.")
    for name, path in p["paths"].items():
        for r in path["top"]:
            table.add(name, r["name"][:80], r["calls"], r["ms"], r["share"])
    return table
