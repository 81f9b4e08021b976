"""The daemon's socket server: framing, peer checks, dispatch, cancellation, graceful shutdown.

One asyncio loop serves every connection. Each request runs as its own task, so a long ``chat``
never blocks a ``cancel`` or a ``complete`` on the same or another connection; slow, blocking
work (models, indexing) runs in threads started by the handlers, never on this loop.

Safety at the edge: the socket lives in a 0700 directory with mode 0600, and every connection's
peer uid (SO_PEERCRED) must equal ours. A malformed line, an unknown method or an oversized
message gets a JSON-RPC error and the connection keeps working; an exception in a handler is
logged and reported to the client, never taken down the daemon with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import os
import signal
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openjarvis.daemon.protocol import (
    MAX_MESSAGE_BYTES,
    ErrorCode,
    Notification,
    ProtocolError,
    Request,
    Response,
    decode,
    decode_params,
    encode,
    to_json,
)

log = logging.getLogger("openjarvis.daemon")

READ_CHUNK = 64 * 1024
#: Seconds that requests in flight get to finish on SIGTERM before they are cancelled.
SHUTDOWN_GRACE_S = 5.0


@dataclass
class Connection:
    """One client connection: its writer, its requests in flight, whether it said hello."""

    id: int
    writer: asyncio.StreamWriter
    peer_pid: int
    initialized: bool = False
    client_name: str = ""
    tasks: dict[int | str, asyncio.Task[None]] = field(default_factory=dict)
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False

    async def send(self, data: bytes) -> None:
        if self.closed:
            return
        async with self.write_lock:
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (ConnectionError, OSError):
                self.closed = True


@dataclass
class Call:
    """What a handler gets besides its params: who asked, and a way to stream notifications."""

    id: int | str
    connection: Connection
    daemon: Daemon

    async def notify(self, method: str, params: Any) -> None:
        await self.connection.send(encode(Notification(method, to_json(params))))


Handler = Callable[[Any, Call], Awaitable[Any]]


@dataclass(frozen=True)
class Method:
    params: type
    handler: Handler
    #: Methods allowed before ``initialize`` (only initialize itself).
    before_init: bool = False


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process on the other end of a Unix socket."""
    if hasattr(socket, "SO_PEERCRED"):
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        return pid, uid, gid
    # macOS and the BSDs: getpeereid is not in Python's socket module; the 0700 directory and
    # 0600 socket already keep other users out there.
    return -1, os.getuid(), os.getgid()


