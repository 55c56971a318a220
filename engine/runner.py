"""The runner: the second of a step's three calls. It runs a scheduled `StepBatch` on typed records.

Each group of the batch is one batched window (the adapter's `WindowOps.denoise`, then its `commit`, reached
through this module's `denoise_window` and `commit_window`), its decode
queued on the decode lane (its own CUDA stream) right after the denoise, so the commit runs beside the decode and
the decode of one group overlaps the denoise of the next (``decode_after_denoise=False``: after the commit, the
order before issue 47). Nothing
waits for the device until every group is queued: then the frames come to the host, with the finiteness of
every group's latents checked in the same wait. The runner changes no session: `postprocess` advances them.
A session closed from another thread before anything was committed leaves every session as it was (its RNG
included); once a group committed, the error says so and the loop closes the step's sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .adapter import DenoisedGroup, WindowOps
from .lanes import DecodeLane, PhaseClock
from .scheduler import ScheduledWindow, StepBatch
from .session import RolloutSession, SessionClosedError
from .spec import PhaseTimings
from .vae.decoder import WarmWanDecoder


def denoise_window(ctx: WindowOps, group: tuple[ScheduledWindow[RolloutSession], ...]) -> DenoisedGroup:
    """A group's denoise through the adapter, unless a session of it was closed (from another thread) since the
    step began: then nothing of the group runs."""
    for w in group:
        w.session.check_open()
    return ctx.denoise(group)


def commit_window(ctx: WindowOps, group: tuple[ScheduledWindow[RolloutSession], ...], window: DenoisedGroup) -> None:
    """A group's commit through the adapter, unless a session of it was closed since its denoise: then nothing of
    the window reaches any stream."""
    for w in group:
        w.session.check_open()
    ctx.commit(window)


@dataclass(frozen=True)
class WindowOutput:
    """What the runner made of one session's window.

    Attributes:
        latents: ``[C, n, h, w]`` float32 new latents, on the device (a chained window re-pins their tail).
        host_latents: the same on the CPU.
        frames: ``[chunk, H, W, 3]`` uint8, or None when not decoded.
        timings: this window's share of its group's phases (``other_s`` is filled in by postprocess).
    """

    latents: torch.Tensor
    host_latents: torch.Tensor
    frames: np.ndarray | None
    timings: PhaseTimings


@dataclass
class _GroupRun:
    windows: tuple[ScheduledWindow[RolloutSession], ...]
    latents: list[torch.Tensor]
    frames: list[torch.Tensor | None]
    clock: PhaseClock


@dataclass(frozen=True)
class StepRunner:
    """The adapter bound to the loop's parts (``ctx``: `adapter.WindowOps`, made once at load), the warm decoder
    and the decode lane; `run` runs a step's windows. ``decode_after_denoise``: queue a group's decode as soon as
    its latents are denoised (the commit beside it), else after its commit."""

    ctx: WindowOps
    decoder: WarmWanDecoder
    lane: DecodeLane
    decode_after_denoise: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.decode_after_denoise, bool):
            raise ValueError(f"decode_after_denoise={self.decode_after_denoise!r} is invalid; allowed: True or False")

    def run(self, batch: StepBatch[RolloutSession], decode: bool) -> list[WindowOutput]:
        """Every group of ``batch``; one output per window, in the order the sessions were given."""
        done: list[_GroupRun] = []
        sessions = [w.session for w in batch.windows]
        rng_states = [s.generator.get_state() for s in sessions]
        committed = False
        try:
            for group in batch.groups:
                clock = PhaseClock(self.ctx.device)
                clock.mark("start")
                window = denoise_window(self.ctx, group)
                clock.mark("denoise_end")
                if self.decode_after_denoise:
                    run = self._decode_group(group, window.latents, clock, decode)
                    committed = self._commit(group, window, clock)
                else:
                    committed = self._commit(group, window, clock)
                    run = self._decode_group(group, window.latents, clock, decode)
                done.append(run)
            self.lane.join()
            return self._fetch(done)
        except SessionClosedError as e:
            if not committed:  # nothing committed: the untouched sessions can simply step again
                for s, state in zip(sessions, rng_states):
                    s.generator.set_state(state)
                raise
            raise SessionClosedError(str(e), committed=True) from e

    def _commit(self, group: tuple[ScheduledWindow[RolloutSession], ...], window: DenoisedGroup,
                clock: PhaseClock) -> bool:
        """Commit the group's window, timed from ``commit_start`` (on a CPU a decode queued before it ran in place)."""
        clock.mark("commit_start")
        commit_window(self.ctx, group, window)
        clock.mark("commit_end")
        return True

    def _decode_group(self, group: tuple[ScheduledWindow[RolloutSession], ...], out: list[torch.Tensor],
                      clock: PhaseClock, decode: bool) -> _GroupRun:
        """Queue the group's decode on the lane, after the work queued so far (its denoise, and its commit when
        the decode waits for it)."""
        frames: list[torch.Tensor | None] = [None] * len(group)
        todo = [i for i, w in enumerate(group) if decode and w.session.decoder_session is not None]
        with self.lane.after_current_work() as stream:
            clock.mark("decode_start", stream)
            if todo:
                decoded = self.decoder.decode_checked([group[i].session.decoder_session for i in todo],
                                                      [out[i][None] for i in todo], output="device")
                for i, f in zip(todo, decoded):
                    frames[i] = f
            clock.mark("decode_end", stream)
        return _GroupRun(group, out, frames, clock)

    @staticmethod
    def _fetch(runs: list[_GroupRun]) -> list[WindowOutput]:
        finite = torch.stack([torch.isfinite(z).all() for r in runs for z in r.latents]).all()
        host = [([None if f is None else f.cpu().numpy() for f in r.frames], [z.cpu() for z in r.latents])
                for r in runs]
        if not bool(finite):  # checked in the same wait as the copies
            raise FloatingPointError("a window's latents contain NaN or inf; the sessions of this step are closed")
        outputs: dict[int, WindowOutput] = {}
        for r, (frames, latents) in zip(runs, host):
            n = len(r.windows)  # one batched call per phase: each window is charged its share
            timings = PhaseTimings(r.clock.seconds("start", "denoise_end") / n,
                                   r.clock.seconds("commit_start", "commit_end") / n,
                                   r.clock.seconds("decode_start", "decode_end") / n, shared_by=n)
            for w, z, zh, f in zip(r.windows, r.latents, latents, frames):
                outputs[w.index] = WindowOutput(z, zh, f, timings)
        return [outputs[i] for i in sorted(outputs)]
