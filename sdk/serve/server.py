"""``worldstep serve``: one loaded world model hosting many env clients over a websocket.

A session outlives its connection for ``session_grace_s``: a reconnecting client resumes it with its key, and
its ``reset``/``step``/``fork`` requests carry sequence numbers, so a retried request is applied at most once and
its reply re-delivered (``sessions.py``). A session no connection resumes within the grace period, and every
session at ``drain()``, is closed and its KV pages and decoder cache go back. Requests are checked against the
schema of ``protocol.py`` before anything reaches the model; a bad one gets an error reply and the connection
goes on. Steps of different connections batch into one engine call (``EngineLoop``).
"""

from __future__ import annotations

import contextlib
import hmac
import http
import socket
import ssl
import struct
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from pydantic import Field
from worldstep.engine.kv import KVPoolExhausted
from worldstep.engine.settings import StrictModel
from worldstep.envs.info import flat_records
from worldstep.envs.wrappers import fork_env

from ..world import World, make_env
from .engine_loop import EngineLoop
from .errors import ServeError
from .protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_CLOSE_REASON_BYTES,
    PROTOCOL_VERSION,
    SHUTDOWN_CLOSE_CODE,
    ErrorKind,
    Op,
    ProtocolError,
    Request,
    decode_request,
    encode_error,
    encode_reply,
    encode_space,
)
from .sessions import ServedSession, SessionTable, token_digest
from .status import committed_step, session_status

__all__ = ["ServeError", "ServeOptions", "WorldModelServer"]  # ServeError lives in errors.py


class ServeOptions(StrictModel):
    """How the server listens, whom it admits and how it batches (the flags of ``worldstep serve``)."""

    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = Field(0, ge=0, le=65535)  # 0 picks a free port
    token: str | None = Field(None, repr=False)  # clients send `Authorization: Api-Key <token>`; None: anyone
    max_sessions: int = Field(64, ge=1)  # open sessions over all connections
    max_batch: int = Field(16, ge=1)  # steps in one engine call
    max_wait_ms: float = Field(2.0, ge=0, le=10_000)  # how long a step waits for others to join its batch
    idle_timeout_s: float = Field(300.0, gt=0)  # a connection silent this long is closed, its sessions freed
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=1024)  # bigger messages close the connection
    retry_after_s: float = Field(1.0, gt=0)  # the delay a "server full" refusal suggests
    session_grace_s: float = Field(60.0, ge=0, le=86_400)  # a dropped connection's sessions wait this long
    send_buffer_bytes: int = Field(4 * 2**20, ge=4096)  # the kernel's send buffer of each connection
    send_timeout_s: float = Field(60.0, gt=0, le=86_400)  # a reply unsent this long closes its connection
    tls_cert: str | None = None  # PEM certificate chain: serve wss://
    tls_key: str | None = None  # its PEM private key


@dataclass(eq=False)
class _Connection:
    """One client connection: whether it said hello, and the digest of the token it presented."""

    token: bytes
    greeted: bool = False


