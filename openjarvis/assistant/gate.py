"""One generation at a time per model, in priority order, with yielding at step boundaries.

A CPU engine runs one sequence at a time, so requests queue; ``PriorityGate`` serves the most
urgent waiter first (an editor's inline ``complete`` before a ``chat``, both before background
work) and lets the holder ask, between two decoding steps, whether someone more urgent is
waiting, so a long chat answer can pause, let the completion through, and resume.

Example::

    with gate.hold(CHAT) as slot:
        for piece in generation:
            if slot.should_yield():
                slot.pause()   # returns once the urgent work is done and the gate is ours again
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Priorities: lower is more urgent.
COMPLETE = 0
CHAT = 1
BACKGROUND = 2


class Slot:
    """The holder's view of the gate while it holds it."""

    def __init__(self, gate: PriorityGate, priority: int) -> None:
        self.gate = gate
        self.priority = priority
        self.pauses = 0

    def should_yield(self) -> bool:
        return self.gate.urgent_waiting(self.priority)

    def pause(self) -> None:
        self.pauses += 1
        self.gate._release()
        self.gate._acquire(self.priority)


class PriorityGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._waiting: dict[int, int] = {}  # ticket -> priority
        self._tickets = itertools.count()

    def _acquire(self, priority: int) -> None:
        with self._cond:
            ticket = next(self._tickets)
            self._waiting[ticket] = priority
            # FIFO within a priority: the lowest (priority, ticket) goes first.
            while self._held or min(self._waiting.items(), key=lambda kv: (kv[1], kv[0]))[0] != ticket:
                self._cond.wait()
            del self._waiting[ticket]
            self._held = True

    def _release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def urgent_waiting(self, priority: int) -> bool:
        with self._cond:
            return any(p < priority for p in self._waiting.values())

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._held

    @property
    def waiting(self) -> int:
        """How many holders are queued behind the one that holds the gate."""
        with self._cond:
            return len(self._waiting)

    @contextmanager
    def hold(self, priority: int) -> Iterator[Slot]:
        self._acquire(priority)
        try:
            yield Slot(self, priority)
        finally:
            self._release()
