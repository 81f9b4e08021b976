"""A request cancelled while its worker thread runs: dropped with nothing kept, or, once the work
has committed (a conversation turn being written), answered with its result.

The daemon-level tests (test_assist.py) cancel a chat mid-stream and before it starts; the
moment between "the answer is complete" and "the turn is saved" is too short to hit from a
client, so here the worker is held at that moment by hand.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from openjarvis.daemon.assist import Cancellation, in_thread


def _held_worker(commit_first: bool) -> tuple[Any, threading.Event, threading.Event, list[bool]]:
    """A worker that stops at the commit point until the test lets it go on."""
    reached, go_on = threading.Event(), threading.Event()
    committed: list[bool] = []

    def work(cancelled: Cancellation, notify: Any) -> str:
        if commit_first:
            committed.append(cancelled.commit())
            reached.set()
            go_on.wait(5)
        else:
            reached.set()
            go_on.wait(5)
            committed.append(cancelled.commit())
        return "turn kept" if committed[0] else "dropped"

    return work, reached, go_on, committed


def _run(commit_first: bool) -> tuple[str | None, bool, list[bool]]:
    work, reached, go_on, committed = _held_worker(commit_first)

    async def scenario() -> tuple[str | None, bool]:
        task = asyncio.create_task(in_thread(SimpleNamespace(id=1), work))  # type: ignore[arg-type]
        await asyncio.to_thread(reached.wait, 5)
        task.cancel()  # what the daemon does on `cancel`
        await asyncio.sleep(0.05)
        go_on.set()
        try:
            return await task, False
        except asyncio.CancelledError:
            return None, True

    result, was_cancelled = asyncio.run(scenario())
    return result, was_cancelled, committed


def test_a_cancel_after_the_commit_point_gets_the_kept_result() -> None:
    result, was_cancelled, committed = _run(commit_first=True)
    assert committed == [True]
    assert not was_cancelled and result == "turn kept"


def test_a_cancel_before_the_commit_point_drops_the_work() -> None:
    result, was_cancelled, committed = _run(commit_first=False)
    assert committed == [False]  # the worker learns it must keep nothing
    assert was_cancelled and result is None


def test_commit_and_cancel_decide_once() -> None:
    c = Cancellation()
    assert not c()
    assert c.commit() is True
    assert c.cancel() is True and not c()  # committed work is not cancelled afterwards
    d = Cancellation()
    assert d.cancel() is False and d()
    assert d.commit() is False


@pytest.mark.parametrize("commit_first", [True, False])
def test_the_worker_is_never_left_running(commit_first: bool) -> None:
    # in_thread returns (or raises) only after the worker has finished
    work, reached, go_on, committed = _held_worker(commit_first)
    finished = threading.Event()

    def tracked(cancelled: Cancellation, notify: Any) -> str:
        try:
            return work(cancelled, notify)  # type: ignore[no-any-return]
        finally:
            finished.set()

    async def scenario() -> bool:
        task = asyncio.create_task(in_thread(SimpleNamespace(id=1), tracked))  # type: ignore[arg-type]
        await asyncio.to_thread(reached.wait, 5)
        task.cancel()
        await asyncio.sleep(0.05)
        go_on.set()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return finished.is_set()

    assert asyncio.run(scenario())
