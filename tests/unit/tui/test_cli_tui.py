"""`jarvis` with no command: the TUI in a terminal, the help in a pipe; `jarvis tui` exists."""

from __future__ import annotations

import pytest

from openjarvis.cli import main


def test_bare_jarvis_in_a_pipe_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0  # pytest's stdin and stdout are not terminals
    out = capsys.readouterr().out
    assert out.startswith("Usage: jarvis") and "tui" in out


def test_jarvis_tui_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tui", "--help"]) == 0
    assert "jarvis tui -C" in capsys.readouterr().out
