"""The wire protocol of ``worldstep serve``: message schema, checks and the encoding of spaces and infos.

Every message is one binary websocket frame holding one msgpack map (``worldstep.wire.packb``: the
openpi codec, numpy arrays as ``{"__ndarray__", "data", "dtype", "shape"}``). A client sends requests
``{"id": int, "op": str, ...fields}``; the server answers each with ``{"id", "ok": True, ...}`` or
``{"id", "ok": False, "error": {"kind", "message", "retry_after_s"?}}``. The first request of a connection
must be ``hello`` with the client's ``protocol``; docs/serving.md lists every op and its fields. ``reset``,
``step`` and ``fork`` carry the session's sequence number ``seq`` (at most once: ``sessions.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
from gymnasium import spaces

from ..wire import packb, unpackb

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "SHUTDOWN_CLOSE_CODE",
    "ErrorKind",
    "Op",
    "ProtocolError",
    "Request",
    "decode_request",
    "decode_space",
    "encode_error",
    "encode_space",
]

PROTOCOL_VERSION = 2  # 2: resumable sessions, sequence numbers, status
SHUTDOWN_CLOSE_CODE = 4000
"""The websocket close code of a draining server (private range): its reason names the sessions lost, and the
client raises it at once instead of reconnecting to a server that is gone."""
MAX_CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's payload is at most 125 bytes, 2 of them the code
DEFAULT_MAX_MESSAGE_BYTES = 8 * 2**20  # a reset image of 1080p is 6 MiB
MAX_ACTION_VALUES = 2**16  # a chunk of 64 actions of width 64 is 4096
OPEN_KEYS = ("max_windows", "prompt", "domain_id", "embodiment", "action_width", "image", "success_fn",
             "resolution_tier", "fps", "observation")


class Op(str, Enum):
    """What a request asks for."""

    HELLO = "hello"  # protocol version in, the server's model, embodiments and default spaces out
    OPEN = "open"  # env kwargs in, a session id and its spaces out
    RESET = "reset"
    STEP = "step"
    FORK = "fork"
    CLOSE = "close"
    STATS = "stats"  # sessions and KV pages in use
    RESUME = "resume"  # a session of a lost connection, by its id and resume key, onto this connection
    STATUS = "status"  # this connection's sessions: pages, bytes, context, committed step, idle time
    RENDER = "render"  # the session's latest frame (a latent session decodes its skipped windows first)


class ErrorKind(str, Enum):
    """What went wrong; the client raises the matching exception (docs/serving.md)."""

    PROTOCOL = "protocol"  # malformed, out of order or not in the schema
    VALUE = "value"  # ValueError of the env
    TYPE = "type"  # TypeError of the env
    RESET_NEEDED = "reset_needed"
    CLOSED = "closed"
    UNKNOWN_SESSION = "unknown_session"  # not a session of this connection (or not resumable)
    SEQUENCE = "sequence"  # a seq that is neither the next one nor a retry of the last applied one
    SERVER_FULL = "server_full"
    DRAINING = "draining"
    INTERNAL = "internal"


class ProtocolError(ValueError):
    """A request the schema refuses; the message names the field, the value's type and what is allowed.

    ``request_id`` is the request's id when it could be read (the error reply answers it)."""

    request_id: int | None = None


# field -> allowed python types (after msgpack decoding); every op's fields, `id` and `op` aside
_NONE = type(None)
SCHEMA: dict[Op, dict[str, tuple[type, ...]]] = {
    Op.HELLO: {"protocol": (int,)},
    Op.OPEN: {"env": (dict,)},
    Op.RESET: {"session": (str,), "seq": (int,), "seed": (int, _NONE), "options": (dict, _NONE)},
    Op.STEP: {"session": (str,), "seq": (int,), "actions": (np.ndarray,)},
    Op.FORK: {"session": (str,), "seq": (int,), "seed": (int, _NONE)},
    Op.CLOSE: {"session": (str,)},
    Op.STATS: {},
    Op.RESUME: {"session": (str,), "key": (str,)},
    Op.STATUS: {},
    Op.RENDER: {"session": (str,)},
}
_OPTIONAL = {"seed", "options"}
_SCALARS = (str, int, float, bool, _NONE)


@dataclass(frozen=True)
class Request:
    """One checked request."""

    id: int
    op: Op
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def session(self) -> str:
        return self.fields["session"]


def decode_request(data: Any) -> Request:
    """The request in ``data`` (one websocket message), or a ``ProtocolError`` naming what is wrong."""
    if not isinstance(data, bytes):
        raise ProtocolError(f"a {type(data).__name__} message is invalid; allowed: binary msgpack frames")
    try:
        message = unpackb(data)
    except Exception as err:  # truncated, bad markers, bad dtypes: whatever msgpack or numpy raise
        raise ProtocolError(f"the message is not valid msgpack ({type(err).__name__})") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a message of type {type(message).__name__} is invalid; allowed: a map")
    request_id = message.get("id")
    if type(request_id) is not int or not 0 <= request_id < 2**63:
        raise ProtocolError("id is invalid; allowed: an int in [0, 2**63)")
    try:
        return _decode_fields(request_id, message)
    except ProtocolError as err:
        err.request_id = request_id
        raise


