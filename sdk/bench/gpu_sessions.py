"""`bench gpu` section `sessions`: N sessions per batched step, their throughput and their memory.

Each N steps its sessions together (`step_batch`: one forward per denoise step for all of them) with the
bench's actions. The transformer's forward calls per window are counted, so ``one_forward_of_n`` says
that N sessions took as many forwards as one (decode overlap, which splits a group, is off: gpu_model.py).
The figures are aggregate env steps per second and video seconds per wall second, the peak KV pages in
use next to what `worldstep info`'s memory plan (`worldstep.memory.plan`) says N episodes hold at their
peak, and the peak device memory split into weights, the KV pool (allocated whole at load) and the rest
(activations, warm decoder caches).
"""

from __future__ import annotations

from typing import Any

import torch

from .archs import action_chunks
from .gpu_model import counting_forwards, open_sessions
from .measure import SyncedStopwatch, device_sync, median, ratio
from .progress import Progress
from .results import Table
from .settings import GpuSettings

_CONFIG_OF_ARCH = {"edge": "cosmos3_edge"}


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _plan(model, arch, knobs, windows: int, text_tokens: int):
    """`worldstep info`'s plan for this model, rollout and cache, with the prompt's measured token count."""
    from worldstep.config import load_config
    from worldstep.memory import plan

    config = load_config(_CONFIG_OF_ARCH.get(arch.name, "tiny")).with_overrides(
        rollout={"chunk_size": knobs.chunk_size, "num_steps": knobs.num_steps,
                 "guidance_scale": float(knobs.guidance_scale), "context_frames": knobs.context_frames},
        cache={"page_size": model.kv.page_size, "num_pages": model.kv.num_pages},
    )
    return plan(config, windows=windows, text_tokens=text_tokens, text_tokens_measured=True,
                kv_bytes_per_token=model.kv_bytes_per_token, tokens_per_frame=model.spec.tokens_per_frame)


def measure_sessions(model, arch, settings: GpuSettings, progress: Progress) -> list[dict[str, Any]]:
    from worldstep.engine.config import RolloutKnobs

    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=settings.session_steps, context_frames=8)
    cuda = model.device.type == "cuda"
    fixed = _bytes(model.transformer) + _bytes(model.vae) + model.kv.kv.numel() * model.kv.kv.element_size()
    out = []
    for count in settings.sessions:
        progress(f"{count} session(s), {knobs.num_steps} steps: 1 warm-up + {settings.windows} windows")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        sessions = open_sessions(model, arch, knobs, count, seed=100)
        walls, forwards, peak_pages, sync = [], [], model.kv.num_used_pages, device_sync(model.device)
        try:
            text_tokens = model.kv_stats(sessions[0]).protected_tokens
            for w, actions in enumerate(action_chunks(settings.windows + 1, arch)):
                with counting_forwards(model) as calls:
                    watch = SyncedStopwatch(sync)
                    model.step(sessions, [actions] * count)
                    wall = watch.elapsed()[0]
                if w > 0:
                    walls.append(wall)
                    forwards.append(calls[0])
                peak_pages = max(peak_pages, model.kv.num_used_pages)
        finally:
            for s in sessions:
                model.close(s)
        plan = _plan(model, arch, knobs, settings.windows + 1, text_tokens)
        wall = median(walls)
        peak_bytes = torch.cuda.max_memory_allocated() if cuda else None
        out.append({
            "sessions": count, "num_steps": knobs.num_steps, "ms_per_batched_step": 1e3 * wall,
            "forwards_per_window": max(forwards),
            "env_steps_per_s": ratio(count, wall),
            "video_s_per_s": ratio(count * arch.chunk_size / model.spec.fps, wall),
            "peak_kv_pages": peak_pages, "plan_kv_pages": count * plan.peak_pages_per_episode,
            "page_bytes": plan.page_bytes, "kv_pages_after_close": model.kv.num_used_pages,
            "peak_device_bytes": peak_bytes, "weights_and_pool_bytes": fixed,
            "other_peak_bytes": None if peak_bytes is None else peak_bytes - fixed,
            "plan": plan.to_dict(),
        })
    base = out[0]["env_steps_per_s"] if out else None
    for row in out:
        row["throughput_vs_first"] = ratio(row["env_steps_per_s"], base) if base else None
        # one forward of N: N sessions take as many transformer forwards per window as one session does
        row["one_forward_of_n"] = row["forwards_per_window"] == out[0]["forwards_per_window"]
    return out


def sessions_table(f: dict[str, Any]) -> Table:
    gib = 2**30
    table = Table(
        title=f"{f['arch']} sessions per batched step at {f['height']}x{f['width']} ({f['attention_backend']})",
        columns=["sessions", "ms / step", "env steps/s", "x first", "video s/s", "peak KV pages", "plan pages",
                 "peak GiB", "weights+pool GiB", "other GiB"],
        note="plan pages: `worldstep info`'s peak pages per episode times N (prompt tokens measured). other: "
             "peak device memory beyond weights and the whole KV pool (activations, warm decoder caches).",
    )
    for r in f["sessions"]:
        peak = r["peak_device_bytes"]
        table.add(r["sessions"], r["ms_per_batched_step"], r["env_steps_per_s"], r["throughput_vs_first"],
                  r["video_s_per_s"], r["peak_kv_pages"], r["plan_kv_pages"], None if peak is None else peak / gib,
                  r["weights_and_pool_bytes"] / gib, None if peak is None else r["other_peak_bytes"] / gib)
    return table
