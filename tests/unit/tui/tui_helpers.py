"""Helpers for the TUI tests; the tiny model daemon (``tiny_daemon``) comes from tests/conftest.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot


async def wait_for(pilot: Pilot[Any], predicate: Callable[[], object], timeout: float = 60.0) -> None:
    """Let the app run until ``predicate()`` is true; fail with the app's notifications if it never is."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            notes = [n.message for n in pilot.app._notifications]
            raise AssertionError(f"timed out after {timeout}s; notifications: {notes}")
        await pilot.pause(0.05)
    await asyncio.sleep(0)


async def send(pilot: Pilot[Any], text: str) -> None:
    """Type ``text`` into the prompt as a paste would, then press Enter."""
    from openjarvis.tui.widgets.prompt import PromptInput

    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    prompt.load_text(text)
    await pilot.press("enter")
