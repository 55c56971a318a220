"""``worldstep serve``: one loaded world model, many env clients over a websocket (docs/serving.md).

This package re-exports the client side, which loads no model and imports no torch; the server is
``worldstep.serve.server.WorldModelServer``.
"""

from .client import (
    RemoteEnvAuthError,
    RemoteEnvConnectionError,
    RemoteEnvError,
    RemoteEnvProtocolError,
    RemoteWorldModelEnv,
    ServeConnection,
    ServerFullError,
)
from .protocol import PROTOCOL_VERSION

__all__ = [
    "PROTOCOL_VERSION",
    "RemoteEnvAuthError",
    "RemoteEnvConnectionError",
    "RemoteEnvError",
    "RemoteEnvProtocolError",
    "RemoteWorldModelEnv",
    "ServeConnection",
    "ServerFullError",
]
