"""Streamed text handed on at a bounded rate (a paint per frame, not per token)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Throttle:
    """Collects streamed text and hands the whole text on at most once per ``interval`` seconds.

    Each paint re-renders the answer's last Markdown block, so at hundreds of tokens a second
    painting every token would only queue work; a trailing timer makes sure the last piece is
    painted even when no token follows it.
    """

    def __init__(self, emit: Callable[[str], object], interval: float) -> None:
        self.emit, self.interval = emit, interval
        self.text = ""
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, piece: str) -> None:
        self.text += piece
        loop = asyncio.get_running_loop()
        wait = self._last + self.interval - loop.time()
        if wait <= 0:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(wait, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._last = asyncio.get_running_loop().time()
        self.emit(self.text)

    def close(self) -> None:
        """Stop the trailing timer; the final text comes with the result."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
