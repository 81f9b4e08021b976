"""Starting, finding and stopping the one daemon per user.

``run_foreground`` is the daemon process itself (``jarvis daemon run``): logging to a rotating
file in the XDG state dir, an instance lock so two daemons never serve one socket. ``ensure_running``
is what every client calls: under a start lock (so two clients starting at once start one
daemon), it spawns ``python -m openjarvis daemon run`` in its own session and waits for the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import logging.handlers
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from openjarvis import __version__, paths
from openjarvis.errors import DaemonError

log = logging.getLogger("openjarvis.daemon")

START_TIMEOUT_S = 30.0
LOG_BYTES = 2 * 1024 * 1024
LOG_BACKUPS = 3


def log_file() -> Path:
    return paths.state_dir() / "daemon.log"


def lock_file(socket_path: Path) -> Path:
    return socket_path.with_name(socket_path.name + ".lock")


def setup_logging(to_stderr: bool = False) -> None:
    path = log_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler: logging.Handler = logging.handlers.RotatingFileHandler(path, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(fmt)
    root = logging.getLogger("openjarvis")
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    if to_stderr:
        err = logging.StreamHandler()
        err.setFormatter(fmt)
        root.addHandler(err)


def run_foreground(socket_path: Path | None = None) -> int:
    """Serve until stopped; returns the exit code. Refuses to run twice for one socket."""
    from openjarvis.daemon.handlers import METHODS
    from openjarvis.daemon.server import Daemon, InstanceLock

    socket_path = (socket_path or paths.socket_path()).absolute()
    os.chdir("/")  # hold no client's directory open (it may be unmounted or deleted)
    setup_logging()
    lock = InstanceLock(lock_file(socket_path))
    if not lock.acquire():
        raise DaemonError(f"a daemon already serves {socket_path}; `jarvis daemon status` shows it")
    try:
        daemon = Daemon(socket_path, METHODS, version=__version__)
        asyncio.run(daemon.serve())
    finally:
        lock.release()
    return 0


@contextlib.contextmanager
def _start_lock(socket_path: Path) -> Iterator[None]:
    socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(socket_path.with_name("start.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def daemon_pid(socket_path: Path) -> int | None:
    """The pid written in the instance lock by a running daemon, if any holds it."""
    path = lock_file(socket_path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = path.read_text().strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # nobody holds it: no daemon
    finally:
        os.close(fd)


def ensure_running(socket_path: Path | None = None, *, timeout: float = START_TIMEOUT_S) -> bool:
    """Start the daemon unless one answers; True when this call started it."""
    from openjarvis.daemon.server import socket_alive

    socket_path = socket_path or paths.socket_path()
    if socket_alive(socket_path):
        return False
    with _start_lock(socket_path):
        if socket_alive(socket_path):
            return False  # another client started it while we waited for the lock
        out = paths.state_dir() / "daemon.out"
        out.parent.mkdir(parents=True, exist_ok=True)
        # posix_spawn rather than Popen: the daemon outlives this process by design, in its own
        # session, and no Popen object is left to warn that its child is still running.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-m", "openjarvis", "daemon", "run", "--socket", str(socket_path)],
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(out), flags, 0o600),
                (os.POSIX_SPAWN_OPEN, 2, str(out), flags, 0o600),
            ],
            setsid=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if socket_alive(socket_path, timeout=0.2):
                return True
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                raise DaemonError(f"the daemon exited at start (code {code}); see {out} and {log_file()}")
            time.sleep(0.02)
        raise DaemonError(f"the daemon did not open {socket_path} within {timeout:.0f} s; see {log_file()}")


def stop(socket_path: Path | None = None, *, timeout: float = 15.0) -> bool:
    """Ask the daemon to stop (SIGTERM: graceful), wait for it; False when none was running."""
    socket_path = socket_path or paths.socket_path()
    pid = daemon_pid(socket_path)
    if pid is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon_pid(socket_path) is None:
            return True
        time.sleep(0.05)
    raise DaemonError(f"daemon pid {pid} did not stop within {timeout:.0f} s; `kill -9 {pid}` if it is stuck")
