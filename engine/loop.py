"""The engine loop: a model adapter (`adapter.ModelAdapter`) behind sessions, with what every session shares
(the KV page pool, allocated here from the adapter's `KVLayout` and the config sections; the warm decoder) and
the verbs that open, step, fork and close them. A step is schedule, run (`runner.StepRunner`), postprocess."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from operator import attrgetter

import numpy as np
import torch

from .adapter import KVLayout, LoopParts, ModelAdapter
from .attention import AttentionBackendName, resolve_backend
from .checks import check_image, check_prompt
from .config import CacheConfig, RolloutKnobs, RuntimeConfig
from .devices import canonical_device
from .embodiment.conditioning import Conditioning, resolve_conditioning, resolve_env_conditioning
from .flashinfer_kernels import FlashinferKernels
from .graphs import GraphCache, check_cuda_graphs
from .kv import PagedKVCache, StreamKey, StreamLabel
from .lanes import DecodeLane
from .runner import StepRunner, WindowOutput
from .scheduler import Scheduler, StepBatch
from .session import RolloutSession, SessionClosedError, check_step_actions, new_session_id, window_schedule
from .spec import KVStats, ModelSpec, PhaseTimings, SessionFrame, WindowResult, charge_step_overhead, window_tokens
from .vae import DecoderOptions
from .vae.decoder import WarmWanDecoder


class RolloutLoop:
    """A model adapter behind sessions: `open_session`, `step`, `fork`, `close`."""

    def __init__(self, adapter: ModelAdapter, *, device: str | torch.device, cache: CacheConfig | None = None,
                 decoder: DecoderOptions | None = None, runtime: RuntimeConfig | None = None) -> None:
        """Allocate the page pool, the scheduler, the warm decoder and the attention backend's parts for
        ``adapter``, and bind the adapter to them. ``device``: where the adapter's modules are (canonicalised
        once, here). The sections' defaults are their models' (`config.py`, `vae.DecoderOptions`)."""
        cache, runtime = cache or CacheConfig(), runtime or RuntimeConfig()
        self.adapter, self.runtime = adapter, runtime
        self.device = device = canonical_device(device)
        self.spec: ModelSpec = adapter.spec
        self.embodiments = adapter.embodiments  # the names this checkpoint takes
        self._resolved: set[tuple[Conditioning, str | None]] = set()  # `conditioning`'s records, with their view
        layout: KVLayout = adapter.kv_layout
        self.dtype = layout.dtype
        self.kv = PagedKVCache(num_layers=layout.num_layers, num_pages=cache.num_pages, page_size=cache.page_size,
                               num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim, dtype=layout.dtype,
                               device=device, cpu_offload_pages=cache.cpu_offload_pages)
        overlap = runtime.overlap_decode
        self.overlap_decode = device.type == "cuda" if overlap is None else overlap
        self.scheduler: Scheduler[RolloutSession] = Scheduler(self.kv, split_groups=self.overlap_decode)
        self.decoder = WarmWanDecoder(adapter.vae, decoder or DecoderOptions())
        backend = resolve_backend(runtime.attention_backend, device, dtype=layout.dtype, head_dim=layout.head_dim)
        kernels = FlashinferKernels(device) if backend is AttentionBackendName.FLASHINFER else None
        graphs = GraphCache() if check_cuda_graphs(runtime.cuda_graphs, device, backend) else None
        self.parts = LoopParts(self.kv, backend, device, kernels, graphs)
        self.runner = StepRunner(adapter.bind(self.parts), self.decoder, DecodeLane(device),
                                 runtime.decode_after_denoise)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.adapter.kv_layout.bytes_per_token

    @property
    def backend(self) -> AttentionBackendName:
        """The attention backend the loop resolved to (``auto`` chose it for this device)."""
        return self.parts.backend

    @property
    def live_sessions(self) -> int:
        return self.scheduler.live_sessions

    # --- sessions -----------------------------------------------------------------------------

    def open_session(self, image, prompt: str, domain_id: int | None = None, *, embodiment: str | int | None = None,
                     knobs: RolloutKnobs | None = None, generator: torch.Generator | None = None,
                     action_width: int | None = None, action_bounds: tuple[float, float] | None = None,
                     fps: float | None = None, tier: int | str | None = None,
                     conditioning: Conditioning | None = None) -> RolloutSession:
        """Check everything, then `open_checked`: the engine's public way in, where an image and a prompt enter.

        ``embodiment`` (a name of ``self.embodiments``), ``domain_id``, ``action_width``, ``fps``: see
        `resolve_conditioning`; or ``conditioning``, a record resolved before (`conditioning`), used as it is.
        ``action_bounds``: the range the actions must lie in, when one is declared. ``tier``: None keeps the
        model's frame size; 256/480/704/720/"auto" use the pipeline's canvas (the adapter's `plan_frame`).
        """
        knobs = knobs if knobs is not None else RolloutKnobs()
        if not isinstance(knobs, RolloutKnobs):
            raise ValueError(f"knobs={knobs!r} is invalid; allowed: a RolloutKnobs")
        if conditioning is None:
            conditioning = self.conditioning(knobs, embodiment=embodiment, domain_id=domain_id,
                                             action_width=action_width, fps=fps)
        elif not isinstance(conditioning, Conditioning):
            raise ValueError(f"conditioning={conditioning!r} is invalid; allowed: a Conditioning or None")
        prompt, image = check_prompt("prompt", prompt), check_image("image", image)
        return self.open_checked(image, prompt, conditioning, knobs=knobs, generator=generator,
                                 action_bounds=action_bounds, tier=tier)

    @torch.no_grad()  # not inference_mode: a caller may edit the first latent in place
    def open_checked(self, image: np.ndarray, prompt: str, conditioning: Conditioning, *, knobs: RolloutKnobs,
                     generator: torch.Generator | None = None, action_bounds: tuple[float, float] | None = None,
                     tier: int | str | None = None) -> RolloutSession:
        """Open a session from inputs checked where they entered (`open_session`, or an env's construction and
        reset): prefill the prompt per CFG stream (then protect it), encode and decode frame 0.

        Args:
            image: ``[H, W, 3]`` uint8, or float in [0, 1], as `checks.check_image` returned it.
            prompt: as `checks.check_prompt` returned it.
            conditioning: the session's resolved record (`conditioning`).
        """
        frame = self.adapter.plan_frame(image, tier)
        self.decoder.options.validate_for_window(knobs.latents_per_window)
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        cond = conditioning
        ids = self.adapter.prompt_ids(prompt, knobs, cond, frame)
        self.scheduler.make_room(self._pages_to_open(ids, knobs, frame.spec))  # or KVPoolExhausted, before opening
        session = RolloutSession(
            session_id=new_session_id(), knobs=knobs, domain_id=cond.domain_id, conditioning=cond, frame=frame,
            action_shape=(knobs.chunk_size, cond.action_width),
            action_bounds=action_bounds, generator=generator,
            text_lens={label: len(label_ids) for label, label_ids in ids.items()}, first_latent=torch.empty(0),
            decoder_session=self.decoder.open_session() if knobs.decode else None, first_frame=None,
            schedule=window_schedule(knobs))
        try:
            for key in session.keys:
                self._prefill(key, ids[key.label])
            session.first_latent = self.adapter.encode_first_frame(image, frame)
            if session.decoder_session is not None:
                session.first_frame = self.decoder.decode(session.decoder_session, session.first_latent[None])[0]
        except BaseException:
            self._release(session)
            raise
        self.scheduler.add(session)
        return session

    @contextmanager
    def session(self, *args, **kwargs) -> Iterator[RolloutSession]:
        """`open_session` as a context manager: the session is closed on any exit."""
        session = self.open_session(*args, **kwargs)
        try:
            yield session
        finally:
            self.close(session)

    def conditioning(self, knobs: RolloutKnobs | None = None, *, env_rule: bool = False, **given) -> Conditioning:
        """The checked conditioning of a session opened with ``given`` (``embodiment``, ``domain_id``,
        ``action_width``, ``fps``): a ValueError naming the embodiment, its width and the allowed names.
        ``env_rule``: an env's (`conditioning.env_embodiment`: a domain id stands for its embodiment). An env
        resolves it once, when it is made, and hands the record down (`open_checked`)."""
        knobs = knobs if knobs is not None else RolloutKnobs()
        resolve = resolve_env_conditioning if env_rule else resolve_conditioning
        cond = resolve(self.embodiments, self.spec, knobs, **given)
        self._resolved.add((cond, knobs.view_point))
        return cond

    def resolved_here(self, conditioning: Conditioning, knobs: RolloutKnobs) -> bool:
        """Whether ``conditioning`` is a record `conditioning` resolved for knobs like ``knobs``: a caller handed
        one takes it as it is, without resolving it again."""
        return (conditioning, knobs.view_point) in self._resolved

    def min_pages(self, prompt: str, knobs: RolloutKnobs | None = None, conditioning: Conditioning | None = None,
                  frame: SessionFrame | None = None) -> int:
        """KV pages one session needs to open (its prompt per CFG stream) and commit its first window, with the
        page of slack admission keeps per stream: a pool smaller than this can never run an episode."""
        return self.pages_needed(check_prompt("prompt", prompt), knobs, conditioning, frame)

    def pages_needed(self, prompt: str, knobs: RolloutKnobs | None = None, conditioning: Conditioning | None = None,
                     frame: SessionFrame | None = None) -> int:
        """`min_pages` of a prompt checked where it entered."""
        knobs = knobs if knobs is not None else RolloutKnobs()
        cond = conditioning if conditioning is not None else self.conditioning(knobs, domain_id=0)
        frame = frame if frame is not None else SessionFrame(self.spec, (self.spec.height, self.spec.width))
        ids = self.adapter.prompt_ids(prompt, knobs, cond, frame)
        return self._pages_to_open(ids, knobs, frame.spec) + len(ids)

    def _pages_to_open(self, ids: dict[StreamLabel, list[int]], knobs: RolloutKnobs, spec: ModelSpec) -> int:
        first_window = window_tokens(window_schedule(knobs).window(0).units, spec.tokens_per_frame, knobs.chunk_size)
        return self.scheduler.pages_to_open(len(label_ids) + first_window for label_ids in ids.values())

    def _prefill(self, key: StreamKey, ids: list[int]) -> None:
        self.kv.create_stream(key)
        keys, values = self.adapter.prefill(torch.tensor(ids, dtype=torch.long, device=self.device))
        self.kv.append(key, keys, values)
        self.kv.protect_prefix(key, len(ids))

    @torch.no_grad()
    def fork(self, session: RolloutSession, generator: torch.Generator | None = None) -> RolloutSession:
        """An independent session continuing from ``session``; committed KV pages are shared, not copied, and
        the RNG continues identically unless ``generator`` is given."""
        session.check_open()
        if generator is None:
            generator = torch.Generator()
            generator.set_state(session.generator.get_state())
        parent = session.decoder_session
        decoder_session = None if parent is None else self.decoder.fork_session(parent)
        fork = session.branch(new_session_id(), generator, decoder_session)
        try:
            if self.kv.is_offloaded(session.session_id):
                self.scheduler.admit([session.session_id], 0)
            self.kv.fork_session(session.session_id, fork.session_id)
        except BaseException:
            self._release(fork)
            raise
        self.scheduler.add(fork)
        return fork

    def close(self, session: RolloutSession) -> None:
        """Return every page and decoder cache of ``session``; idempotent and safe from another thread (a
        window running there stops at its next denoise step, or finishes its commit, first)."""
        session.abort.set()
        with session.busy:
            self._close_locked(session)

    def close_all(self) -> None:
        """Close every session and free the captured CUDA graphs (recaptured when needed)."""
        for session in self.scheduler.sessions():
            self.close(session)
        graphs = self.runner.ctx.graphs  # the bound ops' (the loop's parts', unless replaced)
        if graphs is not None:
            graphs.clear()

    def kv_stats(self, session: RolloutSession) -> KVStats:
        if session.closed:
            return KVStats(pages_in_use=0, protected_tokens=0, released_tokens=0, seq_len=0)
        main = self.kv.page_table(session.keys[0])
        return KVStats(self.kv.pages_in_use(session.session_id), main.protected_prefix_tokens, main.released_tokens,
                       main.seq_len)

    def _close_locked(self, session: RolloutSession) -> None:
        if not session.closed:
            session.closed = True
            self._release(session)

    def _release(self, session: RolloutSession) -> None:
        self.scheduler.remove(session.session_id)
        try:
            if session.decoder_session is not None:
                self.decoder.close_session(session.decoder_session)
        finally:
            self.kv.remove_session(session.session_id)

    # --- stepping -----------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, sessions: Sequence[RolloutSession], actions: Sequence, *, decode: bool = True) -> list[WindowResult]:
        """Step every session one window: schedule, run, postprocess. Sessions that share steps, shift, mode
        and window shape run ONE batched forward per denoise step. With ``decode=False`` the frames are left
        to `decode`."""
        started, sessions, checked = time.perf_counter(), list(sessions), check_step_actions(sessions, actions)
        with ExitStack() as stack:  # every session's window lock, in one order: concurrent batches cannot deadlock
            for s in sorted(sessions, key=attrgetter("session_id")):
                stack.enter_context(s.busy)
            for s in sessions:
                s.check_open()  # closed by another thread while we waited
            decodes = [decode and s.decoder_session is not None for s in sessions]
            batch = self.scheduler.schedule(sessions, checked, decodes)
            try:
                outputs = self.runner.run(batch, decode)
            except SessionClosedError as e:
                if e.committed:  # windows were committed with it: close the step's sessions
                    self._close_all_locked(sessions)
                raise
            except BaseException:  # a failed window never leaves half-committed state behind
                self._close_all_locked(sessions)
                raise
            return charge_step_overhead(self._postprocess(batch, outputs), time.perf_counter() - started)

    def _postprocess(self, batch: StepBatch[RolloutSession], outputs: list[WindowOutput]) -> list[WindowResult]:
        """Advance each session past its window (the one place a cursor moves) and report the window."""
        results = []
        for w, out in zip(batch.windows, outputs):
            s = w.session
            s.last_latents, s.plan = out.latents, s.schedule.window(w.plan.index + 1)
            start, end = s.frame_span(w.plan)
            results.append(WindowResult(w.plan.index, out.host_latents, out.frames, start, end, out.timings,
                                        self.kv_stats(s)))
        return results

    @torch.inference_mode()
    def decode(self, session: RolloutSession, result: WindowResult) -> WindowResult:
        """Fill in the frames of a window stepped with ``decode=False`` (windows of a session in order)."""
        start = time.perf_counter()
        frames = self.decoder.decode(session.decoder_session, result.latents.to(self.device)[None])
        t = result.timings
        result.frames, result.timings = frames, PhaseTimings(t.denoise_s, t.commit_s, time.perf_counter() - start,
                                                                t.other_s, t.shared_by)
        return result

    def _close_all_locked(self, sessions: list[RolloutSession]) -> None:
        for s in sessions:
            s.abort.set()
            self._close_locked(s)
