"""One rollout: a first frame, a prompt, an embodiment, and the windows generated so far.

A session owns its KV streams (`main`, plus `uncond` under CFG) in the model's shared page pool,
its decoder stream, its RNG and its scheduler; it holds no model weights. `close()` returns every
page and decoder cache and is safe to call twice; a window that fails closes the session.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import torch

from .spec import KVStats, RolloutKnobs, WindowResult
from .validation import check_actions


class SessionClosedError(RuntimeError):
    """The session was closed (possibly from another thread) before or while a window ran."""


_ids = itertools.count()
_ids_lock = threading.Lock()


def new_session_id() -> str:
    with _ids_lock:
        return f"s{next(_ids)}"


class RolloutSession:
    """State of one action-conditioned rollout; step it with `step(actions)`."""

    def __init__(self, model, *, session_id: str, knobs: RolloutKnobs, domain_id: int,
                 generator: torch.Generator, text_lens: dict[str, int], first_latent: torch.Tensor,
                 decode_stream, first_frame: np.ndarray | None) -> None:
        self.model = model
        self.session_id = session_id
        self.knobs = knobs
        self.domain_id = domain_id
        self.generator = generator
        self.text_lens = text_lens  # label -> prompt tokens in that stream
        self.first_latent = first_latent  # [C, 1, h, w] clean latent frame 0
        self.decode_stream = decode_stream
        self.first_frame = first_frame  # [H, W, 3] uint8, the decoded latent frame 0
        self.scheduler = model.new_scheduler(knobs)
        self.window_index = 0
        self.last_latents: torch.Tensor | None = None  # [C, t, h, w] of the previous window (chained mode)
        self.last_used = 0  # model clock tick of the last step (idle sessions offload first)
        self.closed = False
        self.busy = threading.Lock()  # held while a window of this session runs
        self.abort = threading.Event()  # set by close(); a running window stops before its commit

    # --- public API -----------------------------------------------------------------------

    @property
    def labels(self) -> tuple[str, ...]:
        return ("main", "uncond") if self.knobs.uses_cfg else ("main",)

    def stream_keys(self) -> list[tuple[str, str]]:
        return [(self.session_id, label) for label in self.labels]

    def step(self, actions) -> WindowResult:
        """Generate the next window conditioned on `actions` `(chunk_size, k)`."""
        return self.model.step_batch([self], [actions])[0]

    def check_actions(self, actions) -> np.ndarray:
        self._check_open()
        return check_actions(actions, self.knobs.chunk_size, self.model.spec.action_dim)

    def fork(self, generator: torch.Generator | None = None) -> RolloutSession:
        """An independent session continuing from this state; committed KV pages are shared, not copied."""
        self._check_open()
        return self.model.fork_session(self, generator)

    def kv_stats(self) -> KVStats:
        kv = self.model.kv
        if self.closed:
            return KVStats(pages_in_use=0, protected_tokens=0, released_tokens=0, seq_len=0)
        table = kv.page_table((self.session_id, "main"))
        return KVStats(
            pages_in_use=kv.pages_in_use(self.session_id),
            protected_tokens=table.protected_prefix_tokens,
            released_tokens=table.released_tokens,
            seq_len=table.seq_len,
        )

    def close(self) -> None:
        """Return every page and decoder cache; idempotent and safe from another thread.

        A window running in another thread stops at its next denoise step (nothing committed) or,
        once committing, finishes; close waits for it, then frees everything.
        """
        self.abort.set()
        with self.busy:
            if self.closed:
                return
            self.closed = True
            self.model.release_session(self)

    def __enter__(self) -> RolloutSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # a dropped session must not leak pages
        try:
            if not self.closed and not self.busy.locked():
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # --- window geometry ------------------------------------------------------------------

    def window_frames(self) -> tuple[int, int, int]:
        """(first latent frame of the window tensor, end, clean leading frames) for the next window."""
        n = self.knobs.latents_per_window
        k = self.window_index
        if k == 0:
            return 0, 1 + n, 1
        if self.knobs.window_mode == "chained":
            return k * n, 1 + (k + 1) * n, 1
        return 1 + k * n, 1 + (k + 1) * n, 0

    def window_actions(self) -> tuple[int, int]:
        chunk = self.knobs.chunk_size
        return self.window_index * chunk, (self.window_index + 1) * chunk

    def _check_open(self) -> None:
        if self.closed or self.abort.is_set():
            raise SessionClosedError(f"session {self.session_id} is closed; open a new one (env.reset)")
