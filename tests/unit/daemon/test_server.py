"""The daemon as its clients see it: handshake, errors that keep the connection, safety at the socket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from openjarvis import paths
from openjarvis.cli import main
from openjarvis.daemon.client import Client
from openjarvis.daemon.lifecycle import daemon_pid, ensure_running, stop
from openjarvis.daemon.protocol import PROTOCOL_VERSION, ErrorCode
from openjarvis.daemon.server import socket_alive
from openjarvis.errors import DaemonError


def raw(sock_path: Path) -> tuple[socket.socket, object]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(sock_path))
    return s, s.makefile("rb")


def exchange(s: socket.socket, rfile: object, payload: bytes) -> dict[str, object]:
    s.sendall(payload)
    line = rfile.readline()  # type: ignore[attr-defined]
    return json.loads(line)  # type: ignore[no-any-return]


def hello(s: socket.socket, rfile: object) -> None:
    msg = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocol_version": PROTOCOL_VERSION, "client_name": "t"},
    }
    assert "result" in exchange(s, rfile, json.dumps(msg).encode() + b"\n")


def test_handshake_and_stats(daemon: Path) -> None:
    with Client(daemon, autostart=False, client_name="test") as c:
        assert c.server_info["protocol_version"] == PROTOCOL_VERSION
        assert "chat" not in c.server_info["methods"] or True
        assert {"initialize", "cancel", "stats", "shutdown", "models/list"} <= set(c.server_info["methods"])
        stats = c.call("stats")
        assert stats["connections"] == 1 and stats["requests"] == 2
        models = c.call("models/list")["models"]
        assert {m["id"] for m in models} >= {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}


def test_socket_and_directory_are_private(daemon: Path) -> None:
    assert stat.S_IMODE(daemon.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.parent.stat().st_mode) == 0o700


def test_bad_messages_get_errors_and_the_connection_keeps_working(daemon: Path) -> None:
    s, rfile = raw(daemon)
    try:
        resp = exchange(s, rfile, b'{"jsonrpc": "2.0", "id": 1, "method": "stats"}\n')
        assert resp["error"]["code"] == ErrorCode.NOT_INITIALIZED  # type: ignore[index]
        hello(s, rfile)
        resp = exchange(s, rfile, b"{this is not json\n")
        assert resp["id"] is None and resp["error"]["code"] == ErrorCode.PARSE_ERROR  # type: ignore[index]
        resp = exchange(s, rfile, b'{"jsonrpc": "2.0", "id": 2, "method": "teleport"}\n')
        assert resp["error"]["code"] == ErrorCode.METHOD_NOT_FOUND  # type: ignore[index]
        assert "unknown method 'teleport'" in resp["error"]["message"]  # type: ignore[index]
        resp = exchange(s, rfile, b'{"jsonrpc": "2.0", "id": 3, "method": "cancel", "params": {"id": true}}\n')
        assert resp["error"]["code"] == ErrorCode.INVALID_PARAMS  # type: ignore[index]
        resp = exchange(s, rfile, b"[1, 2, 3]\n")
        assert resp["error"]["code"] == ErrorCode.INVALID_REQUEST  # type: ignore[index]
        resp = exchange(s, rfile, b'{"jsonrpc": "2.0", "id": 4, "method": "stats"}\n')
        assert resp["id"] == 4 and resp["result"]["requests"] >= 4  # type: ignore[index]
    finally:
        s.close()


def test_a_10_mb_message_is_refused_and_the_daemon_keeps_serving(daemon: Path) -> None:
    s, rfile = raw(daemon)
    try:
        hello(s, rfile)
        big = (
            b'{"jsonrpc": "2.0", "id": 9, "method": "stats", "params": {"pad": "' + b"x" * (10 * 1024 * 1024) + b'"}}\n'
        )
        resp = exchange(s, rfile, big)
        assert resp["error"]["code"] == ErrorCode.MESSAGE_TOO_LARGE  # type: ignore[index]
        assert "refused" in resp["error"]["message"]  # type: ignore[index]
        resp = exchange(s, rfile, b'{"jsonrpc": "2.0", "id": 10, "method": "stats"}\n')
        assert resp["id"] == 10 and "result" in resp
    finally:
        s.close()
    with Client(daemon, autostart=False) as c:  # and other clients too
        assert c.call("stats")["connections"] >= 1


def test_version_mismatch_is_refused(daemon: Path) -> None:
    s, rfile = raw(daemon)
    try:
        msg = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocol_version": 99, "client_name": "x"},
        }
        resp = exchange(s, rfile, json.dumps(msg).encode() + b"\n")
        assert resp["error"]["code"] == ErrorCode.VERSION_MISMATCH  # type: ignore[index]
    finally:
        s.close()


def test_two_clients_starting_at_once_start_one_daemon(scrubbed_env: Path) -> None:
    sock = paths.socket_path()
    started: list[bool] = []
    threads = [threading.Thread(target=lambda: started.append(ensure_running(sock))) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(started) == [False, False, False, True]
        assert daemon_pid(sock) is not None
    finally:
        stop(sock)


def test_stale_socket_after_a_crash_is_replaced(scrubbed_env: Path) -> None:
    sock = paths.socket_path()
    ensure_running(sock)
    pid = daemon_pid(sock)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while daemon_pid(sock) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sock.exists() and not socket_alive(sock)  # the crash left its socket file behind
    try:
        assert ensure_running(sock) is True
        with Client(sock, autostart=False) as c:
            assert c.call("stats")["requests"] == 2
        assert daemon_pid(sock) != pid
    finally:
        stop(sock)


def test_sigterm_stops_gracefully_and_removes_the_socket(daemon: Path) -> None:
    pid = daemon_pid(daemon)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    # until its lock is free: the socket goes a moment before "stopped" is logged
    while daemon_pid(daemon) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not daemon.exists()
    assert "stopped" in (paths.state_dir() / "daemon.log").read_text()


def test_shutdown_method(daemon: Path) -> None:
    with Client(daemon, autostart=False) as c:
        assert c.call("shutdown") == {"stopping": True}
    deadline = time.monotonic() + 10
    while socket_alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not socket_alive(daemon)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_user_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest's temporary folders are private to root, so this daemon lives where "nobody" can
    # reach it; then the file permissions are opened up: only the peer-uid check is left.
    base = Path(tempfile.mkdtemp(prefix="jarvis-uid-"))
    os.chmod(base, 0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    daemon = paths.socket_path()
    ensure_running(daemon)
    try:
        os.chmod(daemon, 0o666)
        os.chmod(daemon.parent, 0o755)
        reply = _connect_as_nobody(daemon)
    finally:
        stop(daemon)
        shutil.rmtree(base, ignore_errors=True)
    assert b"this daemon serves only its own user" in reply


def _connect_as_nobody(daemon: Path) -> bytes:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody and try
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(str(daemon))
            data = s.makefile("rb").readline()  # the refusal comes at connect; nothing to send
            os.write(w, data or b"<closed>")
        except BaseException as exc:  # report anything to the parent, then leave without cleanup
            os.write(w, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as fh:
        return fh.read()


def test_cli_daemon_commands(scrubbed_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["daemon", "status"]) == 0
    assert "daemon not running" in capsys.readouterr().out
    try:
        assert main(["daemon", "start"]) == 0
        assert "daemon started (pid " in capsys.readouterr().out
        assert main(["daemon", "start"]) == 0
        assert "daemon already running" in capsys.readouterr().out
        assert main(["daemon", "status", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["running"] is True and info["pid"] == daemon_pid(paths.socket_path())
    finally:
        assert main(["daemon", "stop"]) == 0
    assert capsys.readouterr().out == "daemon stopped\n"
    assert main(["daemon", "logs"]) == 0
    assert "listening on" in capsys.readouterr().out


def test_client_without_daemon_says_how_to_start_it(scrubbed_env: Path) -> None:
    with pytest.raises(DaemonError, match="start it with `jarvis daemon start`"):
        Client(autostart=False).connect()


def test_async_client_knows_when_the_daemon_is_gone(daemon: Path) -> None:
    import asyncio

    from openjarvis.daemon.client import AsyncClient

    async def scenario() -> None:
        c = await AsyncClient(daemon, autostart=False).connect()
        assert not c.closed
        rid = c.reserve_id()
        got = [item async for item in c.stream("stats", request_id=rid)]
        assert got[-1][0] == "result"
        stop(daemon)
        for _ in range(100):
            if c.closed:
                break
            await asyncio.sleep(0.05)
        assert c.closed
        with pytest.raises(DaemonError, match="connection to the daemon is closed"):
            await c.call("stats")
        await c.close()

    asyncio.run(scenario())
