"""A rollout session: the record of one rollout that the model steps.

A session holds ids, its RNG, its decoder session and a `WindowSchedule` cursor that gives the next
window's geometry. It holds no reference to the loop or the model and has no verbs that do work: the loop
opens, steps, forks and closes sessions (`RolloutLoop.step(sessions, actions)`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .checks import check_actions
from .config import RolloutKnobs
from .embodiment.conditioning import Conditioning
from .kv import StreamKey, StreamLabel
from .latent_windows import LEAD_FRAMES, LatentWindows
from .spec import ModelSpec, SessionFrame, window_tokens
from .vae.session import DecodeSession
from .windowing import RetentionPolicy, WindowPlan


class SessionClosedError(RuntimeError):
    """The session was closed (possibly from another thread) before or while a window ran.

    ``committed``: windows of the step had already committed (the loop then closes the step's sessions).
    """

    def __init__(self, message: str, *, committed: bool = False) -> None:
        super().__init__(message)
        self.committed = committed


_ids = itertools.count()
_ids_lock = threading.Lock()


def new_session_id() -> str:
    with _ids_lock:
        return f"s{next(_ids)}"


def window_schedule(knobs: RolloutKnobs) -> LatentWindows:
    """The open-ended latent-frame windows of a session (`geometry.LatentWindows`)."""
    return LatentWindows.of(knobs)


@dataclass(eq=False)
class RolloutSession:
    """One rollout: a first frame, a prompt, an embodiment, and the windows generated so far.

    Attributes:
        session_id: unique within the process; names the session's KV streams.
        knobs: the rollout settings it was opened with.
        domain_id: the embodiment's action head.
        conditioning: the checked domain, action width, fps (of positions and caption) and view point.
        frame: the session's latent grid and frame size (``frame.spec``), caption size and canvas plan.
        action_shape: ``(chunk_size, width)`` of the actions each step takes (zero-padded to the model's
            ``action_dim`` inside the window); ``action_bounds`` the allowed range, when one is declared.
        generator: the source of every window's noise.
        text_lens: prompt tokens of each KV stream.
        first_latent: ``[C, 1, h, w]`` the clean, normalised latent frame 0.
        decoder_session: the warm decoder's session of this rollout (None when the knobs say not to decode).
        first_frame: ``[H, W, 3]`` uint8, frame 0 as the decoder returns it (None without decoding).
        schedule, plan: the window geometry and the next window in it (``window_index`` is ``plan.index``).
        last_latents: ``[C, t, h, w]`` of the previous window (a chained window re-pins its tail).

    Resolved once when the session is made (constant while it lives, so a step only reads them): ``labels``
    and ``keys`` (its KV streams) and ``retention`` (what a commit of each stream keeps). ``plan`` is the one
    cursor: only the loop's postprocess moves it.
    """

    session_id: str
    knobs: RolloutKnobs
    domain_id: int
    conditioning: Conditioning
    frame: SessionFrame
    action_shape: tuple[int, int]
    action_bounds: tuple[float, float] | None
    generator: torch.Generator
    text_lens: dict[StreamLabel, int]
    first_latent: torch.Tensor
    decoder_session: DecodeSession | None
    first_frame: np.ndarray | None
    schedule: LatentWindows
    plan: WindowPlan | None = None  # the next window (None: the first); only the loop's postprocess moves it
    last_latents: torch.Tensor | None = None
    closed: bool = False
    busy: threading.Lock = field(default_factory=threading.Lock, repr=False)  # held while a window runs
    abort: threading.Event = field(default_factory=threading.Event, repr=False)  # a running window stops
    labels: tuple[StreamLabel, ...] = field(init=False, repr=False)
    keys: tuple[StreamKey, ...] = field(init=False, repr=False)
    retention: dict[StreamLabel, RetentionPolicy | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.labels = (StreamLabel.MAIN, StreamLabel.UNCOND) if self.knobs.uses_cfg else (StreamLabel.MAIN,)
        self.keys = tuple(StreamKey(self.session_id, label) for label in self.labels)
        kv_mode = self.knobs.window_mode == "kv"  # chained windows never commit, so nothing is released
        self.retention = {label: self.schedule.retention(self.spec.tokens_per_unit, self.text_lens[label])
                          if kv_mode else None for label in self.labels}
        if self.plan is None:
            self.plan = self.schedule.window(0)

    @property
    def spec(self) -> ModelSpec:
        """The model's spec at this session's frame size (its latent grid and tokens per frame)."""
        return self.frame.spec

    @property
    def window_index(self) -> int:
        """The cursor: the index of the next window (``plan.index``)."""
        return self.plan.index

    def action_span(self, plan: WindowPlan) -> tuple[int, int]:
        """Absolute indices of the window's actions: one per pixel frame it generates."""
        per_frame = self.knobs.chunk_size // self.knobs.latents_per_window
        return (plan.commit_start - LEAD_FRAMES) * per_frame, (plan.end - LEAD_FRAMES) * per_frame

    def frame_span(self, plan: WindowPlan) -> tuple[int, int]:
        """Pixel frames ``[start, end)`` of the window (frame 0 is the first image)."""
        start, end = self.action_span(plan)
        return 1 + start, 1 + end

    def commit_tokens(self, plan: WindowPlan) -> int:
        """Tokens the window's commit appends to each stream: vision and actions in kv mode, none chained."""
        if self.knobs.window_mode != "kv":
            return 0
        return window_tokens(plan.units, self.spec.tokens_per_frame, self.knobs.chunk_size)

    def group_key(self, plan: WindowPlan) -> tuple:
        """Sessions with equal keys run one window together: same timesteps, same window shape."""
        knobs, spec = self.knobs, self.spec
        return (knobs.num_steps, float(knobs.flow_shift), knobs.window_mode, float(knobs.context_noise), plan.units,
                plan.cond_units, spec.latent_height, spec.latent_width, spec.patch_grid)

    def branch(self, session_id: str, generator: torch.Generator,
               decoder_session: DecodeSession | None) -> RolloutSession:
        """A record continuing this one under ``session_id`` (the loop's `fork` shares its KV pages)."""
        return RolloutSession(
            session_id=session_id, knobs=self.knobs, domain_id=self.domain_id, conditioning=self.conditioning,
            frame=self.frame, action_shape=self.action_shape, action_bounds=self.action_bounds, generator=generator,
            text_lens=dict(self.text_lens), first_latent=self.first_latent, decoder_session=decoder_session,
            first_frame=self.first_frame, schedule=self.schedule, plan=self.plan, last_latents=self.last_latents)

    def check_open(self) -> None:
        if self.closed or self.abort.is_set():
            raise SessionClosedError(f"session {self.session_id} is closed; open a new one (env.reset)")


def check_step_actions(sessions: Sequence[RolloutSession], actions: Sequence) -> list[np.ndarray]:
    """One action array per distinct session, each of its session's shape and within its bounds (the step's
    entry check; each session is checked open once, under its window lock, by the loop)."""
    sessions, actions = list(sessions), list(actions)
    if len(sessions) != len(actions) or len(set(map(id, sessions))) != len(sessions):
        raise ValueError(f"got {len(sessions)} sessions and {len(actions)} action arrays; allowed: one "
                         "action array per distinct session")
    checked = []
    for i, (s, a) in enumerate(zip(sessions, actions)):
        low, high = s.action_bounds or (None, None)
        field = "actions" if len(sessions) == 1 else f"actions[{i}]"
        checked.append(check_actions(field, a, s.action_shape, low=low, high=high))
    return checked
