"""The TUI as a person uses it: bare `jarvis` in a real terminal (tmux), keys typed, the screen read.

Skipped, saying so, where tmux is not installed (`apt-get install -y tmux`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")


class Terminal:
    """One tmux session on a private server socket, 80x24, running ``command`` in ``cwd``."""

    def __init__(self, command: str, cwd: Path) -> None:
        self.server = f"jarvis-test-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env["TERM"] = "xterm-256color"
        self._tmux("new-session", "-d", "-x", "80", "-y", "24", "-c", str(cwd), command, env=env)

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.server, "-f", "/dev/null", *args],
            capture_output=True, text=True, env=env, timeout=30, check=True,
        )  # fmt: skip
        return out.stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "0", *keys)

    def text(self, chars: str) -> None:
        self._tmux("send-keys", "-t", "0", "-l", chars)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "0")

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"screen never matched within {timeout}s:\n{screen}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.server, "has-session"], capture_output=True).returncode == 0

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True)


@pytest.fixture
def terminal(tiny_daemon: Path) -> Iterator[Terminal]:
    # Bare `jarvis` (python -m openjarvis) with a terminal on stdin and stdout opens the TUI;
    # "; sleep" keeps the pane (and what is printed on exit) readable after the app quits.
    (tiny_daemon / ".git").mkdir()  # a repository, as where a person runs `jarvis`
    term = Terminal(f"{sys.executable} -m openjarvis; echo JARVIS-EXIT=$?; sleep 30", tiny_daemon)
    try:
        yield term
    finally:
        term.close()


def test_a_person_asks_searches_and_quits_in_a_real_terminal(terminal: Terminal) -> None:
    screen = terminal.wait_for(lambda s: "index: 2 files" in s and "^p" in s)
    assert "Ask about repo" in screen and "esc Cancel" in screen  # the footer shows the keys
    terminal.text("/se")
    screen = terminal.wait_for(lambda s: "/search QUERY" in s)  # completion offers the command
    terminal.keys("Tab")
    terminal.text("http response")
    terminal.keys("Enter")
    # The hit and its code, highlighted in the preview:
    terminal.wait_for(lambda s: "Search: http response" in s and "app/http.py" in s and "def parse_http_re" in s)
    terminal.text("What does Router do?")
    terminal.keys("Enter")
    screen = terminal.wait_for(lambda s: "tok/s" in s and "Sources" in s)
    assert "What does Router do?" in screen and "● local" in screen and "tiny-v" in screen
    terminal.keys("C-q")
    screen = terminal.wait_for(lambda s: "JARVIS-EXIT=" in s)
    assert "JARVIS-EXIT=0" in screen and "Traceback" not in screen


def test_outside_a_repository_nothing_is_indexed_until_asked(tiny_daemon: Path) -> None:
    term = Terminal(f"{sys.executable} -m openjarvis", tiny_daemon)  # no .git: not a repository
    try:
        screen = term.wait_for(lambda s: "not indexed" in s)
        time.sleep(1.0)
        assert "not indexed" in term.screen() and "index: 2 files" not in screen
        term.keys("C-q")
    finally:
        term.close()
