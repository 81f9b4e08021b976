"""Clients of the daemon: ``Client`` (blocking) and ``AsyncClient`` (asyncio), one protocol.

The CLI, the TUI, the editor plugins' tests and every daemon test use these; nothing talks to the
daemon another way. Both start the daemon on demand (``autostart=True``), say ``initialize``
first, and turn JSON-RPC error objects into ``DaemonError`` carrying the protocol's code.

Streaming: methods like ``chat`` send notifications (``chat/token``, ``chat/progress``, ...)
whose params carry the ``request_id`` they belong to before the final response; pass
``on_notification`` to see them, and pick by method (each has its own params).

Example::

    def show(method, params):
        if method == "chat/token":
            print(params["text"], end="")

    with Client() as c:
        c.call("chat", {...}, on_notification=show)
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from openjarvis import paths
from openjarvis.daemon.protocol import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    Notification,
    ProtocolError,
    Request,
    Response,
    decode,
    encode,
)
from openjarvis.errors import DaemonError

OnNotification = Callable[[str, dict[str, Any]], None]


def _raise_for(resp: Response) -> Any:
    if resp.error is not None:
        raise DaemonError(
            str(resp.error.get("message", "daemon error")), code=resp.error.get("code"), data=resp.error.get("data")
        )
    return resp.result


class Client:
    """A blocking connection; one request at a time (a second thread needs its own Client)."""

    def __init__(
        self,
        socket_path: Path | None = None,
        *,
        client_name: str = "jarvis-cli",
        autostart: bool = True,
        timeout: float | None = None,
    ) -> None:
        self.socket_path = socket_path or paths.socket_path()
        self.client_name = client_name
        self.autostart = autostart
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._rfile: Any = None
        self._ids = itertools.count(1)
        self.server_info: dict[str, Any] = {}

    def connect(self) -> Client:
        if self.autostart:
            from openjarvis.daemon.lifecycle import ensure_running

            ensure_running(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError as exc:
            sock.close()
            raise DaemonError(
                f"cannot reach the daemon at {self.socket_path} ({exc.strerror}); start it with `jarvis daemon start`"
            ) from exc
        self._sock = sock
        self._rfile = sock.makefile("rb")
        self.server_info = self.call(
            "initialize", {"protocol_version": PROTOCOL_VERSION, "client_name": self.client_name}
        )
        return self

    def close(self) -> None:
        if self._rfile is not None:
            self._rfile.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._rfile = None

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a request without waiting; returns its id (see ``wait``)."""
        if self._sock is None:
            raise DaemonError("not connected; call connect() first")
        rid = next(self._ids)
        self._sock.sendall(encode(Request(rid, method, params or {})))
        return rid

    def wait(self, rid: int, on_notification: OnNotification | None = None) -> Any:
        """Read until the response to ``rid``, passing its notifications on."""
        while True:
            line = self._rfile.readline(MAX_MESSAGE_BYTES + 2)
            if not line:
                raise DaemonError("the daemon closed the connection; see `jarvis daemon logs`")
            try:
                msg = decode(line)
            except ProtocolError as exc:
                raise DaemonError(f"unreadable message from the daemon: {exc.message}") from exc
            if isinstance(msg, Notification):
                if on_notification is not None and msg.params.get("request_id") in (rid, None):
                    on_notification(msg.method, msg.params)
            elif isinstance(msg, Response) and (msg.id == rid or msg.id is None):
                return _raise_for(msg)

    def call(
        self, method: str, params: dict[str, Any] | None = None, on_notification: OnNotification | None = None
    ) -> Any:
        return self.wait(self.send(method, params), on_notification)


class AsyncClient:
    """An asyncio connection that can have many requests in flight at once."""

    def __init__(self, socket_path: Path | None = None, *, client_name: str = "jarvis", autostart: bool = True) -> None:
        self.socket_path = socket_path or paths.socket_path()
        self.client_name = client_name
        self.autostart = autostart
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[tuple[str, dict[str, Any]]]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self.server_info: dict[str, Any] = {}

    async def connect(self) -> AsyncClient:
        if self.autostart:
            from openjarvis.daemon.lifecycle import ensure_running

            await asyncio.to_thread(ensure_running, self.socket_path)
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                str(self.socket_path), limit=MAX_MESSAGE_BYTES + 2
            )
        except OSError as exc:
            raise DaemonError(
                f"cannot reach the daemon at {self.socket_path} ({exc.strerror}); start it with `jarvis daemon start`"
            ) from exc
        self._reader_task = asyncio.create_task(self._read_loop())
        self.server_info = await self.call(
            "initialize", {"protocol_version": PROTOCOL_VERSION, "client_name": self.client_name}
        )
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
        if self._reader_task is not None:
            self._reader_task.cancel()
            try:
                await self._reader_task
            except asyncio.CancelledError:
                pass
        self._fail_all(DaemonError("connection closed"))

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    def _fail_all(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                try:
                    msg = decode(line)
                except ProtocolError:
                    continue
                if isinstance(msg, Notification):
                    rid = msg.params.get("request_id")
                    queue = self._streams.get(rid) if isinstance(rid, int) else None
                    if queue is not None:
                        queue.put_nowait((msg.method, msg.params))
                elif isinstance(msg, Response) and isinstance(msg.id, int):
                    fut = self._pending.pop(msg.id, None)
                    if fut is not None and not fut.done():
                        if msg.error is not None:
                            fut.set_exception(
                                DaemonError(str(msg.error.get("message")), msg.error.get("code"), msg.error.get("data"))
                            )
                        else:
                            fut.set_result(msg.result)
        except (ConnectionError, OSError, ValueError):
            pass
        self._fail_all(DaemonError("the daemon closed the connection; see `jarvis daemon logs`"))

    @property
    def closed(self) -> bool:
        """True once the connection is gone (closed by us, or the daemon went away)."""
        return self._writer is None or self._reader_task is None or self._reader_task.done()

    def reserve_id(self) -> int:
        """An id for the next ``stream`` call, known before it starts (so a cancel never misses)."""
        return next(self._ids)

    def _check_open(self) -> None:
        if self._writer is None:
            raise DaemonError("not connected; call connect() first")
        if self.closed:
            raise DaemonError("the connection to the daemon is closed; connect again")

    async def _send(self, method: str, params: dict[str, Any] | None) -> tuple[int, asyncio.Future[Any]]:
        self._check_open()
        assert self._writer is not None
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._writer.write(encode(Request(rid, method, params or {})))
        await self._writer.drain()
        return rid, fut

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        _, fut = await self._send(method, params)
        return await fut

    async def stream(
        self, method: str, params: dict[str, Any] | None = None, *, request_id: int | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Yield (notification method, params) as they arrive, then ("result", result).

        ``request_id`` (from ``reserve_id``) lets the caller cancel before the first item arrives.
        """
        self._check_open()
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        rid = request_id if request_id is not None else next(self._ids)
        self._streams[rid] = queue
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        assert self._writer is not None
        self._writer.write(encode(Request(rid, method, params or {})))
        await self._writer.drain()
        self.last_request_id = rid
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, fut}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                while not queue.empty():
                    yield queue.get_nowait()
                yield ("result", fut.result())
                return
        finally:
            self._streams.pop(rid, None)

    async def cancel(self, rid: int) -> bool:
        result = await self.call("cancel", {"id": rid})
        return bool(result["cancelled"])
