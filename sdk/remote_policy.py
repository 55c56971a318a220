"""Policies served over the openpi websocket protocol, adapted to worldstep's action chunks.

A policy server (openpi's ``serve_policy.py``, or :class:`worldstep.policy_server.PolicyServer`) speaks a
small protocol: on connect it sends its metadata; then every request is one msgpack-encoded observation
dict and every reply one msgpack-encoded dict holding an ``"actions"`` array ``(horizon, action_dim)``
(numpy arrays travel as ``{"__ndarray__": True, "data", "dtype", "shape"}``); a server-side failure comes
back as a text frame holding the traceback.

:class:`RemotePolicy` maps worldstep observations to the server's observation keys and the returned
chunk to worldstep's ``(chunk_size, action_width)`` with an explicit :class:`ActionMode`.

We implement the ~60-line client here instead of depending on ``openpi-client``: that package pins
``numpy<2`` (worldstep runs on numpy 2) and pulls ``dm-tree``; the wire format (``worldstep.wire``) is the same.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
from gymnasium import spaces
from worldstep.engine.checks import check_int
from worldstep.envs.pose import matrix_to_euler_xyz, rot6d_to_matrix

from .policies import chunk_shape
from .wire import EXTRA_HINT, RemoteError, packb, unpackb

__all__ = [
    "DROID_OBS_KEYS",
    "ActionMode",
    "ObsField",
    "ObsSource",
    "PolicyClient",
    "RemotePolicy",
    "RemotePolicyConnectionError",
    "RemotePolicyError",
    "RemotePolicyProtocolError",
    "RemotePolicyTimeout",
]


# --- errors ---------------------------------------------------------------------------------------


class RemotePolicyError(RemoteError):
    """A remote policy call failed; ``endpoint`` (the base's ``address``) names the server."""

    server = "policy server"

    @property
    def endpoint(self) -> str:
        return self.address


class RemotePolicyConnectionError(RemotePolicyError, ConnectionError):
    """The server could not be reached, or it closed the connection."""


class RemotePolicyTimeout(RemotePolicyError, TimeoutError):
    """The server did not answer within the timeout."""


class RemotePolicyProtocolError(RemotePolicyError, ValueError):
    """The server answered, but not with what the protocol or the action mapping allows."""


# --- the client -----------------------------------------------------------------------------------


def _normalise_endpoint(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ValueError(f"endpoint={endpoint!r} is invalid; allowed: 'ws://host:port', 'wss://host:port' "
                         "or 'host:port'")
    return endpoint if endpoint.startswith(("ws://", "wss://")) else f"ws://{endpoint}"


class PolicyClient:
    """One websocket connection to a policy server: ``connect()`` reads its metadata, ``infer(obs)`` asks.

    A timed-out request closes the connection (a late reply would otherwise answer the next request);
    the next ``infer`` reconnects.
    """

    def __init__(self, endpoint: str, *, timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 api_key: str | None = None) -> None:
        self.endpoint = _normalise_endpoint(endpoint)
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.connect_timeout_s = _positive("connect_timeout_s", connect_timeout_s)
        self.api_key = api_key
        self.metadata: dict[str, Any] | None = None
        self._conn = None

    def connect(self) -> dict[str, Any]:
        """Open the connection (when closed) and return the server's metadata."""
        if self._conn is not None:
            return self.metadata or {}
        try:
            from websockets.sync.client import connect
        except ImportError as err:
            raise ImportError(f"remote policies need websockets and msgpack: {EXTRA_HINT}") from err
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        # A plain connection we close ourselves (newer websockets want that said with legacy=True).
        legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        try:
            self._conn = connect(self.endpoint, open_timeout=self.connect_timeout_s, compression=None,
                                 max_size=None, additional_headers=headers, proxy=None, **legacy)
        except TimeoutError as err:
            raise RemotePolicyTimeout(self.endpoint, f"no handshake within {self.connect_timeout_s:g} s") from err
        except Exception as err:  # OSError (refused, unreachable), InvalidURI, InvalidHandshake, ...
            raise RemotePolicyConnectionError(self.endpoint, f"cannot connect ({type(err).__name__}: {err})") from err
        metadata = self._receive(self.connect_timeout_s, "metadata")
        self.metadata = metadata if isinstance(metadata, dict) else {"metadata": metadata}
        return self.metadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Send one observation and return the server's reply dict."""
        self.connect()
        try:
            data = packb(obs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"observation for {self.endpoint} cannot be encoded: {err}") from err
        try:
            self._conn.send(data)
        except Exception as err:
            self.close()
            raise RemotePolicyConnectionError(self.endpoint, f"connection lost while sending ({err})") from err
        reply = self._receive(self.timeout_s, "reply")
        if not isinstance(reply, dict):
            raise RemotePolicyProtocolError(self.endpoint, f"reply is a {type(reply).__name__}; allowed: a dict")
        return reply

    def close(self) -> None:
        """Close the connection (safe to call twice)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _receive(self, timeout_s: float, what: str) -> Any:
        try:
            message = self._conn.recv(timeout=timeout_s)
        except TimeoutError as err:
            self.close()
            raise RemotePolicyTimeout(self.endpoint, f"no {what} within {timeout_s:g} s") from err
        except Exception as err:  # ConnectionClosed and friends
            self.close()
            raise RemotePolicyConnectionError(self.endpoint, f"connection closed while waiting for the {what} "
                                                             f"({err})") from err
        if isinstance(message, str):  # openpi servers send the traceback as text, then close
            self.close()
            raise RemotePolicyError(self.endpoint, f"the server failed:\n{message}")
        try:
            return unpackb(message)
        except Exception as err:
            self.close()
            raise RemotePolicyProtocolError(self.endpoint, f"{what} is not msgpack ({err})") from err


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} is invalid; allowed: a number of seconds > 0")
    return float(value)


# --- the policy adapter ---------------------------------------------------------------------------


class ObsSource(str, Enum):
    """What a server observation key is filled from (see :class:`ObsField` for the camera and column forms)."""

    FRAMES = "frames"
    """the window's frames, ``(chunk_size, H, W, 3)`` uint8 (``frames:<camera>``: that camera's)"""
    IMAGE = "image"
    """the latest frame, ``(H, W, 3)`` uint8 (resized to ``image_size`` when given; ``image:<camera>``: that
    camera's)"""
    PROMPT = "prompt"
    """the policy's ``prompt`` string"""
    STATE = "state"
    """the latest row of ``obs["state"]`` (``RobotStateObservation``), float32 (``state[a:b]``: columns a..b-1)"""
    POSE_EULER = "pose_euler"
    """``pose_euler[a:b]``: 9 state columns (position 3, 6-D rotation 6) as position + extrinsic ``xyz`` Euler
    angles in radians, float32 (6,): DROID's ``cartesian_position`` form (scipy ``as_euler("xyz")``, as in
    DROID's ``droid/misc/transformations.py``)"""


_FIELD = re.compile(r"^(?P<source>[a-z_]+)(?::(?P<camera>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<a>\d+):(?P<b>\d+)\])?$")


@dataclass(frozen=True)
class ObsField:
    """One server key's source: ``"image"``, ``"image:wrist"``, ``"frames:exterior"``, ``"prompt"``, ``"state"``,
    ``"state[9:10]"`` or ``"pose_euler[0:9]"`` (strings convert with :meth:`parse`)."""

    source: ObsSource
    camera: str | None = None  # FRAMES and IMAGE: a camera of a MultiCameraObservation (None: obs["frames"])
    columns: tuple[int, int] | None = None  # STATE (None: every column) and POSE_EULER (required, 9 wide)

    @classmethod
    def parse(cls, value: str | ObsSource | ObsField, key: str) -> ObsField:
        if isinstance(value, ObsField):
            return value
        allowed = (f"one of {[s.value for s in ObsSource]}, 'image:<camera>', 'frames:<camera>', 'state[a:b]' or "
                   "'pose_euler[a:a+9]'")
        match = _FIELD.match(value.value if isinstance(value, ObsSource) else value) if isinstance(value, str) else None
        source = next((s for s in ObsSource if match and s.value == match["source"]), None)
        columns = None if not match or match["a"] is None else (int(match["a"]), int(match["b"]))
        camera = None if not match else match["camera"]
        ok = source is not None and (
            (camera is None or source in (ObsSource.FRAMES, ObsSource.IMAGE))
            and (columns is None or (source in (ObsSource.STATE, ObsSource.POSE_EULER) and columns[1] > columns[0]))
            and (source is not ObsSource.POSE_EULER or (columns is not None and columns[1] - columns[0] == 9)))
        if not ok:
            raise ValueError(f"obs_keys[{key!r}]={value!r} is invalid; allowed: {allowed}")
        return cls(source, camera, columns)

    def read(self, obs: Mapping[str, Any], prompt: str | None, image_size: tuple[int, int] | None) -> Any:
        """This field's value in a worldstep observation."""
        if self.source is ObsSource.PROMPT:
            return prompt
        if self.source in (ObsSource.FRAMES, ObsSource.IMAGE):
            frames = np.asarray(_obs_entry(obs, "frames" if self.camera is None else self.camera, self))
            return frames if self.source is ObsSource.FRAMES else _resize(frames[-1], image_size)
        row = np.asarray(_obs_entry(obs, "state", self), np.float64)[-1]
        if self.columns is not None and self.columns[1] > len(row):
            raise ValueError(f"source {str(self)!r} is invalid for a state {len(row)} wide; allowed: columns within "
                             f"[0, {len(row)})")
        row = row if self.columns is None else row[self.columns[0]:self.columns[1]]
        if self.source is ObsSource.STATE:
            return row.astype(np.float32)
        euler = matrix_to_euler_xyz(rot6d_to_matrix(row[3:9], f"obs['state'] columns {self.columns}"))
        return np.concatenate([row[:3], euler]).astype(np.float32)

    def __str__(self) -> str:
        if self.camera is not None:
            return f"{self.source.value}:{self.camera}"
        if self.columns is None:
            return self.source.value
        return f"{self.source.value}[{self.columns[0]}:{self.columns[1]}]"


def _obs_entry(obs: Mapping[str, Any], key: str, field: ObsField) -> Any:
    if key not in obs:
        hint = (" (wrap the env in RobotStateObservation: make_env(..., robot_state=True))" if key == "state"
                else " (a MultiCameraObservation names its cameras: make_env(..., cameras=(...)))")
        raise ValueError(f"source {str(field)!r} needs obs[{key!r}]; the observation has {sorted(obs)}{hint}")
    return obs[key]


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


DEFAULT_OBS_KEYS = {"observation/image": "image", "prompt": "prompt"}

DROID_OBS_KEYS = {
    "observation/exterior_image_1_left": "image:exterior",
    "observation/wrist_image_left": "image:wrist",
    "observation/cartesian_position": "pose_euler[0:9]",
    "observation/gripper_position": "state[9:10]",
    "prompt": "prompt",
}
"""openpi's DROID observation keys (``examples/droid/main.py``, ``DroidInputs``) filled from an env made with
``cameras=("exterior", "wrist")``, ``robot_state=True`` and ``embodiment="droid_lerobot"``: the two cameras'
latest frames, the commanded end-effector pose as DROID's ``cartesian_position`` (position + ``xyz`` Euler), the
commanded gripper and the prompt. openpi's DROID policies also read ``observation/joint_position`` (7 joint
angles), which a world model's commanded end-effector state cannot give: send it with ``static_obs`` if the
policy needs it. openpi's own client resizes with padding to 224x224; pass ``image_size=(224, 224)`` for a plain
resize."""


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
        self.obs_keys = _check_obs_keys(DEFAULT_OBS_KEYS if obs_keys is None else obs_keys)
        prompt_keys = [k for k, v in self.obs_keys.items() if v.source is ObsSource.PROMPT]
        if prompt_keys and not (isinstance(prompt, str) and prompt.strip()):
            raise ValueError(f"prompt={prompt!r} is invalid; obs_keys maps {prompt_keys} to 'prompt', "
                             "so a non-empty string is required")
        self.prompt = prompt
        self.static_obs = dict(static_obs or {})
        clash = set(self.static_obs) & set(self.obs_keys)
        if clash:
            raise ValueError(f"static_obs keys {sorted(clash)} are also in obs_keys; allowed: disjoint keys")
        self.image_size = _check_image_size(image_size)
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


def _check_obs_keys(obs_keys: Mapping[str, str | ObsSource | ObsField]) -> dict[str, ObsField]:
    if not isinstance(obs_keys, Mapping) or not obs_keys:
        raise ValueError(f"obs_keys={obs_keys!r} is invalid; allowed: a non-empty mapping server key -> one of "
                         f"{[s.value for s in ObsSource]}")
    out = {}
    for key, source in obs_keys.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"obs_keys key {key!r} is invalid; allowed: a non-empty string")
        out[key] = ObsField.parse(source, key)
    return out


def _check_image_size(size: tuple[int, int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if not (isinstance(size, (tuple, list)) and len(size) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in size)):
        raise ValueError(f"image_size={size!r} is invalid; allowed: None or (height, width) of positive ints")
    return int(size[0]), int(size[1])


def _resize(image: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    if size is None or image.shape[:2] == size:
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), Image.Resampling.BILINEAR))