class Daemon:
    """The server: holds the method table and the state every handler shares."""

    def __init__(self, socket_path: Path, methods: dict[str, Method], *, version: str) -> None:
        self.socket_path = socket_path
        self.methods = methods
        self.version = version
        self.started = time.monotonic()
        self.requests = 0
        self.connections: dict[int, Connection] = {}
        self.stopping = asyncio.Event()
        self.state: dict[str, Any] = {}  # per-feature state owned by handler modules
        self._next_conn = 0
        self._server: asyncio.AbstractServer | None = None
        self.on_shutdown: list[Callable[[], Awaitable[None]]] = []

    @property
    def in_flight(self) -> int:
        return sum(len(c.tasks) for c in self.connections.values())

    # -- lifecycle -------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Listen until ``shutdown`` or SIGTERM/SIGINT, then stop gracefully."""
        prepare_socket_dir(self.socket_path.parent)
        remove_stale_socket(self.socket_path)
        old_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
        try:
            self._server = await asyncio.start_unix_server(
                self._on_connect, path=str(self.socket_path), limit=READ_CHUNK * 2
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stopping.set)
        log.info("listening on %s (pid %d)", self.socket_path, os.getpid())
        try:
            await self.stopping.wait()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        log.info("shutting down: %d request(s) in flight", self.in_flight)
        if self._server is not None:
            self._server.close()
        tasks = [t for c in self.connections.values() for t in c.tasks.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for hook in self.on_shutdown:
            try:
                await hook()
            except Exception:  # top-level shutdown: log, keep closing the rest
                log.exception("shutdown hook failed")
        for conn in list(self.connections.values()):
            conn.writer.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        log.info("stopped")

    # -- connections -----------------------------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, uid, _ = peer_credentials(sock)
        if uid != os.getuid():
            log.warning("refused connection from uid %d (pid %d)", uid, pid)
            refusal = ProtocolError(ErrorCode.INVALID_REQUEST, "this daemon serves only its own user")
            writer.write(encode(Response(None, error=refusal.to_json())))
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
            writer.close()
            return
        self._next_conn += 1
        conn = Connection(self._next_conn, writer, pid)
        self.connections[conn.id] = conn
        try:
            await self._read_loop(reader, conn)
        finally:
            conn.closed = True
            for task in conn.tasks.values():
                task.cancel()  # a client that went away wants none of its answers
            self.connections.pop(conn.id, None)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _read_loop(self, reader: asyncio.StreamReader, conn: Connection) -> None:
        buf = bytearray()
        discarding = False
        while not reader.at_eof():
            try:
                chunk = await reader.read(READ_CHUNK)
            except (ConnectionError, OSError):
                return
            if not chunk:
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if not discarding and len(buf) > MAX_MESSAGE_BYTES:
                        discarding = True
                        await self._too_large(conn)
                    if discarding:
                        buf.clear()
                    break
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if discarding:  # the tail of an oversized message
                    discarding = False
                    continue
                if len(line) > MAX_MESSAGE_BYTES:
                    await self._too_large(conn)
                    continue
                if line.strip():
                    await self._dispatch(conn, line)

    async def _too_large(self, conn: Connection) -> None:
        err = ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message larger than {MAX_MESSAGE_BYTES // (1024 * 1024)} MiB refused; send less (e.g. a file path)",
        )
        await conn.send(encode(Response(None, error=err.to_json())))

    async def _dispatch(self, conn: Connection, line: bytes) -> None:
        try:
            msg = decode(line)
        except ProtocolError as exc:
            await conn.send(encode(Response(None, error=exc.to_json())))
            return
        if isinstance(msg, Response):
            return  # clients do not answer us; ignore
        if isinstance(msg, Notification):
            return  # no client notifications are defined; ignore per JSON-RPC
        self.requests += 1
        if msg.id in conn.tasks:
            err = ProtocolError(ErrorCode.INVALID_REQUEST, f"request id {msg.id!r} is already in flight")
            await conn.send(encode(Response(msg.id, error=err.to_json())))
            return
        if msg.method == "cancel":
            # Answered inline: it must never queue behind the work it is cancelling.
            await self._run(conn, msg)
            return
        task = asyncio.create_task(self._run(conn, msg), name=f"{conn.id}:{msg.method}:{msg.id}")
        conn.tasks[msg.id] = task
        task.add_done_callback(functools.partial(self._cancelled_before_start, conn, msg))

    def _cancelled_before_start(self, conn: Connection, req: Request, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never ran ``_run``: answer CANCELLED for it."""
        if not task.cancelled():
            return  # _run answered (a cancellation inside it is answered there)
        conn.tasks.pop(req.id, None)
        err = ProtocolError(ErrorCode.CANCELLED, f"request {req.id!r} ({req.method}) was cancelled")
        if not conn.closed:
            asyncio.get_running_loop().create_task(conn.send(encode(Response(req.id, error=err.to_json()))))

    async def _run(self, conn: Connection, req: Request) -> None:
        try:
            result = await self._call(conn, req)
            await conn.send(encode(Response(req.id, result=to_json(result))))
        except ProtocolError as exc:
            await conn.send(encode(Response(req.id, error=exc.to_json())))
        except asyncio.CancelledError:
            err = ProtocolError(ErrorCode.CANCELLED, f"request {req.id!r} ({req.method}) was cancelled")
            await conn.send(encode(Response(req.id, error=err.to_json())))
        except Exception as exc:  # top-level request handler: report, log, keep serving
            log.exception("%s failed", req.method)
            err = ProtocolError(ErrorCode.INTERNAL_ERROR, f"{req.method} failed: {exc}; see `jarvis daemon logs`")
            await conn.send(encode(Response(req.id, error=err.to_json())))
        finally:
            conn.tasks.pop(req.id, None)

    async def _call(self, conn: Connection, req: Request) -> Any:
        method = self.methods.get(req.method)
        if method is None:
            raise ProtocolError(
                ErrorCode.METHOD_NOT_FOUND, f"unknown method {req.method!r}; see docs/protocol.md for the list"
            )
        if self.stopping.is_set():
            raise ProtocolError(ErrorCode.SHUTTING_DOWN, "the daemon is shutting down; retry in a moment")
        if not conn.initialized and not method.before_init:
            raise ProtocolError(ErrorCode.NOT_INITIALIZED, "send initialize first")
        params: Any = decode_params(method.params, req.params)
        return await method.handler(params, Call(req.id, conn, self))


# -- the socket's directory, stale sockets, the single-instance lock --------------------------------


def prepare_socket_dir(directory: Path) -> None:
    """Create the socket directory 0700 and refuse one that others can enter or that is not ours."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to uid {st.st_uid}, not to you; remove it or set XDG_RUNTIME_DIR")
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)


def socket_alive(path: Path, timeout: float = 1.0) -> bool:
    """True when something accepts connections on ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def remove_stale_socket(path: Path) -> None:
    """A socket file left by a crashed daemon is removed; a live one means we must not start."""
    if not path.exists():
        return
    if socket_alive(path):
        raise RuntimeError(f"a daemon is already listening on {path}")
    path.unlink()


class InstanceLock:
    """An flock held for the daemon's lifetime: a second daemon for the same socket refuses to start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
