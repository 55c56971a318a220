"""`worldstep bench profile`: where one env step's time goes on the CPU.

Three views per architecture, each over the same kind of window (bounded context, after a warm-up):
phases (denoise / commit / decode wall time), operators (torch.profiler self CPU time, grouped into
VAE convolutions, transformer matmuls, attention and the rest) and Python functions (cProfile
self time). A last table times the same window with 1 intra-op thread and with one per core, interleaved:
which wins depends on the model size and on what else the machine runs.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
from pathlib import Path
from typing import Any

import torch

from .archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
from .machine import describe_machine
from .measure import interleave, median, ratio
from .progress import Progress
from .results import BenchResult, Table
from .settings import ProfileSettings

_REPO = f"{Path(__file__).resolve().parents[2]}/"  # worldstep's own files, shown relative to the repository
_CATEGORIES = (  # (category, substrings of aten op names), first match wins
    ("VAE convolution", ("conv", "upsample", "pad", "replication")),
    ("attention", ("attention", "softmax")),
    ("matmul (projections, MLP)", ("mm", "addmm", "linear", "matmul", "bmm")),
    ("copies and layout", ("copy", "cat", "clone", "contiguous", "to_copy", "index", "slice", "stack", "empty")),
)


def _category(op: str) -> str:
    name = op.lower()
    for category, keys in _CATEGORIES:
        if any(k in name for k in keys):
            return category
    return "elementwise and other"


def _profile_arch(name: str, settings: ProfileSettings, progress: Progress) -> dict[str, Any]:
    arch = bench_arch(name)
    model = load_model(arch, cache_dir=settings.cache_dir)
    session = open_session(model, arch, rollout_knobs(arch, settings.num_steps, settings.context_frames))
    chunks = iter(action_chunks(4 + 3 * settings.windows + 64, arch))

    def step():
        return model.step([session], [next(chunks)])[0]

    try:
        for _ in range(1 + settings.context_frames // arch.latents_per_window):  # fill the context first
            step()
        progress(f"{name}: phases and torch.profiler over {settings.windows} windows")
        phases = []
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(settings.windows):
                t = step().timings
                phases.append({"denoise": t.denoise_s, "commit": t.commit_s, "decode": t.decode_s})
        ops = _operators(prof, settings.windows)
        progress(f"{name}: cProfile over {settings.windows} windows")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(settings.windows):
            step()
        profiler.disable()
        functions = _functions(profiler, settings.windows, settings.top)
        threads = _threads(step, settings)
    finally:
        model.close(session)
    return {"arch": name, "height": arch.height, "width": arch.width, "chunk_size": arch.chunk_size,
            "phases_ms": {k: 1e3 * median([p[k] for p in phases]) for k in phases[0]},
            "categories_ms": ops["categories"], "top_ops": ops["top"][: settings.top], "top_functions": functions,
            "threads": threads}


def _operators(prof, windows: int) -> dict[str, Any]:
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    categories: dict[str, float] = {}
    for e in events:
        key = _category(e.key)
        categories[key] = categories.get(key, 0.0) + e.self_cpu_time_total / 1e3 / windows
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"categories": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
            "top": [{"op": e.key, "ms_per_window": e.self_cpu_time_total / 1e3 / windows,
                     "calls_per_window": e.count // windows,
                     "share": ratio(e.self_cpu_time_total, total)} for e in top]}


def _functions(profiler: cProfile.Profile, windows: int, top: int) -> list[dict[str, Any]]:
    stats = pstats.Stats(profiler).stats  # {(file, line, fn): (cc, nc, tottime, cumtime, callers)}
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [{"function": f"{_short(path)}:{line}({fn})", "self_ms_per_window": 1e3 * tt / windows,
             "calls_per_window": nc // windows} for (path, line, fn), (_, nc, tt, _, _) in rows]


def _short(path: str) -> str:
    for marker in ("site-packages/", _REPO, "/lib/python"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _threads(step, settings: ProfileSettings) -> dict[str, float]:
    """Median ms per window with 1 intra-op thread vs one per core, interleaved on the same session."""
    previous, cores = torch.get_num_threads(), len(os.sched_getaffinity(0))

    def with_threads(n: int):
        def run() -> None:
            torch.set_num_threads(n)
            try:
                step()
            finally:
                torch.set_num_threads(previous)

        return run

    counts = sorted({1, cores})
    samples = interleave({str(n): with_threads(n) for n in counts}, rounds=settings.windows, warmup=0)
    return {"cores": cores, "ms_by_threads": {name: s.median_ms for name, s in samples.items()}}


def run_profile(settings: ProfileSettings, progress: Progress) -> BenchResult:
    result = BenchResult("profile", describe_machine(), settings=vars(settings).copy())
    started = time.perf_counter()
    profiles = {name: _profile_arch(name, settings, progress) for name in settings.archs}
    result.results = {"profiles": profiles, "elapsed_s": time.perf_counter() - started}
    for p in profiles.values():
        result.tables += _tables(p)
    return result


def _tables(p: dict[str, Any]) -> list[Table]:
    title = f"{p['arch']} model {p['height']}x{p['width']}, {p['chunk_size']} actions/window"
    phases = Table(f"Phases of one window, {title}", ["phase", "ms", "share"])
    total = sum(p["phases_ms"].values())
    for k, v in p["phases_ms"].items():
        phases.add(k, v, ratio(v, total))
    cats = Table(f"Operator self CPU time by kind (torch.profiler), {title}", ["kind", "ms / window", "share"])
    cat_total = sum(p["categories_ms"].values())
    for k, v in p["categories_ms"].items():
        cats.add(k, v, ratio(v, cat_total))
    ops = Table(f"Top operators, {title}", ["op", "ms / window", "calls / window", "share"])
    for o in p["top_ops"]:
        ops.add(o["op"], o["ms_per_window"], o["calls_per_window"], o["share"])
    fns = Table(f"Top Python functions by self time (cProfile), {title}", ["function", "self ms / window",
                                                                            "calls / window"])
    for f in p["top_functions"]:
        fns.add(f["function"], f["self_ms_per_window"], f["calls_per_window"])
    threads = Table(f"Intra-op threads, {title}", ["threads", "ms / window"],
                    note="Interleaved windows of the same session.")
    for n, ms in p["threads"]["ms_by_threads"].items():
        threads.add(int(n), ms)
    return [phases, cats, ops, fns, threads]
