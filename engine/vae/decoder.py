"""`WarmWanDecoder`: decode many live latent streams window by window with one shared Wan VAE.

Each stream (`DecodeStream`) carries its own causal-conv cache, so a window decodes only its new
latents. With one latent per call (the default) a stream issues the same decoder calls, with the same
shapes, as `vae.decode` does for the whole stream; only `post_quant_conv`, a pointwise 1x1x1 conv that
runs here one latent at a time instead of over the whole clip, may round differently (kernels pick
their path by shape). The frames therefore equal one whole-stream decode within float32 rounding
(max |diff| <= 1e-5 in [-1, 1] pixels, at most 1 uint8 level; see docs/exactness.md), and they are
bit-identical whatever the window pattern and whichever other streams are decoded alongside, unless
`DecoderOptions.batch_streams` stacks the streams of one step into one set of calls (a bounded rounding
cost for one call per group instead of one per stream: `BATCHED_DECODE_ATOL`). A stream
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
from .cache import compact, compact_slots, count_slots, stream_tensors
from .jobs import Output, WindowDecoder, WindowJob, stacked_batches
from .latents import LatentNorm
from .options import DecoderOptions
from .perf import cudnn_benchmark, decoder_copy
from .slots import WarmSlots, give_back
from .stream import DecodeStream, StreamPath

_stream_ids = itertools.count()

# A warm stream vs one `vae.decode` of the whole stream, in [-1, 1] pixels: only `post_quant_conv`'s call
# shape differs (per latent vs whole clip), so they agree within float32 rounding. Measured max 3.8e-6 on
# the test VAEs over seeds, window patterns and CPU kernel selections (docs/exactness.md).
WHOLE_STREAM_DECODE_ATOL = 1e-5


class WarmWanDecoder:
    """Streams latents of one `AutoencoderKLWan` into uint8 frames, window by window.

    The VAE's decoder and `post_quant_conv` must sit on one device (offload hooks on
    `vae.decode` are not honoured: the decoder is called directly). The VAE itself is never
    mutated; with `channels_last` or `onednn_conv` the decoder runs on a private copy.

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
        self.dtype: torch.dtype = getattr(torch, self.options.dtype) if self.options.dtype else weight.dtype
        self.z_dim: int = vae.config.z_dim
        self.patch_size: int | None = vae.config.patch_size
        self.temporal_factor: int = 2 ** sum(bool(t) for t in vae.config.temperal_downsample)
        self._norm = LatentNorm.from_vae(vae, self.device, self.dtype)
        self._decoder = decoder_copy(vae.decoder, channels_last=self.options.channels_last,
                                     onednn_conv=self.options.onednn_conv, dtype=self.dtype)
        self._runner = WindowDecoder(
            decoder=self._decoder,
            post_quant_conv=decoder_copy(vae.post_quant_conv, onednn_conv=self.options.onednn_conv, dtype=self.dtype),
            num_slots=count_slots(self._decoder),
            latents_per_call=self.options.latents_per_call,
            channels_last=self.options.channels_last,
            patch_size=self.patch_size,
        )
        self._warm = WarmSlots()

    # streams

    def open_stream(self) -> DecodeStream:
        """A new stream; it picks warm or stateless at its first window."""
        return DecodeStream(stream_id=next(_stream_ids), owner=id(self))

    @contextlib.contextmanager
    def stream(self) -> Iterator[DecodeStream]:
        """`open_stream` as a context manager: the stream is closed on any exit (an aborted episode too)."""
        stream = self.open_stream()
        try:
            yield stream
        finally:
            self.close_stream(stream)

    def close_stream(self, stream: DecodeStream) -> None:
        """Free the stream's cache and context and its warm slot. Idempotent; waits for a decode of
        this stream running in another thread. Use it for normal ends and aborts alike."""
        self._check_owner(stream)
        with stream.lock:
            stream.closed = True
            stream.slots = None
            stream.context = None
            if stream.slot_release is not None:
                stream.slot_release()  # runs once; also unregisters the collection hook

    def fork_stream(self, stream: DecodeStream) -> DecodeStream:
        """An independent copy of `stream` at the same point: cache and retained context are shared
        snapshots (slots and context are replaced, never edited), so the two may diverge freely. The fork of a
        warm stream needs a warm slot of its own; with the cap reached it becomes stateless and re-decodes behind
        its copied context."""
        self._check_open(stream)
        with stream.lock:
            fork = DecodeStream(
                stream_id=next(_stream_ids),
                owner=id(self),
                latents_decoded=stream.latents_decoded,
                frames_decoded=stream.frames_decoded,
                grid=stream.grid,
                context=stream.context,
                written=stream.written,
            )
            if stream.path is StreamPath.WARM:
                fork.path = self._choose_path(fork)
                if fork.path is StreamPath.WARM and stream.slots is not None:
                    fork.slots = list(stream.slots)
            else:
                fork.path = stream.path
        return fork

    @property
    def live_warm_streams(self) -> int:
        """Streams holding a warm slot (counted against `max_warm_streams`)."""
        return len(self._warm)

    def cache_bytes(self, stream: DecodeStream) -> int:
        """Bytes of `stream`'s causal-conv cache (0 for stateless or closed streams)."""
        return stream.cache_bytes

    # decode

    def decode(self, stream: DecodeStream, latents: torch.Tensor) -> np.ndarray:
        """Decode one window of `stream`.

        Args:
            latents: normalised (model-space) latents `[C, t, h, w]` or `[1, C, t, h, w]`.
        Returns:
            uint8 `[T, H, W, 3]` on the CPU; `T = 1 + 4(t-1)` for the first window, `4t` later.
        """
        return self.decode_batch([stream], [latents])[0]

    def decode_pixels(self, stream: DecodeStream, latents: torch.Tensor) -> torch.Tensor:
        """`decode`, returning the window's pixels before the uint8 mapping: `[1, 3, T, H, W]` in [-1, 1], on
        the CPU, in `latents.dtype` (the slice of `vae.decode(...).sample` for fidelity checks)."""
        return self.decode_batch([stream], [latents], output="pixels")[0]

    def decode_batch(self, streams: Sequence[DecodeStream], latents: Sequence[torch.Tensor],
                     output: Output = "frames") -> list:
        """Decode one window of each stream: each through its own decoder calls (the calls it would make
        alone), or with `DecoderOptions.batch_streams` the streams of one latent grid, window length and cache
        layout stacked into one set of calls (within `BATCHED_DECODE_ATOL` of the per-stream frames). All or
        nothing: if any stream's run raises, no stream advances, and every cache a run had touched is dropped
        (that stream's retry re-decodes behind its context, then continues warm).

        Args:
            streams: distinct open streams of this decoder.
            latents: per stream, normalised `[C, t, h, w]` or `[1, C, t, h, w]`.
            output: "frames" (uint8 `[T, H, W, 3]` numpy), "pixels" (see `decode_pixels`) or "device"
                (uint8 `[T, H, W, 3]` left on the decoder's device: nothing waits for the device, so the
                caller can queue more work before fetching; the latents' finiteness is then the caller's
                to check, also without a wait).
        Returns:
            per stream, its window (on the CPU unless ``output="device"``).
        """
        if output not in ("frames", "pixels", "device"):
            raise ValueError(f"output must be 'frames', 'pixels' or 'device', got {output!r}")
        return self.decode_checked(streams, self._check_batch(streams, latents, check_finite=output != "device"),
                                   output)

    def decode_checked(self, streams: Sequence[DecodeStream], windows: Sequence[torch.Tensor], output: Output) -> list:
        """`decode_batch` for windows the model just made (``[1, C, t, h, w]`` on the device) on distinct streams of
        this decoder: only what another thread can change is checked, under each stream's lock."""
        held: list[threading.Lock] = []
        try:
            for s in streams:
                if not s.lock.acquire(blocking=False):
                    raise ValueError(f"stream {s.stream_id} is being decoded by another call; wait for it")
                held.append(s.lock)
                self._check_open(s)  # a close in another thread may have won the race
            return self._decode_locked(list(streams), list(windows), output)
        finally:
            for lock in held:
                lock.release()

    def _decode_locked(self, streams: list[DecodeStream], windows: list[torch.Tensor], output: Output) -> list:
        with torch.inference_mode(), cudnn_benchmark(self.options.cudnn_benchmark):
            for s in streams:
                if s.path is None:
                    s.path = self._choose_path(s)
            for s, z in zip(streams, windows):  # made or last written maybe on another stream (decode lane)
                hand_over(self.device, [z, *stream_tensors(s)], s.written)
            jobs = [self._job(s, z, output) for s, z in zip(streams, windows)]
            self._run_jobs(jobs)
            written = written_event(self.device)
            for job in jobs:
                self._commit(job)
                job.stream.written = written
        return [job.result() for job in jobs]

    def _job(self, stream: DecodeStream, z: torch.Tensor, output: Output) -> WindowJob:
        cold = stream.slots is None
        return WindowJob(
            stream=stream,
            z=self._norm.denormalize(z),  # [1,C,t,h,w] raw, VAE dtype
            context=stream.context if cold else None,  # re-decoded ahead of the window, frames dropped
            cold=cold,
            out_dtype=z.dtype,
            output=output,
        )

    def _run_jobs(self, jobs: list[WindowJob]) -> None:
        touched: list[DecodeStream] = []
        try:
            for batch in stacked_batches(jobs) if self.options.batch_streams else [[job] for job in jobs]:
                touched += [job.stream for job in batch if not job.cold]
                if len(batch) == 1:
                    self._runner.run(batch[0])
                else:
                    self._runner.run_stacked(batch)
        except BaseException:
            for s in touched:  # a half-advanced cache must never be continued
                s.slots = None
            raise

    def _commit(self, job: WindowJob) -> None:
        s = job.stream
        if s.path is StreamPath.WARM:
            compact_slots(job.slots)
            s.slots = job.slots
        kept = job.x_new if s.context is None else torch.cat([s.context, job.x_new], dim=2)
        s.context = compact(kept[:, :, -self.options.context_latents :])  # [1,C,<=K,h,w]
        s.grid = (job.z.shape[3], job.z.shape[4])
        s.latents_decoded += job.z.shape[2]
        s.frames_decoded += job.num_frames

    # warm slots

    def _choose_path(self, stream: DecodeStream) -> StreamPath:
        """Warm when the switch is on and a slot is free; decided once per stream."""
        if not self.options.warm_cache:
            return StreamPath.STATELESS
        if not self._warm.take(stream.stream_id, self.options.max_warm_streams):
            return StreamPath.STATELESS
        # A stream dropped without close still gives its slot back when collected (a plain function over
        # the ledger: nothing in the stream reaches the decoder).
        stream.slot_release = weakref.finalize(stream, give_back, self._warm, stream.stream_id)
        return StreamPath.WARM

    # checks

    def _check_owner(self, stream: DecodeStream) -> None:
        if not isinstance(stream, DecodeStream):
            raise TypeError(f"stream must be a DecodeStream, got {type(stream).__name__}")
        if stream.owner != id(self):
            raise ValueError(f"stream {stream.stream_id} belongs to another WarmWanDecoder")

    def _check_open(self, stream: DecodeStream) -> None:
        self._check_owner(stream)
        if stream.closed:
            raise ValueError(f"stream {stream.stream_id} is closed; open a new one with open_stream()")

    def _check_batch(self, streams: Sequence[DecodeStream], latents: Sequence[torch.Tensor],
                     check_finite: bool = True) -> list[torch.Tensor]:
        if len(streams) != len(latents) or not streams:
            raise ValueError(f"need one latents tensor per stream, got {len(streams)} streams, {len(latents)} tensors")
        if len(set(map(id, streams))) != len(streams):
            raise ValueError("a stream appears twice in one decode_batch call; decode its windows in turn")
        windows = []
        for s, z in zip(streams, latents):
            self._check_open(s)
            windows.append(self._check_latents(s, z, check_finite))
        return windows

    def _check_latents(self, stream: DecodeStream, z: torch.Tensor, check_finite: bool = True) -> torch.Tensor:
        """The window as `[1, C, t, h, w]` on the decoder's device, or ValueError naming `latents`."""
        if not isinstance(z, torch.Tensor) or not z.is_floating_point():
            raise ValueError(f"latents must be a floating-point torch.Tensor, got {type(z).__name__}")
        z = z.unsqueeze(0) if z.ndim == 4 else z
        if z.ndim != 5 or z.shape[0] != 1 or z.shape[1] != self.z_dim or min(z.shape[2:]) < 1:
            raise ValueError(
                f"latents must be [C, t, h, w] or [1, C, t, h, w] with C = z_dim = {self.z_dim} and t, h, w >= 1, "
                f"got shape {tuple(z.shape)}"
            )
        if stream.grid is not None and tuple(z.shape[3:]) != stream.grid:
            raise ValueError(f"latents grid {tuple(z.shape[3:])} differs from stream grid {stream.grid}")
        z = z.to(self.device)
        if check_finite and not bool(torch.isfinite(z).all()):  # a host wait: callers queueing work check later
            raise ValueError("latents contain NaN or Inf; a warm cache would carry them into every later window")
        return z
