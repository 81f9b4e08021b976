"""Keep a workspace's index fresh: a watchdog observer feeding changed paths to the indexer.

Events are batched: a batch is flushed once the tree has been quiet for ``quiet_s`` or the first
event in it is ``max_delay_s`` old, whichever comes first, so an editor's atomic save (write a
temporary file, rename it over the original) is one update and a ``git checkout`` touching a
thousand files is a handful. A batch of files is indexed by path; directory moves and deletes,
edits to ignore files and very large batches run an incremental pass over the whole tree (which
only reads what changed). Graph ranks are refreshed once the tree has been idle for ``rank_idle_s``.
This is the one I/O loop of the index: one thread, one database connection.

Example::

    with Watcher(root, IndexConfig()) as watcher:
        ...  # saves under root become searchable within a few hundred milliseconds
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from openjarvis.config import IndexConfig
from openjarvis.index.files import BUILD_DIRS, CACHE_DIRS, DEPENDENCY_DIRS, VCS_DIRS, VENV_DIRS
from openjarvis.index.indexer import RunSummary, index_workspace, lower_priority, refresh_ranks
from openjarvis.index.store import Store, db_path_for

QUIET_S = 0.03
MAX_DELAY_S = 0.12
RANK_IDLE_S = 2.0
#: A batch with more paths than this runs a whole-tree incremental pass instead.
FULL_PASS_PATHS = 500
_IGNORE_FILES = (".gitignore", ".jarvisignore")
_SKIPPED_DIRS = VCS_DIRS | CACHE_DIRS | DEPENDENCY_DIRS | VENV_DIRS | BUILD_DIRS


class Watcher:
    """Watches ``root`` and applies its changes to the index at ``db_path`` (default location)."""

    def __init__(
        self,
        root: Path,
        config: IndexConfig,
        *,
        db_path: Path | None = None,
        on_update: Callable[[RunSummary], None] | None = None,
        quiet_s: float = QUIET_S,
        max_delay_s: float = MAX_DELAY_S,
        rank_idle_s: float = RANK_IDLE_S,
    ) -> None:
        self.root = root.resolve()
        self.config = config
        self.db_path = db_path or db_path_for(self.root)
        self.on_update = on_update
        self.quiet_s, self.max_delay_s, self.rank_idle_s = quiet_s, max_delay_s, rank_idle_s
        self._cond = threading.Condition()
        self._paths: set[str] = set()
        self._full = False
        self._first_at = 0.0
        self._last_at = 0.0
        self._stop = False
        self._ranks_stale = False
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self.errors: list[str] = []

    # --- events (watchdog's thread) -------------------------------------------------------------

    def _rel(self, raw: str | bytes) -> str | None:
        path = raw.decode() if isinstance(raw, bytes) else raw
        try:
            rel = Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return None
        # Built-in skips are dropped here already: an `npm install` or a build must not turn
        # into thousands of paths to judge one by one.
        if rel == "." or any(part in _SKIPPED_DIRS for part in rel.split("/")[:-1]):
            return None
        return rel

    def dispatch(self, event: Any) -> None:
        """Record one watchdog event (the observer calls this; tests may too)."""
        full = bool(event.is_directory and event.event_type in ("moved", "deleted"))
        paths = []
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            rel = self._rel(raw) if raw else None
            if rel is None:
                continue
            if rel.rsplit("/", 1)[-1] in _IGNORE_FILES:
                full = True
            if not event.is_directory:
                paths.append(rel)
        if not paths and not full:
            return
        with self._cond:
            now = time.monotonic()
            if not self._paths and not self._full:
                self._first_at = now
            self._last_at = now
            self._paths.update(paths)
            self._full = self._full or full
            self._cond.notify()

    # --- the update loop (this object's thread) -------------------------------------------------

    def _take_batch(self) -> tuple[set[str], bool] | None:
        """Wait for a batch to be due; None when stopping. Returns (paths, full pass)."""
        with self._cond:
            while True:
                if self._stop:
                    return None
                pending = bool(self._paths) or self._full
                now = time.monotonic()
                if pending:
                    due = min(self._last_at + self.quiet_s, self._first_at + self.max_delay_s)
                    if now >= due:
                        batch = (self._paths, self._full)
                        self._paths, self._full = set(), False
                        return batch
                    self._cond.wait(due - now)
                else:
                    timeout = self.rank_idle_s if self._ranks_stale else None
                    notified = self._cond.wait(timeout)
                    if not notified and self._ranks_stale and not self._stop:
                        return set(), False

    def _run(self) -> None:
        lower_priority(thread=True)  # catch-up and full passes yield to answering, as the first index does
        with Store.open(self.db_path) as store:
            while (batch := self._take_batch()) is not None:
                paths, full = batch
                try:
                    if not paths and not full:
                        refresh_ranks(store)
                        self._ranks_stale = False
                        continue
                    only = None if full or len(paths) > FULL_PASS_PATHS else paths
                    summary = index_workspace(store, self.root, self.config, only=only, update_ranks=False)
                except Exception as exc:  # the loop must survive one bad batch; report and go on
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                self._ranks_stale = self._ranks_stale or summary.changed
                if self.on_update is not None:
                    self.on_update(summary)

    def start(self) -> Watcher:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in ("created", "modified", "moved", "deleted"):
                    watcher.dispatch(event)

        Store.open(self.db_path).close()  # create and migrate before the first event
        self._thread = threading.Thread(target=self._run, name="jarvis-index-watch", daemon=True)
        self._thread.start()
        self._observer = Observer()
        self._observer.schedule(Handler(), str(self.root), recursive=True)
        self._observer.start()
        return self

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> Watcher:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