def _decode_fields(request_id: int, message: dict) -> Request:
    try:
        op = Op(message.get("op"))
    except (ValueError, TypeError):
        raise ProtocolError(f"op is invalid; allowed: {[o.value for o in Op]}") from None
    schema = SCHEMA[op]
    unknown = sorted(map(str, set(message) - set(schema) - {"id", "op"}))
    if unknown:
        raise ProtocolError(f"field {unknown[0]!r} is invalid for op {op.value!r}; allowed: {sorted(schema)}")
    fields = {}
    for name, types in schema.items():
        if name not in message and name in _OPTIONAL:
            fields[name] = None
            continue
        value = message.get(name)
        if name not in message or type(value) not in types:
            allowed = " or ".join("None" if t is _NONE else t.__name__ for t in types)
            raise ProtocolError(f"{name} of type {type(value).__name__} is invalid for op {op.value!r}; "
                                f"allowed: {allowed}")
        fields[name] = value
    _check_fields(op, fields)
    return Request(request_id, op, fields)


def _check_fields(op: Op, fields: dict[str, Any]) -> None:
    if "session" in fields and not 0 < len(fields["session"]) <= 64:
        raise ProtocolError("session is invalid; allowed: a session id this connection opened")
    if "seq" in fields and not 1 <= fields["seq"] < 2**63:
        raise ProtocolError(f"seq={fields['seq']} is invalid; allowed: an int in [1, 2**63)")
    if "key" in fields and not 0 < len(fields["key"]) <= 128:
        raise ProtocolError("key is invalid; allowed: the resume key open or fork returned")
    if op is Op.STEP:
        _check_array("actions", fields["actions"], 2, "fiu", MAX_ACTION_VALUES)
    if op is Op.OPEN:
        _check_map("env", fields["env"], OPEN_KEYS)
    if op is Op.RESET and fields["options"] is not None:
        _check_map("options", fields["options"], None)  # the env names an unknown option key, as locally


def _check_map(name: str, value: dict, keys: tuple[str, ...] | None) -> None:
    for key, item in value.items():
        if type(key) is not str or (keys is not None and key not in keys):
            raise ProtocolError(f"{name}[{key!r}] is invalid; allowed keys: {list(keys or ['str'])}")
        if key == "image":
            _check_array(f"{name}['image']", item, 3, "u", DEFAULT_MAX_MESSAGE_BYTES)
        elif type(item) not in _SCALARS:
            raise ProtocolError(f"{name}[{key!r}] of type {type(item).__name__} is invalid; allowed: a str, number "
                                "or None")


def _check_array(name: str, value: Any, ndim: int, kinds: str, max_size: int) -> None:
    if not isinstance(value, np.ndarray) or value.ndim != ndim or value.dtype.kind not in kinds \
            or value.size > max_size:
        got = f"shape {value.shape}, dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ProtocolError(f"{name} ({got}) is invalid; allowed: a {ndim}-d numeric array of at most {max_size} "
                            "values")


# --- replies ---------------------------------------------------------------------------------------


def encode_reply(request_id: int, **payload: Any) -> bytes:
    return packb({"id": request_id, "ok": True, **payload})


def encode_error(request_id: int | None, kind: ErrorKind, message: str, retry_after_s: float | None = None) -> bytes:
    error: dict[str, Any] = {"kind": kind.value, "message": message}
    if retry_after_s is not None:
        error["retry_after_s"] = float(retry_after_s)
    return packb({"id": request_id, "ok": False, "error": error})


# --- spaces and infos ------------------------------------------------------------------------------


def encode_space(space: spaces.Space) -> dict[str, Any]:
    """A ``Box`` or a ``Dict`` of them as plain values (bounds as arrays)."""
    if isinstance(space, spaces.Dict):
        return {"kind": "dict", "spaces": {k: encode_space(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Box):
        return {"kind": "box", "low": space.low, "high": space.high, "dtype": space.dtype.str}
    raise TypeError(f"space {space!r} cannot be sent; allowed: Box or Dict")


def decode_space(data: dict[str, Any]) -> spaces.Space:
    if data["kind"] == "dict":
        return spaces.Dict({k: decode_space(s) for k, s in data["spaces"].items()})
    return spaces.Box(np.array(data["low"]), np.array(data["high"]), dtype=np.dtype(data["dtype"]))


RECORD_KEYS = ("timings", "kv")  # info keys holding the engine's PhaseTimings and KVStats records


def encode_info(info: dict[str, Any]) -> dict[str, Any]:
    return {k: dataclasses.asdict(v) if k in RECORD_KEYS and dataclasses.is_dataclass(v) else v
            for k, v in info.items()}


def decode_info(info: dict[str, Any]) -> dict[str, Any]:
    """The env's info: ``timings`` and ``kv`` become the engine's ``PhaseTimings`` and ``KVStats`` again."""
    if not any(k in info for k in RECORD_KEYS):
        return info
    from worldstep.engine.spec import KVStats, PhaseTimings

    records = {"timings": PhaseTimings, "kv": KVStats}
    return {k: records[k](**v) if k in records and isinstance(v, dict) else v for k, v in info.items()}
