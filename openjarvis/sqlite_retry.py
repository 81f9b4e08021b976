"""One SQLite behaviour every database of ours meets: "database is locked" answered at once.

SQLite returns that error without waiting out its busy timeout where waiting could deadlock,
e.g. when several connections switch a fresh file to WAL together (seen in CI with six processes
opening one new history at once, and the same race exists for a new index: the daemon, its
watcher and the CLI open it together). Where the operation holds nothing between attempts,
retrying cannot deadlock.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable


def retry_locked(op: Callable[[], object], seconds: float = 10.0) -> None:
    """Run ``op``, retrying with backoff while SQLite says the database is locked or busy."""
    deadline = time.monotonic() + seconds
    delay = 0.005
    while True:
        try:
            op()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
