"""A real HTTP server on 127.0.0.1 that plays an OpenAI-compatible cloud, and a guard on the network.

``FakeCloud`` answers each POST with the next scripted :class:`Reply` (a streamed answer, an
error status, a cut-off stream, invalid JSON, a slow answer...) and records what it received, so
tests assert on the bytes a target really got. It stops when the test ends.

``GUARD`` sees every socket connect and name lookup in the process through a Python audit hook;
while active, any attempt to reach a non-loopback address fails with ``ConnectionRefusedError``
and is recorded (``conftest.py`` switches it on for every router test).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import struct
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: a status, headers, and either SSE events or a whole body."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    events: list[str] | None = None
    body: bytes = b""
    #: Close the connection, mid-body, after sending this many events.
    cut_after: int | None = None
    #: Cut it with a TCP reset rather than an orderly close.
    reset: bool = False
    #: Wait this long before answering (interrupted when the server stops).
    delay_s: float = 0.0
    #: After this many events, stall until the server stops (a target that goes quiet mid-answer).
    stall_after: int | None = None


def chunk(text: str | None = None, finish: str | None = None, usage: tuple[int, int] | None = None) -> str:
    obj: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "fake-model-v1", "choices": []}
    if text is not None or finish is not None:
        delta = {"content": text} if text is not None else {}
        obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return json.dumps(obj)


def stream(*texts: str, usage: tuple[int, int] | None = (42, 7), done: bool = True) -> Reply:
    """A well-formed streamed answer: one chunk per text, a finish chunk, usage, [DONE]."""
    events = [chunk(t) for t in texts] + [chunk(finish="stop")]
    if usage is not None:
        events.append(chunk(usage=usage))
    if done:
        events.append("[DONE]")
    return Reply(headers={"Content-Type": "text/event-stream"}, events=events)


def error(status: int, message: str = "", headers: dict[str, str] | None = None) -> Reply:
    body = json.dumps({"error": {"message": message, "type": "test"}}).encode() if message else b""
    return Reply(status=status, headers={"Content-Type": "application/json", **(headers or {})}, body=body)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class FakeCloud:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with cloud.lock:
                    cloud.received.append(Received(self.path, dict(self.headers.items()), body))
                    reply = cloud.replies.pop(0) if cloud.replies else error(500, "no scripted reply left")
                try:
                    self.answer(reply)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def answer(self, reply: Reply) -> None:
                if reply.delay_s:
                    cloud.stopping.wait(reply.delay_s)
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if reply.events is None:
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, event in enumerate(reply.events):
                    if reply.stall_after is not None and i >= reply.stall_after:
                        cloud.stopping.wait(30)
                        return
                    if reply.cut_after is not None and i >= reply.cut_after:
                        self.wfile.flush()
                        self.close_connection = True
                        if reply.reset:
                            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            self.connection.close()
                        else:
                            self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    data = f"data: {event}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            daemon_threads = False
            block_on_close = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                exc = sys.exc_info()[1]
                if not isinstance(exc, OSError):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        with self.lock:
            self.replies.extend(replies)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class NetGuard:
    """Records (and refuses) every attempt to reach a non-loopback address while active."""

    def __init__(self) -> None:
        self.active = False
        self.expect_attempts = False
        self.attempts: list[tuple[str, str]] = []

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event == "socket.connect":
            address = args[1]
            host = address[0] if isinstance(address, tuple) else None
        elif event == "socket.getaddrinfo":
            host = args[0]
            host = host.decode() if isinstance(host, bytes) else host
        else:
            return
        if host is None or _loopback(str(host)):
            return
        self.attempts.append((event, str(host)))
        raise ConnectionRefusedError(f"test net guard: {event} to non-loopback {host} refused")


def _loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


GUARD = NetGuard()
_installed: list[bool] = []


def activate_guard() -> NetGuard:
    """Switch the guard on, installing its hook on first use (hooks cannot be removed, only idled)."""
    if not _installed:
        sys.addaudithook(GUARD.hook)
        _installed.append(True)
    GUARD.attempts.clear()
    GUARD.expect_attempts = False
    GUARD.active = True
    return GUARD
