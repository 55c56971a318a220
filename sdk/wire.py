"""What crosses a websocket: the msgpack codec both protocols speak, and the error base of both clients.

The policy client and server (``worldstep.policies.remote``, ``worldstep.policies.server``) and ``worldstep serve``
(``worldstep.serve``) send one msgpack map per binary frame in openpi's codec (``openpi_client.msgpack_numpy``):
numpy arrays travel as ``{"__ndarray__": True, "data", "dtype", "shape"}`` and numpy scalars as
``{"__npgeneric__": True, "data", "dtype"}``. A failed call of either client raises a :class:`RemoteError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EXTRA_HINT", "RemoteError", "packb", "unpackb"]

EXTRA_HINT = "pip install 'worldstep[remote]'"


class RemoteError(RuntimeError):
    """A request to a remote server failed; ``address`` names the server, and so does the message.

    The base of the policy client's ``RemotePolicyError`` and the env client's ``RemoteEnvError``, so one
    ``except RemoteError`` covers a remote policy and a remote env alike."""

    server = "server"  # what the message calls the server

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"{self.server} {address}: {message}")
        self.address = address


def _pack_array(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"numpy dtype {obj.dtype} cannot be sent; allowed: numeric, bool or string arrays")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": _raw(obj), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def _raw(array: np.ndarray) -> bytes | memoryview:
    """The array's bytes in C order: a view of its own buffer when it is C-contiguous (msgpack writes a
    ``memoryview`` as the same bin field ``tobytes()`` would give, without copying the frames first)."""
    if array.flags.c_contiguous and array.ndim > 0:
        try:
            return array.data.cast("B")
        except (ValueError, TypeError):  # a dtype the buffer protocol cannot export (datetime64, ...)
            pass
    return array.tobytes()


def _unpack_array(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def _msgpack():
    try:
        import msgpack
    except ImportError as err:  # an optional extra: a clear message instead of a bare ModuleNotFoundError
        raise ImportError(f"remote policies and envs need msgpack and websockets: {EXTRA_HINT}") from err
    return msgpack


def packb(obj: Any) -> bytes:
    """``obj`` (dicts, lists, scalars, numpy arrays) as openpi's msgpack bytes."""
    return _msgpack().packb(obj, default=_pack_array)


def unpackb(data: bytes) -> Any:
    """The inverse of :func:`packb`."""
    return _msgpack().unpackb(data, object_hook=_unpack_array)
