"""Does a step stay as cheap at window 64 as at window 1? Per-window time and KV pages over a long
rollout with a bounded context (`bench rollout --scan-windows N`).

The early and the late windows are also measured side by side: a second session starts when the
first reaches its late group, and the two step alternately, so machine drift cannot fake (or hide)
growth. "late/early" is median(windows N-s+1..N) / median(windows 1..s), s = `scan_span`.
"""

from __future__ import annotations

import time
from typing import Any

from .archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
from .measure import median, ratio
from .progress import Progress
from .results import Table
from .settings import RolloutSettings


def scan_windows(settings: RolloutSettings, progress: Progress) -> dict[str, Any]:
    """Figures of windows 1..N of one session, plus a fresh session interleaved with the late group."""
    arch = bench_arch(settings.scan_arch)
    total, span = settings.scan_windows, min(settings.scan_span, settings.scan_windows)
    model = load_model(arch, cache_dir=settings.cache_dir)
    knobs = rollout_knobs(arch, settings.num_steps, settings.context_frames)
    chunks = action_chunks(total, arch)
    main, fresh = open_session(model, arch, knobs), None
    windows: list[dict[str, Any]] = []
    fresh_s: list[float] = []
    try:
        for w in range(total):
            if w == total - span:
                fresh = open_session(model, arch, knobs)
            order = [main] if fresh is None else [main, fresh] if w % 2 == 0 else [fresh, main]
            for session in order:
                actions = chunks[w - (total - span)] if session is fresh else chunks[w]
                start = time.perf_counter()
                r = model.step([session], [actions])[0]
                elapsed = time.perf_counter() - start
                if session is fresh:
                    fresh_s.append(elapsed)
                else:
                    t = r.timings
                    windows.append({"window": w + 1, "ms": 1e3 * elapsed, "denoise_ms": 1e3 * t.denoise_s,
                                    "commit_ms": 1e3 * t.commit_s, "decode_ms": 1e3 * t.decode_s,
                                    "pages": r.kv.pages_in_use, "seq_len": r.kv.seq_len})
            if (w + 1) % 16 == 0:
                progress(f"scan {settings.scan_arch}: window {w + 1}/{total}, {windows[-1]['pages']} pages")
    finally:
        model.close_all()
    return _figures(settings, arch.chunk_size, windows, fresh_s, span)


def _figures(settings: RolloutSettings, chunk: int, windows: list[dict[str, Any]], fresh_s: list[float],
             span: int) -> dict[str, Any]:
    ms = [w["ms"] for w in windows]
    pages = [w["pages"] for w in windows]
    early, late = median(ms[:span]), median(ms[-span:])
    return {
        "arch": settings.scan_arch, "windows": len(windows), "span": span, "chunk_size": chunk,
        "num_steps": settings.num_steps, "context_frames": settings.context_frames,
        "early_ms": early, "late_ms": late, "fresh_early_ms": 1e3 * median(fresh_s),
        "late_over_early": ratio(late, early),
        "late_over_early_interleaved": ratio(late, 1e3 * median(fresh_s)),
        "pages_first": pages[0], "pages_at_span": pages[span - 1], "pages_last": pages[-1],
        "pages_max_after_span": max(pages[span - 1:]), "pages_min_after_span": min(pages[span - 1:]),
        "per_window": windows,
    }


def scan_table(f: dict[str, Any]) -> Table:
    s, n = f["span"], f["windows"]
    table = Table(
        title=(f"Windows 1..{n}, {f['arch']} model, {f['chunk_size']} actions/window, context "
               f"{f['context_frames']} latent frames, {f['num_steps']} denoise steps"),
        columns=["windows", "median ms / window", "KV pages in use (first / last)"],
        note=(f"late/early = median of windows {n - s + 1}-{n} / median of windows 1-{s} = "
              f"{f['late_over_early']:.2f}; against a fresh session's windows 1-{s} stepped alternately with "
              f"windows {n - s + 1}-{n}: {f['late_over_early_interleaved']:.2f}. Pages after window {s}: "
              f"{f['pages_min_after_span']}..{f['pages_max_after_span']}."),
    )
    rows = f["per_window"]
    table.add(f"1-{s}", f["early_ms"], f"{rows[0]['pages']} / {rows[s - 1]['pages']}")
    table.add(f"{n - s + 1}-{n}", f["late_ms"], f"{rows[n - s]['pages']} / {rows[-1]['pages']}")
    table.add(f"fresh 1-{s} (interleaved)", f["fresh_early_ms"], None)
    return table
