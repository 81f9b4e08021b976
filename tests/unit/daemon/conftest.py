"""A real daemon process per test, in the test's private home, talked to over its real socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from openjarvis import paths
from openjarvis.daemon.lifecycle import ensure_running, stop


@pytest.fixture
def daemon(scrubbed_env: Path) -> Iterator[Path]:
    """Start ``jarvis daemon run`` in the background; yields its socket path; stops it after."""
    sock = paths.socket_path()
    assert ensure_running(sock) is True
    try:
        yield sock
    finally:
        stop(sock)
