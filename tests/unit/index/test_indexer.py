"""How the indexer runs beside answering: its threads and worker processes yield the CPU."""

from __future__ import annotations


def test_lower_priority_is_absolute_and_stays_in_its_own_thread() -> None:
    """Index threads and parser processes run at WORKER_NICE: set, not added (a second call, or a
    process forked from an already-nice thread, does not go nicer still), and only where asked."""
    import os
    import threading

    from openjarvis.index.indexer import WORKER_NICE, lower_priority

    def nice_of_this_thread() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base = nice_of_this_thread()
    seen: list[int] = []

    def index_thread() -> None:
        lower_priority(thread=True)
        lower_priority(thread=True)
        seen.append(nice_of_this_thread())

    t = threading.Thread(target=index_thread)
    t.start()
    t.join()
    assert seen == [max(base, WORKER_NICE)]
    assert nice_of_this_thread() == base  # the caller's thread keeps its priority