class WorldModelServer:
    """Serve ``world`` on ``ws://host:port`` (``wss://`` with a TLS certificate) from a background thread.

    ```python
    with WorldModelServer(worldstep.load("pusher"), token="s3cret") as server:
        env = worldstep.RemoteWorldModelEnv(server.url, token="s3cret")
    ```
    """

    def __init__(self, world: World, options: ServeOptions | None = None, **kwargs: Any) -> None:
        if not isinstance(world, World):
            raise TypeError(f"world={world!r} is invalid; allowed: a World (worldstep.load(...))")
        self.world = world
        self.options = ServeOptions(**{**(options.model_dump() if options is not None else {}), **kwargs})
        if (self.options.tls_cert is None) != (self.options.tls_key is None):
            raise ValueError("tls_cert and tls_key are invalid: give both (PEM files) or neither")
        self.sessions = SessionTable()
        self.loop = EngineLoop(self.options.max_batch, self.options.max_wait_ms / 1000, self.sessions.attached)
        self._lock = threading.Lock()
        self._reaping = threading.Event()  # set: the reaper stops
        self._open = 0  # sessions open or being opened, over all connections
        self._draining = False
        self._connections: dict[Any, _Connection] = {}  # live websockets, told why when the server drains
        self._server = None
        self._thread: threading.Thread | None = None
        self._reaper = threading.Thread(target=self._reap, name="worldstep-serve-reaper", daemon=True)
        self._default_env = _describe(make_env(world))  # the served config's env, checked before binding

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not running; call start() first")
        scheme = "wss" if self.options.tls_cert else "ws"
        return f"{scheme}://{self.options.host}:{self._server.socket.getsockname()[1]}"

    def start(self) -> WorldModelServer:
        from websockets.sync.server import serve

        if self._server is not None:
            return self
        self.loop.start()
        self._reaper.start()
        self._server = serve(self._handle, self.options.host, self.options.port, ssl=self._ssl_context(),
                             process_request=self._admit, compression=None,
                             max_size=self.options.max_message_bytes, server_header=None)
        self._thread = threading.Thread(target=self._server.serve_forever, name="worldstep-serve", daemon=True)
        self._thread.start()
        return self

    def drain(self) -> None:
        """Stop admitting, let in-flight steps finish, close every connection and every session (detached ones
        too), stop the loop."""
        with self._lock:
            self._draining = True
            connections = list(self._connections.items())
        for conn, state in connections:  # each client learns why at once, not after its reconnect budget
            with contextlib.suppress(Exception):
                conn.close(code=SHUTDOWN_CLOSE_CODE, reason=self._shutdown_reason(state))
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()  # closes connections and waits for their handlers
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._reaping.set()
        if self._reaper.is_alive():
            self._reaper.join(timeout=30)
        if self.loop.running:
            self._close(self.sessions.pop_all())
        self.loop.stop()

    stop = drain

    def __enter__(self) -> WorldModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.drain()

    def _shutdown_reason(self, state: _Connection) -> str:
        """``server shut down; session N lost at step K`` for each session of the connection (cut to what a close
        frame holds)."""
        held = self.sessions.of(state)
        steps = self.loop.call(lambda: [(s.id, committed_step(s)) for s in held]) if held and self.loop.running else []
        reason = "server shut down" + "".join(f"; session {sid} lost at step {step}" for sid, step in steps)
        return reason.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")

    def open_sessions(self) -> int:
        return self._open

    def pages_in_use(self) -> int:
        """KV pages the served model's pool has handed out (its baseline is 0 with no session open)."""
        return self.world.model.kv.num_used_pages

    def status(self) -> list[dict[str, Any]]:
        """Every session's ``status`` row (``status.session_status``), attached or waiting for a resume."""
        return self.loop.call(lambda: [session_status(s) for s in self.sessions.of()])

    def reap(self, now: float | None = None) -> int:
        """Close the sessions detached longer than the grace period (at ``now``, monotonic); how many closed."""
        gone = self.sessions.expired(self.options.session_grace_s, now)
        self._close(gone)
        return len(gone)

    def _reap(self) -> None:
        interval = min(max(self.options.session_grace_s / 4, 0.05), 1.0)
        while not self._reaping.wait(interval):
            try:
                self.reap()
            except Exception:  # a failing close is a bug to log; the reaper goes on with the next sessions
                traceback.print_exc(file=sys.stderr)

    def _close(self, sessions: list[ServedSession]) -> None:
        """Close sessions already taken out of the table: their pages and decoder caches go back."""
        if sessions:
            try:
                self.loop.call(lambda: [s.env.close() for s in sessions])
            finally:
                self._release(len(sessions))

    # --- admission -------------------------------------------------------------------------------

    def _admit(self, connection, request):
        """Refuse the websocket handshake of a draining server or a wrong or missing token (constant time)."""
        if self._draining:
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "the server is draining\n")
        token = self.options.token
        if token is None:
            return None
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Api-Key {token}".encode()):
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong token\n")
        return None

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.options.tls_cert is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.options.tls_cert, self.options.tls_key)
        return context

    def _reserve(self, what: str) -> None:
        with self._lock:
            if self._draining:
                raise ServeError(ErrorKind.DRAINING, f"cannot {what}: the server is draining")
            if self._open >= self.options.max_sessions:
                raise ServeError(ErrorKind.SERVER_FULL,
                                 f"server full: {self._open} of {self.options.max_sessions} sessions in use; "
                                 f"retry in {self.options.retry_after_s:g} s", self.options.retry_after_s)
            self._open += 1

    def _release(self, n: int = 1) -> None:
        with self._lock:
            self._open -= n

    # --- one connection --------------------------------------------------------------------------

    def _handle(self, conn) -> None:
        from websockets.exceptions import ConnectionClosed

        state = _Connection(token_digest(conn.request.headers.get("Authorization")))
        bound_sends(conn.socket, self.options.send_buffer_bytes, self.options.send_timeout_s)
        with self._lock:
            self._connections[conn] = state
        try:
            while True:
                try:
                    data = conn.recv(timeout=self.options.idle_timeout_s)
                except TimeoutError:
                    conn.close(code=1001, reason="idle timeout")
                    return
                conn.send(self._answer(data, state))  # blocks while a client that stopped reading fills its buffers
        except ConnectionClosed:
            return
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            self._disconnected(state)

    def _disconnected(self, state: _Connection) -> None:
        """The connection is gone: its sessions wait ``session_grace_s`` for a resume (closed now without one)."""
        held = self.sessions.detach(state)
        if self.options.session_grace_s == 0 or self._draining:
            self._close([s for s in held if self.sessions.pop(s.id) is s])

    def _answer(self, data: Any, state: _Connection) -> bytes:
        request_id = None
        try:
            request = decode_request(data)
            request_id = request.id
            if not state.greeted and request.op is not Op.HELLO:
                raise ProtocolError(f"op {request.op.value!r} before hello; the first request must be hello")
            return encode_reply(request.id, **self._dispatch(request, state))
        except ServeError as err:
            return encode_error(request_id, err.kind, str(err), err.retry_after_s)
        except ProtocolError as err:
            return encode_error(err.request_id if request_id is None else request_id, ErrorKind.PROTOCOL, str(err))
        except KVPoolExhausted as err:  # a reset or fork the page pool cannot hold now: capacity, not a bug
            return encode_error(request_id, ErrorKind.SERVER_FULL, f"server full: the KV page pool cannot hold "
                                f"another episode now ({err}); retry in {self.options.retry_after_s:g} s",
                                self.options.retry_after_s)
        except gym.error.ResetNeeded as err:
            return encode_error(request_id, ErrorKind.RESET_NEEDED, str(err))
        except gym.error.ClosedEnvironmentError as err:
            return encode_error(request_id, ErrorKind.CLOSED, str(err))
        except (ValueError, gym.error.Error) as err:
            return encode_error(request_id, ErrorKind.VALUE, str(err))
        except TypeError as err:
            return encode_error(request_id, ErrorKind.TYPE, str(err))
        except Exception as err:  # a bug, not the client's fault: logged here, named only by type there
            traceback.print_exc(file=sys.stderr)
            return encode_error(request_id, ErrorKind.INTERNAL, f"the server failed ({type(err).__name__})")

    def _dispatch(self, request: Request, state: _Connection) -> dict[str, Any]:
        f = request.fields
        if request.op is Op.HELLO:
            if f["protocol"] != PROTOCOL_VERSION:
                raise ServeError(ErrorKind.PROTOCOL, f"protocol {f['protocol']} is invalid; this server speaks "
                                                     f"protocol {PROTOCOL_VERSION} (install a matching worldstep)")
            state.greeted = True
            return self._hello()
        if request.op is Op.OPEN:
            return self._open_session(state, lambda: self._make_env(f["env"]))
        if request.op is Op.STATS:
            return {"sessions": self._open, "pages_in_use": self.loop.call(self.pages_in_use),
                    "batches": self.loop.batches}
        if request.op is Op.STATUS:
            return {"sessions": self.loop.call(lambda: [session_status(s) for s in self.sessions.of(state)])}
        if request.op is Op.RESUME:
            session = self.sessions.resume(f["session"], f["key"], state.token, state)
            return {"session": session.id, "seq": session.seq, "committed_step": committed_step(session)}
        session = self.sessions.owned(request.session, state)
        if request.op is Op.CLOSE:
            if self.sessions.pop(session.id) is session:
                self._close([session])
            return {}
        if request.op is Op.RENDER:  # changes no episode: not sequenced, never recorded
            with session.lock:
                return {"frame": self.loop.call(session.env.unwrapped.last_frame)}
        with session.lock:  # a retry on a new connection waits here for the same request still running
            recorded = session.admit(request.op, f["seq"])
            if recorded is not None:
                if request.op is Op.FORK:
                    self.sessions.attach(recorded["session"], state)
                return recorded
            reply = self._apply(session, request, state)
            reply["committed_step"] = committed_step(session)
            session.applied(request.op, f["seq"], reply)
            return reply

    def _apply(self, session: ServedSession, request: Request, state: _Connection) -> dict[str, Any]:
        """Run one reset, step or fork of ``session`` on the engine loop (counted in ``model_calls``)."""
        f, env = request.fields, session.env
        if request.op is Op.RESET:
            obs, info = self.loop.call(lambda: env.reset(seed=f["seed"], options=f["options"]))
            reply = {"obs": obs, "info": flat_records(info)}
        elif request.op is Op.STEP:
            obs, reward, terminated, truncated, info = self.loop.step(env, f["actions"])
            reply = {"obs": obs, "reward": reward, "terminated": bool(terminated), "truncated": bool(truncated),
                     "info": flat_records(info)}
        else:  # Op.FORK
            reply = self._open_session(state, lambda: fork_env(env, seed=f["seed"]))
        session.model_calls += 1
        return reply

    def _open_session(self, state: _Connection, make) -> dict[str, Any]:
        self._reserve("open a session")
        try:
            env = self.loop.call(make)
        except BaseException:
            self._release()
            raise
        session = self.sessions.add(env, state, state.token)
        return {"session": session.id, "key": session.key, "committed_step": committed_step(session),
                **_describe(env)}

    def _make_env(self, overrides: dict[str, Any]):
        """The client's env: ``worldstep.make_env(world, **overrides)``, with the local call's checks and errors."""
        return make_env(self.world, **overrides)

    def _hello(self) -> dict[str, Any]:
        from worldstep import __version__

        model = self.world.model
        return {"protocol": PROTOCOL_VERSION, "worldstep": __version__, "model": self.world.config.model.name,
                "embodiments": sorted(e.name for e in model.embodiments.within(model.spec.num_domains)),
                "max_sessions": self.options.max_sessions, "max_message_bytes": self.options.max_message_bytes,
                "session_grace_s": self.options.session_grace_s, "env": self._default_env}


def bound_sends(sock: socket.socket, buffer_bytes: int, timeout_s: float) -> None:
    """A client that stops reading fills at most ``buffer_bytes`` of kernel buffer (no autotuning past it), and a
    reply it leaves unsent for ``timeout_s`` fails the send (``SO_SNDTIMEO``), which closes its connection."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
    if sys.platform != "win32":  # a struct timeval; Windows takes milliseconds and has no such stall to bound
        seconds = int(timeout_s)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", seconds, int((timeout_s - seconds) * 1e6)))


def _describe(env) -> dict[str, Any]:
    """What a client env mirrors: spaces, metadata and the reset defaults."""
    return {"observation_space": encode_space(env.observation_space), "action_space": encode_space(env.action_space),
            "render_fps": float(env.metadata["render_fps"]), "frame_fps": float(env.metadata["frame_fps"]),
            "prompt": env.unwrapped.prompt, "domain_id": int(env.unwrapped.domain_id),
            "embodiment": env.unwrapped.embodiment, "max_windows": env.get_wrapper_attr("max_windows")}
