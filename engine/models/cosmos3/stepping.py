"""One `Cosmos3WorldModel.step`: the admitted sessions run in parts, each part's decode queued on the decode lane.

A part is a group of sessions that share one batched window (`window.group_key`); with ``overlap`` a group of
two or more is split in halves, so the decode of one half (on its own CUDA stream) overlaps the denoise of the
next. Nothing waits for the device until every part is queued: then the frames come to the host, with the
finiteness of every part's latents checked in the same wait. A failure closes every session of the step (a
window that failed, and the windows already committed with it, never leave half-reported state behind);
a session closed from another thread before anything was committed leaves the others as they were.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...lanes import DecodeLane, PhaseClock
from ...scheduler import group
from ...vae import WarmWanDecoder
from .session import RolloutSession, SessionClosedError
from .spec import KVStats, PhaseTimings, WindowResult
from .window import WindowContext, group_key, run_window


@dataclass
class _Part:
    sessions: list[RolloutSession]
    indices: list[int]
    latents: list[torch.Tensor]
    frames: list[torch.Tensor | None]
    clock: PhaseClock
    frame_spans: list[tuple[int, int]]
    window_indices: list[int]


def parts_of(sessions: list[RolloutSession], overlap: bool) -> list[list[int]]:
    """Indices of the sessions of each part, in order."""
    parts = []
    for members in group(sessions, group_key):
        half = len(members) // 2
        parts.extend([members[:half], members[half:]] if overlap and half else [members])
    return parts


def run_step(ctx: WindowContext, decoder: WarmWanDecoder, lane: DecodeLane, sessions: list[RolloutSession],
             actions: list[np.ndarray], *, decode: bool, overlap: bool) -> list[tuple[torch.Tensor, np.ndarray | None,
                                                                                     PhaseTimings, int, tuple]]:
    """Run every part; returns per session (latents on the CPU, frames, timings, window index, frame span)."""
    done: list[_Part] = []
    rng_states = [s.generator.get_state() for s in sessions]
    try:
        for members in parts_of(sessions, overlap):
            done.append(_run_part(ctx, decoder, lane, [sessions[i] for i in members], members,
                                  [actions[i] for i in members], decode))
        lane.join()
        return _fetch(done, len(sessions))
    except SessionClosedError:
        if not done:  # nothing committed: the untouched sessions can simply step again
            for s, state in zip(sessions, rng_states):
                s.generator.set_state(state)
        raise


def _run_part(ctx: WindowContext, decoder: WarmWanDecoder, lane: DecodeLane, part: list[RolloutSession],
              indices: list[int], actions: list[np.ndarray], decode: bool) -> _Part:
    clock = PhaseClock(ctx.device)
    clock.mark("start")
    out = run_window(ctx, part, actions, clock)
    spans = [s.frame_span() for s in part]
    windows = [s.window_index for s in part]
    for s, latents in zip(part, out):
        s.last_latents, s.window_index = latents, s.window_index + 1
    frames: list[torch.Tensor | None] = [None] * len(part)
    todo = [i for i, s in enumerate(part) if decode and s.decode_stream is not None]
    with lane.after_current_work() as stream:
        clock.mark("decode_start", stream)
        if todo:
            decoded = decoder.decode_batch([part[i].decode_stream for i in todo], [out[i][None] for i in todo],
                                           output="device")
            for i, f in zip(todo, decoded):
                frames[i] = f
        clock.mark("decode_end", stream)
    return _Part(part, indices, out, frames, clock, spans, windows)


def _fetch(parts: list[_Part], count: int) -> list:
    results: list = [None] * count
    finite = torch.stack([torch.isfinite(z).all() for p in parts for z in p.latents]).all()
    host = [([None if f is None else f.cpu().numpy() for f in p.frames], [z.cpu() for z in p.latents]) for p in parts]
    if not bool(finite):  # checked in the same wait as the copies
        raise FloatingPointError("a window's latents contain NaN or inf; the sessions of this step are closed")
    for p, (frames, latents) in zip(parts, host):
        timings = PhaseTimings(p.clock.seconds("start", "denoise_end"), p.clock.seconds("denoise_end", "commit_end"),
                               p.clock.seconds("decode_start", "decode_end"))
        for i, f, z, span, w in zip(p.indices, frames, latents, p.frame_spans, p.window_indices):
            results[i] = (z, f, timings, w, span)
    return results


def window_result(latents, frames, timings, window_index, span, kv: KVStats) -> WindowResult:
    return WindowResult(window_index, latents, frames, span[0], span[1], timings, kv)
