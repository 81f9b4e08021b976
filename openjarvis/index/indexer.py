"""A full or incremental indexing run: scan, parse in a process pool, write from one writer.

The store decides freshness: a file whose size and mtime match its row is not read; one whose
bytes hash the same is only touched; only changed content is parsed. Rows of files that are gone
(deleted, renamed, newly ignored) are removed. Workers read and parse; only this process writes,
in batches, each batch one transaction, so an interrupted run leaves a consistent database and
the next run picks up where it stopped.

Example::

    with Store.open(db_path_for(root)) as store:
        summary = index_workspace(store, root, IndexConfig())
        summary.indexed, summary.deleted
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from openjarvis.config import IndexConfig
from openjarvis.errors import IndexStoreError
from openjarvis.index import rank
from openjarvis.index.files import FileEntry, scan_workspace
from openjarvis.index.store import FileRecord, FileState, Store
from openjarvis.index.tags import extract

#: Files written per transaction; bigger batches are faster, smaller lose less on a crash.
WRITE_BATCH = 256
#: Below this many files to read, parse in this process (a pool costs more than it saves).
POOL_MIN_FILES = 48


@dataclass(frozen=True, slots=True)
class Progress:
    """One step of a run, for progress bars: ``done`` of ``total`` files looked at."""

    done: int
    total: int
    path: str


@dataclass(slots=True)
class RunSummary:
    scanned: int = 0
    indexed: int = 0
    unchanged: int = 0
    deleted: int = 0
    errors: int = 0
    lines: int = 0
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.indexed or self.deleted)


@dataclass(frozen=True, slots=True)
class _Job:
    root: str
    path: str
    size: int
    mtime_ns: int
    known_hash: str


@dataclass(frozen=True, slots=True)
class _Result:
    path: str
    status: str  # "indexed", "unchanged", "gone"
    record: FileRecord | None
    size: int
    mtime_ns: int


def process(job: _Job) -> _Result:
    """Read, hash and (if the hash changed) extract one file. Runs in a worker."""
    try:
        with open(os.path.join(job.root, job.path), "rb") as fh:
            data = fh.read()
            st = os.fstat(fh.fileno())
    except OSError:
        return _Result(job.path, "gone", None, job.size, job.mtime_ns)
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    if digest == job.known_hash:
        return _Result(job.path, "unchanged", None, st.st_size, st.st_mtime_ns)
    binary = b"\0" in data[:8192]
    extraction = None if binary else extract(job.path, data)
    record = FileRecord.from_extraction(job.path, st.st_size, st.st_mtime_ns, digest, extraction)
    return _Result(job.path, "indexed", record, st.st_size, st.st_mtime_ns)


#: Parser processes run this much "nicer" than the rest, so indexing yields the CPU to answering
#: (the daemon's generation) and to the person's own work; on an idle machine it costs nothing.
WORKER_NICE = 10


def lower_priority(thread: bool = False) -> None:
    """Run this process (or, with ``thread``, this thread: Linux keeps niceness per thread) at
    ``WORKER_NICE`` or nicer; absolute, so a process forked from an already-nice thread does not
    go nicer still. Best effort: where not permitted, indexing competes as an equal. A thread
    made nicer cannot be made less nice again without privileges: only for threads of its own."""
    try:
        who = threading.get_native_id() if thread else 0
        os.setpriority(os.PRIO_PROCESS, who, max(os.getpriority(os.PRIO_PROCESS, who), WORKER_NICE))
    except (OSError, AttributeError):
        pass


def _worker_init() -> None:
    # Ctrl-C is the parent's to handle: it stops the pool and rolls back the open batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lower_priority()


def _results(jobs: list[_Job], workers: int) -> Iterator[_Result]:
    if workers <= 1 or len(jobs) < POOL_MIN_FILES:
        yield from map(process, jobs)
        return
    # forkserver: workers start from a clean process with the parser preloaded, never a fork of
    # this one (which may hold a watcher's threads and locks); spawn where there is no forkserver.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["openjarvis.index.indexer"])
    # concurrent.futures rather than multiprocessing.Pool: a worker that dies (a crash in a
    # grammar) fails the run with BrokenProcessPool instead of hanging it.
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init)
    try:
        yield from pool.map(process, jobs, chunksize=4)
    except BrokenProcessPool as exc:
        raise IndexStoreError(
            "a parser process died (a crash while parsing one file); the files written so far are "
            "kept: run again with `-c index.workers=1` to see which file it is"
        ) from exc
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def worker_count(config: IndexConfig) -> int:
    return config.workers if config.workers > 0 else max(1, os.cpu_count() or 1)


def index_workspace(
    store: Store,
    root: Path,
    config: IndexConfig,
    *,
    only: Iterable[str] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    update_ranks: bool = True,
) -> RunSummary:
    """Bring the index of ``root`` up to date (only the paths in ``only``, if given)."""
    started = time.perf_counter()
    root = root.resolve()
    only_set = set(only) if only is not None else None
    scan = scan_workspace(root, config.max_file_kb * 1024, only_set)
    known = store.known_files()
    summary = RunSummary(scanned=len(scan.files), skipped=dict(scan.skipped))

    present = {f.path for f in scan.files}
    candidates = set(known) if only_set is None else only_set & set(known)
    summary.deleted = store.delete_paths(sorted(candidates - present))

    jobs = [_job(root, f, known.get(f.path)) for f in scan.files]
    todo = [j for j in jobs if j is not None]
    summary.unchanged = len(scan.files) - len(todo)
    total = len(todo)
    batch: list[FileRecord] = []
    touched: list[tuple[str, int, int]] = []
    for done, result in enumerate(_results(todo, worker_count(config)), 1):
        if result.status == "indexed" and result.record is not None:
            batch.append(result.record)
            summary.indexed += 1
            summary.lines += result.record.lines
            summary.errors += 1 if result.record.error else 0
        elif result.status == "unchanged":
            summary.unchanged += 1
            touched.append((result.path, result.size, result.mtime_ns))
        if len(batch) >= WRITE_BATCH:
            store.write_files(batch)
            batch = []
        if on_progress is not None:
            on_progress(Progress(done, total, result.path))
    if batch:
        store.write_files(batch)
    if touched:
        store.touch(touched)
    if only_set is None:
        store.set_meta({"skipped": summary.skipped, "last_run": time.time()})
    if update_ranks and summary.changed:
        refresh_ranks(store)
    summary.seconds = time.perf_counter() - started
    return summary


def _job(root: Path, entry: FileEntry, state: FileState | None) -> _Job | None:
    # An empty hash marks rows a migration wants rebuilt, whatever the file's stat says.
    if state is not None and state.hash and (state.size, state.mtime_ns) == (entry.size, entry.mtime_ns):
        return None
    return _Job(str(root), entry.path, entry.size, entry.mtime_ns, state.hash if state else "")


def refresh_ranks(store: Store) -> None:
    """Recompute every file's PageRank in the reference graph and store it."""
    defs, refs = store.graph_rows()
    graph = rank.build_graph(defs, refs)
    store.set_ranks(rank.pagerank(graph))
