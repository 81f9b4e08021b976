"""The daemon's workspaces: each repository it serves, with its index and its watcher.

A workspace is indexed on first use (progress streamed to the client that asked), then a watchdog
``Watcher`` keeps it fresh while the daemon runs. Indexing runs in a worker thread and never
holds the event loop; two requests for the same workspace share one indexing run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openjarvis.config import Config
from openjarvis.daemon.protocol import ErrorCode, ProtocolError

log = logging.getLogger("openjarvis.daemon")


@dataclass
class Workspace:
    root: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    indexing: bool = False
    #: (files done, files to do) of the run in progress, for clients that did not start it.
    progress: tuple[int, int] = (0, 0)
    watcher: Any = None
    last_summary: Any = None

    @property
    def indexed(self) -> bool:
        """True once a full indexing run has completed (it is recorded in the index itself)."""
        from openjarvis.errors import IndexStoreError
        from openjarvis.index.store import db_path_for, open_readonly

        if not db_path_for(self.root).is_file():
            return False
        try:
            store = open_readonly(self.root)
        except IndexStoreError:
            return False
        try:
            return store.get_meta("last_run") is not None
        finally:
            store.close()


class Workspaces:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._by_root: dict[Path, Workspace] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> Workspace:
        root = Path(path).expanduser()
        if not root.is_absolute():
            raise ProtocolError(ErrorCode.WORKSPACE_ERROR, f"workspace must be an absolute path, got {path!r}")
        root = root.resolve()
        if not root.is_dir():
            raise ProtocolError(ErrorCode.WORKSPACE_ERROR, f"workspace {root} is not a directory")
        with self._lock:
            ws = self._by_root.get(root)
            if ws is None:
                ws = self._by_root[root] = Workspace(root)
            return ws

    @property
    def roots(self) -> list[str]:
        return [str(r) for r in self._by_root]

    def index(self, ws: Workspace, on_progress: Callable[[int, int], None] | None = None) -> Any:
        """Bring the index up to date now (blocking; call from a worker thread), then watch."""
        from openjarvis.index.indexer import index_workspace, lower_priority
        from openjarvis.index.store import Store, db_path_for

        with ws.lock:
            ws.indexing = True

            def progress(p: Any) -> None:
                ws.progress = (p.done, p.total)
                if on_progress is not None:
                    on_progress(p.done, p.total)

            def run() -> None:
                lower_priority(thread=True)  # a thread of its own: it is never made less nice
                with Store.open(db_path_for(ws.root)) as store:
                    ws.last_summary = index_workspace(store, ws.root, self.config.index, on_progress=progress)

            try:
                with ThreadPoolExecutor(1, thread_name_prefix=f"index {ws.root.name}") as pool:
                    pool.submit(run).result()  # re-raises here what the thread raised
            finally:
                ws.indexing = False
                ws.progress = (0, 0)
            self._watch(ws)
            return ws.last_summary

    def ensure_indexed(self, ws: Workspace, on_progress: Callable[[int, int], None] | None = None) -> None:
        """Index on first use; afterwards the watcher keeps it fresh (a start-up catch-up pass too)."""
        if ws.watcher is not None:
            return
        self.index(ws, on_progress)

    def _watch(self, ws: Workspace) -> None:
        if ws.watcher is not None:
            return
        from openjarvis.index.watch import Watcher

        try:
            ws.watcher = Watcher(ws.root, self.config.index).start()
        except OSError as exc:  # inotify limits and the like: searchable, just not live
            log.warning("cannot watch %s (%s); the index refreshes on each request instead", ws.root, exc)

    def close(self) -> None:
        for ws in self._by_root.values():
            if ws.watcher is not None:
                ws.watcher.stop()
                ws.watcher = None
