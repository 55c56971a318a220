"""A loaded Cosmos3 world model: modules, the shared KV page pool, the warm decoder, and sessions."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager

import numpy as np
import torch

from ...attention import resolve_backend
from ...kv import KVPoolExhausted, PagedAllocationManager
from ...vae import DecoderOptions, WarmWanDecoder, encode_first_frame
from .loader import Cosmos3Components, load_components
from .prompt import tokenize_action_prompt
from .runner import prefill_text
from .session import RolloutSession, SessionClosedError, new_session_id
from .spec import ModelSpec, PhaseTimings, RolloutKnobs, WindowResult
from .tokens import tokens_per_frame
from .validation import check_domain_id, check_image, check_prompt
from .window import run_window

_DEFAULT_MEDIA = {"height": 480, "width": 832, "fps": 24.0}


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class Cosmos3WorldModel:
    """Cosmos3 forward dynamics behind a session API: `open_session`, `step_batch`, `fork_session`."""

    def __init__(self, components: Cosmos3Components, *, device: torch.device, num_pages: int, page_size: int,
                 cpu_offload_pages: int = 0, attention_backend: str = "auto",
                 decoder_options: DecoderOptions | None = None, height: int | None = None,
                 width: int | None = None, fps: float | None = None, name: str | None = None) -> None:
        self.components = components
        self.transformer = components.transformer
        self.vae = components.vae
        self.device = device
        self.dtype = next(self.transformer.parameters()).dtype
        self.spec = self._make_spec(components, height, width, fps, name)
        config = self.transformer.config
        self.kv = PagedAllocationManager(
            num_layers=config.num_hidden_layers, num_pages=num_pages, page_size=page_size,
            num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim, dtype=self.dtype,
            device=device, cpu_offload_pages=cpu_offload_pages,
        )
        self.backend = resolve_backend(attention_backend, device, dtype=self.dtype, head_dim=config.head_dim)
        self.decoder = WarmWanDecoder(self.vae, decoder_options or DecoderOptions())
        self._sessions: dict[str, RolloutSession] = {}
        self._lock = threading.RLock()
        self._clock = itertools.count(1)  # orders sessions by last use for offload

    @classmethod
    def from_pretrained(cls, path_or_id: str | os.PathLike, *, device: str | torch.device = "auto",
                        dtype: torch.dtype | None = None, num_pages: int = 512, page_size: int = 16,
                        cpu_offload_pages: int = 0, attention_backend: str = "auto",
                        decoder_options: DecoderOptions | None = None, height: int | None = None,
                        width: int | None = None, fps: float | None = None,
                        name: str | None = None) -> Cosmos3WorldModel:
        """Load a diffusers-layout checkpoint (local folder or offline hub id)."""
        device = resolve_device(device)
        components = load_components(path_or_id, device=device, dtype=dtype)
        return cls(components, device=device, num_pages=num_pages, page_size=page_size,
                   cpu_offload_pages=cpu_offload_pages, attention_backend=attention_backend,
                   decoder_options=decoder_options, height=height, width=width, fps=fps, name=name)

    @staticmethod
    def _make_spec(components: Cosmos3Components, height, width, fps, name) -> ModelSpec:
        media = {**_DEFAULT_MEDIA, **components.media}
        height, width = int(height or media["height"]), int(width or media["width"])
        fps = float(fps or media["fps"])
        t_config, v_config = components.transformer.config, components.vae.config
        spatial = int(v_config.scale_factor_spatial)
        if height % spatial or width % spatial:
            raise ValueError(f"height={height}, width={width} are invalid; allowed: multiples of {spatial}")
        latent_h, latent_w = height // spatial, width // spatial
        return ModelSpec(
            name=name or components.path.name, height=height, width=width, fps=fps,
            action_dim=int(t_config.action_dim), num_domains=int(t_config.num_embodiment_domains),
            latent_channels=int(t_config.latent_channel), latent_height=latent_h, latent_width=latent_w,
            tokens_per_frame=tokens_per_frame(latent_h, latent_w, int(t_config.latent_patch_size)),
            temporal_compression=int(v_config.scale_factor_temporal), spatial_compression=spatial,
        )

    # --- facts --------------------------------------------------------------------------------

    @property
    def patch_grid(self) -> tuple[int, int]:
        patch = self.transformer.config.latent_patch_size
        return -(-self.spec.latent_height // patch), -(-self.spec.latent_width // patch)

    @property
    def kv_bytes_per_token(self) -> int:
        config = self.transformer.config
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * itemsize

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    def tokens_per_window(self, knobs: RolloutKnobs) -> int:
        return knobs.latents_per_window * (self.spec.tokens_per_frame + 4)

    # --- sessions -----------------------------------------------------------------------------

    def new_scheduler(self, knobs: RolloutKnobs):
        from diffusers import UniPCMultistepScheduler

        return UniPCMultistepScheduler.from_config(self.components.scheduler_config, flow_shift=float(knobs.flow_shift))

    def set_window_timesteps(self, session: RolloutSession) -> None:
        """Reset the session's scheduler for a new window (native flow schedule when the checkpoint says so)."""
        scheduler, steps = session.scheduler, session.knobs.num_steps
        if self.components.use_native_flow_schedule:
            sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, steps + 1)[:-1]
            scheduler.set_timesteps(steps, device=self.device, sigmas=sigmas)
        else:
            scheduler.set_timesteps(steps, device=self.device)

    @torch.no_grad()
    def open_session(self, image, prompt: str, domain_id: int, *, knobs: RolloutKnobs | None = None,
                     generator: torch.Generator | None = None) -> RolloutSession:
        """Validate everything, prefill the prompt per CFG stream (then protect it), encode and decode frame 0."""
        knobs = knobs or RolloutKnobs()
        if not isinstance(knobs, RolloutKnobs):
            raise ValueError(f"knobs={knobs!r} is invalid; allowed: a RolloutKnobs")
        domain_id = check_domain_id(domain_id, self.spec.num_domains)
        prompt = check_prompt(prompt)
        image = check_image(image)
        check_prompt(knobs.negative_prompt, "negative_prompt", allow_empty=True)
        self.decoder.options.validate_for_window(knobs.latents_per_window)
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        spec = self.spec
        ids = self._prompt_ids(prompt, knobs)
        labels = ("main", "uncond") if knobs.uses_cfg else ("main",)
        self._make_room(self._pages_to_open(ids, knobs), set())
        session_id = new_session_id()
        try:
            for label in labels:
                self._prefill(session_id, label, ids[label])
            first_latent = encode_first_frame(self.vae, image, spec.height, spec.width)[0].float()  # [C, 1, h, w]
            stream = self.decoder.open_stream()
            frame0 = self.decoder.decode(stream, first_latent.unsqueeze(0)) if knobs.decode else None
        except BaseException:
            self.kv.remove_session(session_id)
            raise
        session = RolloutSession(
            self, session_id=session_id, knobs=knobs, domain_id=domain_id, generator=generator,
            text_lens={label: len(ids[label]) for label in labels}, first_latent=first_latent,
            decode_stream=stream, first_frame=None if frame0 is None else frame0[0],
        )
        with self._lock:
            self._sessions[session_id] = session
        return session

    def min_pages(self, prompt: str, knobs: RolloutKnobs | None = None) -> int:
        """KV pages one session needs to open (prompt per CFG stream, first frame) and step its first window
        (plus `_admit`'s one page of slack per stream): a pool smaller than this can never run an episode
        with this prompt."""
        knobs = knobs or RolloutKnobs()
        streams = 2 if knobs.uses_cfg else 1
        return self._pages_to_open(self._prompt_ids(check_prompt(prompt), knobs), knobs) + streams

    def _prompt_ids(self, prompt: str, knobs: RolloutKnobs) -> dict[str, list[int]]:
        spec = self.spec
        tokens = tokenize_action_prompt(
            self.components.tokenizer, prompt, knobs.negative_prompt, view_point=knobs.view_point,
            num_frames=knobs.chunk_size + 1, fps=spec.fps, height=spec.height, width=spec.width,
            use_system_prompt=self.components.default_use_system_prompt,
        )
        return {"main": tokens.cond, "uncond": tokens.uncond}

    def _pages_to_open(self, ids: dict[str, list[int]], knobs: RolloutKnobs) -> int:
        labels = ("main", "uncond") if knobs.uses_cfg else ("main",)
        first = self.tokens_per_window(knobs) + self.spec.tokens_per_frame
        return sum(self._pages_for(len(ids[label]) + first) for label in labels)

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.kv.page_size)

    def _prefill(self, session_id: str, label: str, ids: list[int]) -> None:
        key = (session_id, label)
        self.kv.create_stream(key)
        keys, values = prefill_text(self.transformer, torch.tensor(ids, dtype=torch.long, device=self.device))
        self.kv.append(key, keys, values)
        self.kv.protect_prefix(key, len(ids))

    def fork_session(self, session: RolloutSession, generator: torch.Generator | None = None) -> RolloutSession:
        if generator is None:
            generator = torch.Generator()
            generator.set_state(session.generator.get_state())
        session_id = new_session_id()
        self.kv.fork_session(session.session_id, session_id)
        try:
            stream = self.decoder.fork_stream(session.decode_stream)
        except BaseException:
            self.kv.remove_session(session_id)
            raise
        fork = RolloutSession(
            self, session_id=session_id, knobs=session.knobs, domain_id=session.domain_id, generator=generator,
            text_lens=dict(session.text_lens), first_latent=session.first_latent, decode_stream=stream,
            first_frame=session.first_frame,
        )
        fork.window_index, fork.last_latents = session.window_index, session.last_latents
        with self._lock:
            self._sessions[session_id] = fork
        return fork

    def release_session(self, session: RolloutSession) -> None:
        """Return the session's pages and decoder cache (called by `RolloutSession.close`)."""
        with self._lock:
            self._sessions.pop(session.session_id, None)
        try:
            self.decoder.close_stream(session.decode_stream)
        finally:
            self.kv.remove_session(session.session_id)

    # --- stepping -----------------------------------------------------------------------------

    def step_batch(self, sessions: list[RolloutSession], actions: list) -> list[WindowResult]:
        """Step every session one window; sessions that share steps/shift/mode go through ONE batched forward."""
        if len(sessions) != len(actions):
            raise ValueError(f"got {len(sessions)} sessions and {len(actions)} action arrays; allowed: equal counts")
        if len({id(s) for s in sessions}) != len(sessions):
            raise ValueError("sessions contains the same session twice; allowed: distinct sessions")
        checked = [session.check_actions(a) for session, a in zip(sessions, actions)]
        with self._busy(sessions):
            for s in sessions:
                s._check_open()  # closed by another thread while we waited
            self._admit(sessions)
            groups: dict[tuple, list[int]] = defaultdict(list)
            for i, s in enumerate(sessions):
                groups[(s.knobs.num_steps, s.knobs.flow_shift, s.knobs.window_mode)].append(i)
            results: list[WindowResult | None] = [None] * len(sessions)
            for members in groups.values():
                group = [sessions[i] for i in members]
                for i, result in zip(members, self._run_group(group, [checked[i] for i in members])):
                    results[i] = result
        return results

    @contextmanager
    def _busy(self, sessions: list[RolloutSession]):
        """Hold every session's window lock (in a fixed order, so concurrent batches cannot deadlock)."""
        ordered = sorted(sessions, key=lambda s: s.session_id)
        with ExitStack() as stack:
            for s in ordered:
                stack.enter_context(s.busy)
            yield

    def _run_group(self, group: list[RolloutSession], actions: list, decode: bool = True) -> list[WindowResult]:
        rng_states = [s.generator.get_state() for s in group]
        try:
            return run_window(self, group, actions, decode=decode)
        except SessionClosedError:
            for s, state in zip(group, rng_states):  # untouched sessions can simply step again
                s.generator.set_state(state)
            raise
        except BaseException:
            for s in group:  # a failed window never leaves half-committed state behind
                self._close_locked(s)
            raise

    def _close_locked(self, session: RolloutSession) -> None:
        """Close a session whose window lock the caller holds."""
        session.abort.set()
        if not session.closed:
            session.closed = True
            self.release_session(session)

    def rollout(self, session: RolloutSession, action_chunks: Iterable, pipelined: bool = True) -> Iterator[WindowResult]:
        """Open-loop rollout over a known action sequence; windows come out in order.

        With `pipelined=True` window k is decoded on a worker thread while window k+1 denoises.
        """
        if not pipelined:
            for actions in action_chunks:
                yield self.step_batch([session], [actions])[0]
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldstep-decode") as pool:
            pending = None
            try:
                for actions in action_chunks:
                    result = self._generate(session, actions)
                    future = pool.submit(self._decode_result, session, result)
                    if pending is not None:
                        yield pending.result()
                    pending = future
                if pending is not None:
                    yield pending.result()
                    pending = None
            except BaseException:
                if pending is not None:
                    pending.cancel()
                    wait([pending])
                session.close()
                raise

    def _generate(self, session: RolloutSession, actions) -> WindowResult:
        checked = session.check_actions(actions)
        with self._busy([session]):
            session._check_open()
            self._admit([session])
            return self._run_group([session], [checked], decode=False)[0]

    def _decode_result(self, session: RolloutSession, result: WindowResult) -> WindowResult:
        start = time.perf_counter()
        result.frames = self.decode_windows([session], [result.latents.to(self.device)])[0]
        timings = result.timings
        result.timings = PhaseTimings(timings.denoise_s, timings.commit_s, time.perf_counter() - start)
        return result

    def _admit(self, sessions: list[RolloutSession]) -> None:
        """Make room for this window's commit before any work, or raise KVPoolExhausted.

        Offloaded sessions come back first; when the pool is short and CPU offload is configured,
        idle sessions (least recently stepped first) move to the CPU pool to make room.
        """
        keep = {s.session_id for s in sessions}
        for s in sessions:
            if self.kv.is_offloaded(s.session_id):
                self._make_room(self._held_pages(s), keep)
                self.kv.reload(s.session_id)
        needed = 0
        for s in sessions:
            if s.knobs.window_mode != "kv":
                continue
            extra = self.tokens_per_window(s.knobs) + (self.spec.tokens_per_frame if s.window_index == 0 else 0)
            for key in s.stream_keys():
                table = self.kv.page_table(key)
                needed += self._pages_for(table.seq_len + extra) - self._pages_for(table.seq_len) + 1
        self._make_room(needed, keep)
        for s in sessions:
            s.last_used = next(self._clock)

    def _held_pages(self, session: RolloutSession) -> int:
        return sum(self._pages_for(self.kv.page_table(key).seq_len) for key in session.stream_keys())

    def _make_room(self, needed: int, keep: set[str]) -> None:
        if needed <= self.kv.num_free_pages:
            return
        if self.kv.num_free_cpu_pages > 0:
            with self._lock:
                idle = sorted((s for s in self._sessions.values() if s.session_id not in keep),
                              key=lambda s: s.last_used)
            for session in idle:
                moved = not self.kv.is_offloaded(session.session_id) and self.kv.offload(session.session_id)
                if moved and needed <= self.kv.num_free_pages:
                    return
        raise KVPoolExhausted(needed, self.kv.num_free_pages)

    def decode_windows(self, sessions: list[RolloutSession], latents: list[torch.Tensor]) -> list:
        """Decode each session's new latents `[C, n, h, w]` to uint8 frames (None when decoding is off)."""
        todo = [i for i, s in enumerate(sessions) if s.knobs.decode]
        frames: list = [None] * len(sessions)
        if todo:
            decoded = self.decoder.decode_batch([sessions[i].decode_stream for i in todo],
                                                [latents[i].unsqueeze(0) for i in todo])
            for i, f in zip(todo, decoded):
                frames[i] = f
        return frames

    def close(self) -> None:
        """Close every live session."""
        for session in list(self._sessions.values()):
            session.close()
