"""What ``status`` reports of one served session: its memory, its context and how recently it was used.

Read on the engine loop's thread (the only one that touches the model), so a step cannot change the figures
while they are read.
"""

from __future__ import annotations

import time
from typing import Any

from .sessions import ServedSession

__all__ = ["session_status"]


def session_status(session: ServedSession, now: float | None = None) -> dict[str, Any]:
    """``pages`` (device KV pages its streams reference), ``kv_bytes`` (their bytes over every layer),
    ``decoder_cache_bytes`` (the warm VAE decoder's cache), ``context_tokens`` (tokens its attention reads),
    ``committed_step`` (windows of the episode), ``idle_s`` (seconds since its last request), ``model_calls``,
    ``seq`` and ``attached`` (whether a connection holds it)."""
    env = session.env.unwrapped
    episode = env.episode
    live = episode is not None and episode.live
    model, rollout = env.model, episode.session if live else None
    pages = model.kv.pages_in_use(rollout.session_id) if live else 0
    decoder_session = rollout.decoder_session if live else None
    now = time.monotonic() if now is None else now
    return {"session": session.id, "attached": session.owner is not None, "pages": pages,
            "kv_bytes": pages * (model.kv.kv.nbytes // model.kv.num_pages),
            "decoder_cache_bytes": 0 if decoder_session is None else int(decoder_session.cache_bytes),
            "context_tokens": model.kv_stats(rollout).seq_len if live else 0,
            "committed_step": committed_step(session), "idle_s": max(0.0, now - session.last_request_at),
            "model_calls": session.model_calls, "seq": session.seq}


def committed_step(session: ServedSession) -> int:
    """Windows the session's episode has committed (0 after a reset)."""
    return int(session.env.unwrapped.windows)
