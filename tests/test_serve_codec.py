"""The frames of a reply go into msgpack straight from the array's buffer: the same bytes on the wire as before
(openpi's codec), one copy fewer in the server."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from worldstep.wire import _pack_array, packb, unpackb


def _copying_packb(obj):
    """The codec as it was: every array copied by ``tobytes()`` before msgpack writes it."""
    def pack(o):
        if isinstance(o, np.ndarray):
            return {b"__ndarray__": True, b"data": o.tobytes(), b"dtype": o.dtype.str, b"shape": o.shape}
        return _pack_array(o)
    return msgpack.packb(obj, default=pack)


ARRAYS = {
    "frames": np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3),
    "big_endian": np.arange(6, dtype=">f4").reshape(2, 3),
    "bools": np.array([[True, False], [False, True]]),
    "strided": np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],  # not C-contiguous: copied
    "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    "scalar_array": np.array(3.5),
    "empty": np.zeros((0, 3), np.float32),
    "dates": np.array(["2024-01-01"], dtype="datetime64[D]"),  # no buffer export: copied
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_arrays_pack_to_the_same_bytes_and_round_trip(name):
    array = ARRAYS[name]
    payload = {"obs": {"frames": array}, "reward": np.float32(0.5)}
    assert packb(payload) == _copying_packb(payload)  # the wire format is unchanged
    back = unpackb(packb(payload))["obs"]["frames"]
    assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)


def test_a_contiguous_array_is_packed_from_its_own_buffer():
    frames = ARRAYS["frames"]
    data = _pack_array(frames)[b"data"]
    assert isinstance(data, memoryview) and np.shares_memory(np.frombuffer(data, np.uint8), frames)
