"""Policies served over the openpi websocket protocol, adapted to worldstep's action chunks.

A policy server (openpi's ``serve_policy.py``, or :class:`worldstep.policies.server.PolicyServer`) sends its
metadata on connect, then answers each msgpack-encoded observation dict with a dict holding an ``"actions"``
array ``(horizon, action_dim)``. ``client.py`` is the connection and its errors, ``observations.py`` how the
server's observation keys are filled, ``policy.py`` the :class:`RemotePolicy` that puts them together.
"""

from __future__ import annotations

from .client import (
    PolicyClient,
    RemotePolicyConnectionError,
    RemotePolicyError,
    RemotePolicyProtocolError,
    RemotePolicyTimeout,
)
from .observations import DROID_OBS_KEYS, ObsField, ObsSource
from .policy import ActionMode, RemotePolicy

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
