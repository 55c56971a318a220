"""`worldstep bench soak`: one long bounded-context rollout; KV pages and process RSS per window.

A leak anywhere on the step path (pages not released past the horizon, decoder caches that grow,
per-window tensors kept alive) shows up as growth here long before a user's overnight run dies.
RSS is read from /proc/self/statm after every window. It swings by ~20% from window to window
(the allocator returns a window's transient buffers to the OS or keeps them), so growth compares
medians of equal blocks of windows, the first starting at `rss_from` (allocators and caches settle
during the first windows) and the last ending at the last window: a leak lifts the whole block.
"""

from __future__ import annotations

import time
from typing import Any

from .archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
from .machine import describe_machine
from .measure import median, ratio, rss_bytes
from .progress import Progress
from .results import BenchResult, Table
from .settings import SoakSettings

TARGET_RSS_GROWTH_PCT = 5.0


def run_soak(settings: SoakSettings, progress: Progress) -> BenchResult:
    if settings.windows < 4:
        raise ValueError(f"windows={settings.windows} is invalid; allowed: >= 4")
    arch = bench_arch(settings.arch)
    model = load_model(arch, cache_dir=settings.cache_dir)
    chunks = action_chunks(settings.windows, arch)
    per_window: list[dict[str, Any]] = []
    session = open_session(model, arch, rollout_knobs(arch, settings.num_steps, settings.context_frames))
    try:
        for w, actions in enumerate(chunks):
            start = time.perf_counter()
            r = model.step([session], [actions])[0]
            per_window.append({"window": w + 1, "ms": 1e3 * (time.perf_counter() - start), "pages": r.kv.pages_in_use,
                               "pool_used_pages": model.kv.num_used_pages, "rss_mib": rss_bytes() / 2**20})
            if (w + 1) % 50 == 0:
                progress(f"window {w + 1}/{settings.windows}: {r.kv.pages_in_use} pages, "
                         f"RSS {per_window[-1]['rss_mib']:.0f} MiB")
    finally:
        model.close(session)
    figures = _figures(settings, arch.chunk_size, per_window, pool_after_close=model.kv.num_used_pages)
    result = BenchResult("soak", describe_machine(), settings=vars(settings).copy(), results=figures)
    result.tables.append(_table(figures))
    if figures["rss_growth_pct"] >= TARGET_RSS_GROWTH_PCT or not figures["pages_flat"]:
        result.notes.append("soak target missed: pages must stay flat and RSS grow < 5%.")
    return result


def _figures(settings: SoakSettings, chunk: int, rows: list[dict[str, Any]], pool_after_close: int) -> dict[str, Any]:
    n = len(rows)
    # The context is full once `context_frames` latent frames are committed past the first window.
    filled = min(n - 1, -(-settings.context_frames // (chunk // 4)) + 1)
    start = min(settings.rss_from, n // 2)
    block = max(1, (n - start) // 5)
    pages = [r["pages"] for r in rows]
    rss = [r["rss_mib"] for r in rows]
    early_rss, late_rss = median(rss[start:start + block]), median(rss[-block:])
    tail = pages[filled:]
    return {
        "arch": settings.arch, "windows": n, "chunk_size": chunk, "context_frames": settings.context_frames,
        "num_steps": settings.num_steps, "context_full_at_window": filled + 1,
        "pages_first": pages[0], "pages_when_full": pages[filled], "pages_last": pages[-1],
        "pages_min_after_full": min(tail), "pages_max_after_full": max(tail), "pages_flat": pages_flat(tail),
        "pool_pages_after_close": pool_after_close,
        "rss_from_window": start + 1, "rss_block_windows": block, "rss_mib_early_block": early_rss,
        "rss_mib_late_block": late_rss, "rss_growth_pct": 100 * (ratio(late_rss, early_rss) - 1),
        "rss_mib_at_from": rss[start], "rss_mib_last": rss[-1], "rss_mib_min": min(rss[start:]),
        "rss_mib_max": max(rss[start:]), "rss_endpoint_growth_pct": 100 * (ratio(rss[-1], rss[start]) - 1),
        "ms_first_decile": median([r["ms"] for r in rows[: max(1, n // 10)]]),
        "ms_last_decile": median([r["ms"] for r in rows[-max(1, n // 10):]]),
        "target_rss_growth_pct": TARGET_RSS_GROWTH_PCT,
        "per_window": rows,
    }


def pages_flat(pages: list[int]) -> bool:
    """No growth: the last half never holds more pages than the first half did (page flooring may make
    the count alternate by one page from window to window; that is not growth)."""
    half = max(1, len(pages) // 2)
    return max(pages[half:], default=0) <= max(pages[:half])


def _table(f: dict[str, Any]) -> Table:
    table = Table(
        title=(f"Soak: {f['windows']} windows, {f['arch']} model, context {f['context_frames']} latent frames, "
               f"{f['num_steps']} denoise steps"),
        columns=["figure", "value"],
        note=(f"Context full from window {f['context_full_at_window']}. RSS growth: median of the last "
              f"{f['rss_block_windows']} windows over the median of {f['rss_block_windows']} windows from window "
              f"{f['rss_from_window']} (target < {f['target_rss_growth_pct']:g}%)."),
    )
    table.add("KV pages: window 1 / context full / last", f"{f['pages_first']} / {f['pages_when_full']} / "
              f"{f['pages_last']}")
    table.add("KV pages after context full: min..max", f"{f['pages_min_after_full']}..{f['pages_max_after_full']}")
    table.add("pool pages in use after close", f["pool_pages_after_close"])
    table.add(f"RSS MiB, median: block from window {f['rss_from_window']} / last block",
              f"{f['rss_mib_early_block']:.1f} / {f['rss_mib_late_block']:.1f}")
    table.add(f"RSS MiB from window {f['rss_from_window']}: min..max (swing per window)",
              f"{f['rss_mib_min']:.1f}..{f['rss_mib_max']:.1f}")
    table.add("RSS growth %", f["rss_growth_pct"])
    table.add("ms / window: first / last decile (median)", f"{f['ms_first_decile']:.0f} / {f['ms_last_decile']:.0f}")
    return table
