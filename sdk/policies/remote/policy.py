"""``RemotePolicy``: a worldstep policy whose action chunks come from an openpi-protocol policy server.

It maps worldstep observations to the server's observation keys (``observations.py``) and the returned chunk
to worldstep's ``(chunk_size, action_width)`` with an explicit :class:`ActionMode`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import Enum
from typing import Any

import numpy as np
from gymnasium import spaces
from worldstep.engine.checks import check_int

from ..builtin import chunk_shape
from .client import PolicyClient, RemotePolicyProtocolError
from .observations import DEFAULT_OBS_KEYS, ObsField, ObsSource, check_image_size, check_obs_keys

__all__ = ["ActionMode", "RemotePolicy"]


class ActionMode(str, Enum):
    """How a returned action chunk ``(horizon, action_width)`` becomes one window ``(chunk_size, ...)``."""

    EXACT = "exact"
    """``horizon`` must equal ``chunk_size``"""
    TRUNCATE = "truncate"
    """``horizon >= chunk_size``: keep the first ``chunk_size`` actions, drop the rest"""
    PAD = "pad"
    """``horizon <= chunk_size``: repeat the last action up to ``chunk_size``"""
    RECHUNK = "rechunk"
    """queue every returned action; query again (with the same observation) while the queue holds fewer
    than ``chunk_size``; actions left over open the next window (openpi's action-chunk broker)"""


class RemotePolicy:
    """A :class:`~worldstep.policies.Policy` whose actions come from an openpi-protocol websocket server.

    Args:
        endpoint: ``ws://host:port`` (or ``host:port``) of the server.
        action_space: the env's action space, or ``(chunk_size, action_width)``.
        obs_keys: server key -> :class:`ObsField` (``"frames"``, ``"image"``, ``"prompt"``, ``"state"``, per camera
            ``"image:wrist"``, state columns ``"state[9:10]"``, ``"pose_euler[0:9]"``); default
            ``{"observation/image": "image", "prompt": "prompt"}``; :data:`DROID_OBS_KEYS` for openpi's DROID.
        prompt: the text sent for the ``prompt`` source (required when a key maps to it).
        static_obs: constant extra keys sent with every request (what the env cannot give, e.g. joint angles).
        image_size: ``(height, width)`` the ``image`` source is resized to (None: as generated).
        action_key: reply key holding the action chunk.
        action_mode: see :class:`ActionMode` (default ``exact``).
        clip: clip actions into [-1, 1] instead of rejecting out-of-range values.
        timeout_s: seconds to wait for each reply; connect_timeout_s: for the handshake.
        max_queries_per_window: bound on the queries one window may need in ``rechunk`` mode.

    The connection opens on first use and is not copied: a deep copy (one per batched episode slot) or a
    pickled copy (a Ray actor) opens its own. Failures raise :class:`RemotePolicyError` subclasses naming
    the endpoint; ``worldstep.evaluate`` marks such an episode failed and goes on.
    """

    def __init__(self, endpoint: str, action_space: spaces.Box | tuple[int, int], *,
                 obs_keys: Mapping[str, str | ObsSource | ObsField] | None = None, prompt: str | None = None,
                 static_obs: Mapping[str, Any] | None = None, image_size: tuple[int, int] | None = None,
                 action_key: str = "actions", action_mode: str | ActionMode = ActionMode.EXACT,
                 clip: bool = False, timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 api_key: str | None = None, max_queries_per_window: int = 8) -> None:
        self.shape = chunk_shape(action_space)
        self.obs_keys = check_obs_keys(DEFAULT_OBS_KEYS if obs_keys is None else obs_keys)
        prompt_keys = [k for k, v in self.obs_keys.items() if v.source is ObsSource.PROMPT]
        if prompt_keys and not (isinstance(prompt, str) and prompt.strip()):
            raise ValueError(f"prompt={prompt!r} is invalid; obs_keys maps {prompt_keys} to 'prompt', "
                             "so a non-empty string is required")
        self.prompt = prompt
        self.static_obs = dict(static_obs or {})
        clash = set(self.static_obs) & set(self.obs_keys)
        if clash:
            raise ValueError(f"static_obs keys {sorted(clash)} are also in obs_keys; allowed: disjoint keys")
        self.image_size = check_image_size(image_size)
        if not isinstance(action_key, str) or not action_key:
            raise ValueError(f"action_key={action_key!r} is invalid; allowed: a non-empty string")
        self.action_key = action_key
        try:
            self.action_mode = ActionMode(action_mode)
        except ValueError:
            raise ValueError(f"action_mode={action_mode!r} is invalid; allowed: one of "
                             f"{[m.value for m in ActionMode]}") from None
        if not isinstance(clip, bool):
            raise TypeError(f"clip={clip!r} is invalid; allowed: True or False")
        self.clip = clip
        check_int("max_queries_per_window", max_queries_per_window, 1)
        self.max_queries_per_window = max_queries_per_window
        self.client = PolicyClient(endpoint, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                                   api_key=api_key)
        self._queue = np.zeros((0, self.shape[1]), np.float32)  # rechunk: actions not yet used
        self.last_latency_s = 0.0

    @property
    def endpoint(self) -> str:
        return self.client.endpoint

    def connect(self) -> dict[str, Any]:
        """Connect now (instead of on first use) and return the server's metadata."""
        return self.client.connect()

    def close(self) -> None:
        self.client.close()

    def reset(self, seed: int | None = None) -> None:
        """Forget queued actions; the connection stays open (the protocol has no reset message)."""
        self._queue = self._queue[:0]

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        chunk = self.shape[0]
        if self.action_mode is ActionMode.RECHUNK:
            for _ in range(self.max_queries_per_window):
                if len(self._queue) >= chunk:
                    break
                self._queue = np.concatenate([self._queue, self._query(obs)])
            if len(self._queue) < chunk:
                raise RemotePolicyProtocolError(
                    self.endpoint, f"{self.max_queries_per_window} replies gave {len(self._queue)} actions; "
                                   f"a window needs {chunk} (raise max_queries_per_window)")
            actions, self._queue = self._queue[:chunk], self._queue[chunk:]
            return actions.copy()
        return self._fit(self._query(obs))

    # --- helpers ---------------------------------------------------------------------------

    def _query(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        start = time.perf_counter()
        reply = self.client.infer(self.request(obs))
        self.last_latency_s = time.perf_counter() - start
        if self.action_key not in reply:
            raise RemotePolicyProtocolError(self.endpoint, f"reply has no {self.action_key!r} key "
                                                           f"(keys: {sorted(map(str, reply))})")
        return self._check_actions(reply[self.action_key])

    def request(self, obs: dict[str, np.ndarray]) -> dict[str, Any]:
        """The observation dict sent to the server for ``obs`` (``static_obs`` plus every ``obs_keys`` field)."""
        request = dict(self.static_obs)
        for key, field in self.obs_keys.items():
            request[key] = field.read(obs, self.prompt, self.image_size)
        return request

    def _check_actions(self, value: Any) -> np.ndarray:
        width = self.shape[1]
        try:
            actions = np.asarray(value) if isinstance(value, (np.ndarray, list, tuple)) else None
        except ValueError:  # a ragged list
            actions = None
        if actions is None or actions.dtype.kind not in "fiu" or actions.ndim != 2 or actions.shape[1] != width:
            got = f"shape {actions.shape}, dtype {actions.dtype}" if actions is not None else type(value).__name__
            raise RemotePolicyProtocolError(self.endpoint, f"{self.action_key!r} is {got}; allowed: a numeric "
                                                           f"array (horizon, {width})")
        if len(actions) == 0 or not np.all(np.isfinite(actions)):
            raise RemotePolicyProtocolError(self.endpoint, f"{self.action_key!r} is empty or not finite")
        actions = actions.astype(np.float32)
        if self.clip:
            return np.clip(actions, -1.0, 1.0)
        if actions.min() < -1 or actions.max() > 1:
            raise RemotePolicyProtocolError(
                self.endpoint, f"{self.action_key!r} spans [{actions.min():g}, {actions.max():g}]; allowed: [-1, 1] "
                               "(normalise on the server, or pass clip=True)")
        return actions

    def _fit(self, actions: np.ndarray) -> np.ndarray:
        chunk, horizon, mode = self.shape[0], len(actions), self.action_mode
        ok = {ActionMode.EXACT: horizon == chunk, ActionMode.TRUNCATE: horizon >= chunk,
              ActionMode.PAD: horizon <= chunk}[mode]
        if not ok:
            allowed = {ActionMode.EXACT: f"== {chunk}", ActionMode.TRUNCATE: f">= {chunk}",
                       ActionMode.PAD: f"<= {chunk}"}[mode]
            raise RemotePolicyProtocolError(
                self.endpoint, f"returned {horizon} actions; action_mode={mode.value!r} needs {allowed} "
                               f"(other modes: {[m.value for m in ActionMode if m is not mode]})")
        if horizon < chunk:
            actions = np.concatenate([actions, np.repeat(actions[-1:], chunk - horizon, axis=0)])
        return actions[:chunk]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["client"] = PolicyClient(self.endpoint, timeout_s=self.client.timeout_s,
                                       connect_timeout_s=self.client.connect_timeout_s, api_key=self.client.api_key)
        return state

    def __repr__(self) -> str:
        return (f"RemotePolicy({self.endpoint!r}, shape={self.shape}, action_mode={self.action_mode.value!r}, "
                f"obs_keys={ {k: str(v) for k, v in self.obs_keys.items()} })")
