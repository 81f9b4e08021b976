"""The generation gate: urgent work first, and a long holder pauses for it at a step boundary."""

from __future__ import annotations

import threading
import time

from openjarvis.assistant.gate import BACKGROUND, CHAT, COMPLETE, PriorityGate


def test_waiters_are_served_by_priority_then_arrival() -> None:
    gate = PriorityGate()
    order: list[str] = []
    release = threading.Event()

    def holder() -> None:
        with gate.hold(CHAT):
            release.wait(5)

    def waiter(name: str, priority: int) -> None:
        with gate.hold(priority):
            order.append(name)

    first = threading.Thread(target=holder)
    first.start()
    while not gate.busy:
        time.sleep(0.001)
    threads = []
    for name, prio in (("bg", BACKGROUND), ("chat-a", CHAT), ("complete", COMPLETE), ("chat-b", CHAT)):
        t = threading.Thread(target=waiter, args=(name, prio))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while gate.waiting < len(threads) and time.monotonic() < deadline:  # arrival order: each
            time.sleep(0.001)  # queued before the next starts
        assert gate.waiting == len(threads), f"{name} never queued"
    release.set()
    for t in [first, *threads]:
        t.join(5)
    assert order == ["complete", "chat-a", "chat-b", "bg"]


def test_a_chat_pauses_for_a_completion_and_resumes() -> None:
    gate = PriorityGate()
    events: list[str] = []
    step = threading.Event()

    def chat() -> None:
        with gate.hold(CHAT) as slot:
            for i in range(200):
                events.append(f"chat step {i}")
                if i == 3:
                    step.set()
                if slot.should_yield():
                    events.append("chat pauses")
                    slot.pause()
                    events.append("chat resumes")
                time.sleep(0.002)
                if i >= 6 and slot.pauses:
                    break

    t = threading.Thread(target=chat)
    t.start()
    step.wait(5)
    with gate.hold(COMPLETE):
        events.append("complete runs")
    t.join(5)
    i = events.index("complete runs")
    assert events[i - 1] == "chat pauses" and events[i + 1] == "chat resumes"
    assert events[0] == "chat step 0" and events[-1].startswith("chat step")
