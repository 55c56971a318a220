"""`WarmWanDecoder`: decode the latents of many live sessions window by window with one shared Wan VAE.

Each session (`DecodeSession`) carries its own causal-conv cache, so a window decodes only its new
latents. With one latent per call (the default) a session issues the same decoder calls, with the same
shapes, as `vae.decode` does for the whole clip; only `post_quant_conv`, a pointwise 1x1x1 conv that
runs here one latent at a time instead of over the whole clip, may round differently (kernels pick
their path by shape). The frames therefore equal one whole-clip decode within float32 rounding
(max |diff| <= 1e-5 in [-1, 1] pixels, at most 1 uint8 level; see docs/exactness.md), and they are
bit-identical whatever the window pattern and whichever other sessions are decoded alongside, unless
`DecoderOptions.batch_sessions` stacks the sessions of one step into one set of calls (a bounded rounding
cost for one call per group instead of one per session: `BATCHED_DECODE_ATOL`). A session
without a cache re-decodes its retained context ahead of the window from an empty cache and keeps
only the new frames (the stateless path).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..lanes import hand_over, written_event
from .cache import compact, compact_slots, count_slots, session_tensors
from .jobs import Output, WindowDecoder, WindowJob, stacked_batches
from .latents import LatentNorm
from .options import DecoderOptions, resolve_dtype, resolve_switches
from .perf import cudnn_benchmark, decoder_copy
from .session import DecodePath, DecodeSession
from .slots import WarmSlots, give_back

_session_ids = itertools.count()


class WarmWanDecoder:
    """Decodes latents into uint8 frames with one `AutoencoderKLWan`, window by window, one `DecodeSession` per video.

    The VAE's decoder and `post_quant_conv` must sit on one device (offload hooks on
    `vae.decode` are not honoured: the decoder is called directly). The VAE itself is never
    mutated; with `channels_last`, `onednn_conv`, `fused` or another dtype the decoder runs on a private copy.
    "auto" options are decided here by the VAE's device (the attributes of the same names hold the decisions).

    Args:
        vae: a diffusers `AutoencoderKLWan` (Wan 2.1 or 2.2 family), in eval mode.
        options: `DecoderOptions`; defaults when None.
    """

    def __init__(self, vae: torch.nn.Module, options: DecoderOptions | None = None) -> None:
        if options is not None and not isinstance(options, DecoderOptions):
            raise TypeError(f"options must be a DecoderOptions, got {type(options).__name__}")
        self.vae = vae
        self.options = options if options is not None else DecoderOptions()
        weight = vae.post_quant_conv.weight
        self.device: torch.device = weight.device
        self.dtype: torch.dtype = resolve_dtype(self.options.dtype, self.device, weight.dtype)
        self.prelude_dtype = torch.promote_types(weight.dtype, self.dtype)  # de-normalisation, post_quant_conv
        self.channels_last, self.cudnn_benchmark, self.fused = resolve_switches(self.options, self.device)
        self.z_dim: int = vae.config.z_dim
        self.patch_size: int | None = vae.config.patch_size
        self.temporal_factor: int = 2 ** sum(bool(t) for t in vae.config.temperal_downsample)
        self._norm = LatentNorm.from_vae(vae, self.device, self.prelude_dtype)
        self._decoder = decoder_copy(vae.decoder, channels_last=self.channels_last,
                                     onednn_conv=self.options.onednn_conv, fused=self.fused, dtype=self.dtype)
        self._runner = WindowDecoder(
            decoder=self._decoder,
            post_quant_conv=decoder_copy(vae.post_quant_conv, onednn_conv=self.options.onednn_conv,
                                         dtype=self.prelude_dtype),
            num_slots=count_slots(self._decoder),
            latents_per_call=self.options.latents_per_call,
            channels_last=self.channels_last,
            patch_size=self.patch_size,
            dtype=self.dtype,
        )
        self._warm = WarmSlots()

    # sessions

    def open_session(self) -> DecodeSession:
        """A new session; it picks warm or stateless at its first window."""
        return DecodeSession(session_id=next(_session_ids), owner=id(self))

    @contextlib.contextmanager
    def session(self) -> Iterator[DecodeSession]:
        """`open_session` as a context manager: the session is closed on any exit (an aborted episode too)."""
        session = self.open_session()
        try:
            yield session
        finally:
            self.close_session(session)

    def close_session(self, session: DecodeSession) -> None:
        """Free the session's cache and context and its warm slot. Idempotent; waits for a decode of
        this session running in another thread. Use it for normal ends and aborts alike."""
        self._check_owner(session)
        with session.lock:
            session.closed = True
            session.slots = None
            session.context = None
            if session.slot_release is not None:
                session.slot_release()  # runs once; also unregisters the collection hook

    def fork_session(self, session: DecodeSession) -> DecodeSession:
        """An independent copy of `session` at the same point: cache and retained context are shared
        snapshots (slots and context are replaced, never edited), so the two may diverge freely. The fork of a
        warm session needs a warm slot of its own; with the cap reached it becomes stateless and re-decodes behind
        its copied context."""
        self._check_open(session)
        with session.lock:
            fork = DecodeSession(
                session_id=next(_session_ids),
                owner=id(self),
                latents_decoded=session.latents_decoded,
                frames_decoded=session.frames_decoded,
                grid=session.grid,
                context=session.context,
                written=session.written,
            )
            if session.path is DecodePath.WARM:
                fork.path = self._choose_path(fork)
                if fork.path is DecodePath.WARM and session.slots is not None:
                    fork.slots = list(session.slots)
            else:
                fork.path = session.path
        return fork

    @property
    def live_warm_sessions(self) -> int:
        """Sessions holding a warm slot (counted against `max_warm_sessions`)."""
        return len(self._warm)

    def cache_bytes(self, session: DecodeSession) -> int:
        """Bytes of `session`'s causal-conv cache (0 for stateless or closed sessions)."""
        return session.cache_bytes

    # decode

    def decode(self, session: DecodeSession, latents: torch.Tensor) -> np.ndarray:
        """Decode one window of `session`.

        Args:
            latents: normalised (model-space) latents `[C, t, h, w]` or `[1, C, t, h, w]`.
        Returns:
            uint8 `[T, H, W, 3]` on the CPU; `T = 1 + 4(t-1)` for the first window, `4t` later.
        """
        return self.decode_batch([session], [latents])[0]

    def decode_pixels(self, session: DecodeSession, latents: torch.Tensor) -> torch.Tensor:
        """`decode`, returning the window's pixels before the uint8 mapping: `[1, 3, T, H, W]` in [-1, 1], on
        the CPU, in `latents.dtype` (the slice of `vae.decode(...).sample` for fidelity checks)."""
        return self.decode_batch([session], [latents], output="pixels")[0]

    def decode_batch(self, sessions: Sequence[DecodeSession], latents: Sequence[torch.Tensor],
                     output: Output = "frames") -> list:
        """Decode one window of each session: each through its own decoder calls (the calls it would make
        alone), or with `DecoderOptions.batch_sessions` the sessions of one latent grid, window length and cache
        layout stacked into one set of calls (within `BATCHED_DECODE_ATOL` of the per-session frames). All or
        nothing: if any session's run raises, no session advances, and every cache a run had touched is dropped
        (that session's retry re-decodes behind its context, then continues warm).

        Args:
            sessions: distinct open sessions of this decoder.
            latents: per session, normalised `[C, t, h, w]` or `[1, C, t, h, w]`.
            output: "frames" (uint8 `[T, H, W, 3]` numpy), "pixels" (see `decode_pixels`) or "device"
                (uint8 `[T, H, W, 3]` left on the decoder's device: nothing waits for the device, so the
                caller can queue more work before fetching; the latents' finiteness is then the caller's
                to check, also without a wait).
        Returns:
            per session, its window (on the CPU unless ``output="device"``).
        """
        if output not in ("frames", "pixels", "device"):
            raise ValueError(f"output must be 'frames', 'pixels' or 'device', got {output!r}")
        return self.decode_checked(sessions, self._check_batch(sessions, latents, check_finite=output != "device"),
                                   output)

    def decode_checked(self, sessions: Sequence[DecodeSession], windows: Sequence[torch.Tensor],
                       output: Output) -> list:
        """`decode_batch` for windows the model just made (``[1, C, t, h, w]`` on the device) on distinct sessions of
        this decoder: only what another thread can change is checked, under each session's lock."""
        held: list[threading.Lock] = []
        try:
            for s in sessions:
                if not s.lock.acquire(blocking=False):
                    raise ValueError(f"session {s.session_id} is being decoded by another call; wait for it")
                held.append(s.lock)
                self._check_open(s)  # a close in another thread may have won the race
            return self._decode_locked(list(sessions), list(windows), output)
        finally:
            for lock in held:
                lock.release()

    def _decode_locked(self, sessions: list[DecodeSession], windows: list[torch.Tensor], output: Output) -> list:
        with torch.inference_mode(), cudnn_benchmark(self.cudnn_benchmark):
            for s in sessions:
                if s.path is None:
                    s.path = self._choose_path(s)
            for s, z in zip(sessions, windows):  # made or last written maybe on another CUDA stream (decode lane)
                hand_over(self.device, [z, *session_tensors(s)], s.written)
            jobs = [self._job(s, z, output) for s, z in zip(sessions, windows)]
            self._run_jobs(jobs)
            written = written_event(self.device)
            for job in jobs:
                self._commit(job)
                job.session.written = written
        return [job.result() for job in jobs]

    def _job(self, session: DecodeSession, z: torch.Tensor, output: Output) -> WindowJob:
        cold = session.slots is None
        return WindowJob(
            session=session,
            z=self._norm.denormalize(z),  # [1,C,t,h,w] raw, prelude dtype
            context=session.context if cold else None,  # re-decoded ahead of the window, frames dropped
            cold=cold,
            out_dtype=z.dtype,
            output=output,
        )

    def _run_jobs(self, jobs: list[WindowJob]) -> None:
        touched: list[DecodeSession] = []
        try:
            for batch in stacked_batches(jobs) if self.options.batch_sessions else [[job] for job in jobs]:
                touched += [job.session for job in batch if not job.cold]
                if len(batch) == 1:
                    self._runner.run(batch[0])
                else:
                    self._runner.run_stacked(batch)
        except BaseException:
            for s in touched:  # a half-advanced cache must never be continued
                s.slots = None
            raise

    def _commit(self, job: WindowJob) -> None:
        s = job.session
        if s.path is DecodePath.WARM:
            compact_slots(job.slots)
            s.slots = job.slots
        kept = job.x_new if s.context is None else torch.cat([s.context, job.x_new], dim=2)
        s.context = compact(kept[:, :, -self.options.context_latents :])  # [1,C,<=K,h,w]
        s.grid = (job.z.shape[3], job.z.shape[4])
        s.latents_decoded += job.z.shape[2]
        s.frames_decoded += job.num_frames

    # warm slots

    def _choose_path(self, session: DecodeSession) -> DecodePath:
        """Warm when the switch is on and a slot is free; decided once per session."""
        if not self.options.warm_cache:
            return DecodePath.STATELESS
        if not self._warm.take(session.session_id, self.options.max_warm_sessions):
            return DecodePath.STATELESS
        # A session dropped without close still gives its slot back when collected (a plain function over
        # the ledger: nothing in the session reaches the decoder).
        session.slot_release = weakref.finalize(session, give_back, self._warm, session.session_id)
        return DecodePath.WARM

    # checks

    def _check_owner(self, session: DecodeSession) -> None:
        if not isinstance(session, DecodeSession):
            raise TypeError(f"session must be a DecodeSession, got {type(session).__name__}")
        if session.owner != id(self):
            raise ValueError(f"session {session.session_id} belongs to another WarmWanDecoder")

    def _check_open(self, session: DecodeSession) -> None:
        self._check_owner(session)
        if session.closed:
            raise ValueError(f"session {session.session_id} is closed; open a new one with open_session()")

    def _check_batch(self, sessions: Sequence[DecodeSession], latents: Sequence[torch.Tensor],
                     check_finite: bool = True) -> list[torch.Tensor]:
        if len(sessions) != len(latents) or not sessions:
            raise ValueError(f"need one latents tensor per session: {len(sessions)} sessions, {len(latents)} tensors")
        if len(set(map(id, sessions))) != len(sessions):
            raise ValueError("a session appears twice in one decode_batch call; decode its windows in turn")
        windows = []
        for s, z in zip(sessions, latents):
            self._check_open(s)
            windows.append(self._check_latents(s, z, check_finite))
        return windows

    def _check_latents(self, session: DecodeSession, z: torch.Tensor, check_finite: bool = True) -> torch.Tensor:
        """The window as `[1, C, t, h, w]` on the decoder's device, or ValueError naming `latents`."""
        if not isinstance(z, torch.Tensor) or not z.is_floating_point():
            raise ValueError(f"latents must be a floating-point torch.Tensor, got {type(z).__name__}")
        z = z.unsqueeze(0) if z.ndim == 4 else z
        if z.ndim != 5 or z.shape[0] != 1 or z.shape[1] != self.z_dim or min(z.shape[2:]) < 1:
            raise ValueError(
                f"latents must be [C, t, h, w] or [1, C, t, h, w] with C = z_dim = {self.z_dim} and t, h, w >= 1, "
                f"got shape {tuple(z.shape)}"
            )
        if session.grid is not None and tuple(z.shape[3:]) != session.grid:
            raise ValueError(f"latents grid {tuple(z.shape[3:])} differs from session grid {session.grid}")
        z = z.to(self.device)
        if check_finite and not bool(torch.isfinite(z).all()):  # a host wait: callers queueing work check later
            raise ValueError("latents contain NaN or Inf; a warm cache would carry them into every later window")
        return z
