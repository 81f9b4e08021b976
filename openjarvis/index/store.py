"""The per-workspace index database: SQLite in WAL mode, opened through sqlite-utils.

Writes are transactional per batch of files: a file's old rows and its new ones change in the same
transaction as its ``files`` row (whose hash says the rows are current), so a crash or Ctrl-C
leaves every file either fully old or fully new, and the next run redoes only what is missing.
Hot paths (batch inserts, FTS queries) use the connection directly; sqlite-utils opens the
database, sets WAL, and serves introspection and the small tables.

Example::

    with Store.open(db_path_for(root)) as store:
        store.known_files()["app.py"].hash
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from openjarvis import paths
from openjarvis.errors import IndexCorrupt, IndexNotBuilt, IndexStoreError
from openjarvis.index import schema
from openjarvis.index.tags import Extraction, search_words, split_identifier
from openjarvis.sqlite_retry import retry_locked


def db_path_for(root: Path) -> Path:
    """Where the index of the workspace at ``root`` lives: the user cache, keyed by the path."""
    resolved = str(root.resolve())
    key = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return paths.cache_dir() / "index" / f"{Path(resolved).name or 'root'}-{key}" / "index.db"


@dataclass(frozen=True, slots=True)
class FileState:
    id: int
    size: int
    mtime_ns: int
    hash: str


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A processed file as the rows to write, built in a worker by ``from_extraction``.

    Plain tuples rather than ``Tag`` objects: they cross the process boundary several times
    faster, and the single writer only has to insert them.
    """

    path: str
    size: int
    mtime_ns: int
    hash: str
    language: str  # "binary" for content with NUL bytes: no rows besides the file's
    lines: int = 0
    error: str | None = None
    #: (name, qualname, kind, line, end_line, signature, doc)
    symbols: tuple[tuple[str, str, str, int, int, str, str], ...] = ()
    #: (name, strongest kind, count, "line:kind,line:kind,...")
    refs: tuple[tuple[str, str, int, str], ...] = ()
    #: (start_line, end_line, symbol, kind, text, split words)
    chunks: tuple[tuple[int, int, str, str, str, str], ...] = ()

    @classmethod
    def from_extraction(
        cls, path: str, size: int, mtime_ns: int, digest: str, ex: Extraction | None
    ) -> FileRecord:
        if ex is None:
            return cls(path, size, mtime_ns, digest, "binary")
        symbols = tuple(
            (t.name, t.qualname, t.kind, t.line, t.end_line, t.signature, t.doc) for t in ex.tags if t.role == "def"
        )
        chunks = tuple(
            (c.start_line, c.end_line, c.symbol, c.kind, c.text, search_words(c.symbol + "\n" + c.text))
            for c in ex.chunks
        )
        return cls(path, size, mtime_ns, digest, ex.language, ex.lines, ex.error, symbols, _grouped_refs(ex), chunks)


class Store:
    """One open index database. Not thread-safe: use one per thread (WAL allows many readers)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        import sqlite_utils

        self.conn = conn
        self.path = path
        self.db = sqlite_utils.Database(conn)
        self._ranks: tuple[tuple[int, int], dict[int, float]] | None = None

    @classmethod
    def open(cls, path: Path, *, create: bool = True, tracer: Callable[[str], None] | None = None) -> Store:
        """Open (and migrate) the database at ``path``; without ``create`` it must exist.

        ``tracer`` receives every SQL statement run on the connection (``sqlite3``'s trace
        callback, so the hot paths that bypass sqlite-utils are seen too): for debugging and tests.
        """
        if not create and not path.is_file():
            raise IndexNotBuilt(f"no index at {path.parent}; run `jarvis index` in the workspace first")
        conn: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
            if tracer is not None:
                conn.set_trace_callback(tracer)
            wal = conn  # bound for the retried call (mypy: conn is Optional here)
            retry_locked(lambda: wal.execute("PRAGMA journal_mode = WAL"))
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = OFF")
            schema.migrate(conn, str(path))
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                fix = "rebuild it with `jarvis index --rebuild`"
                raise IndexCorrupt(f"cannot open index {path}: {exc}; {fix}") from exc
            if isinstance(exc, OSError):
                raise IndexStoreError(f"cannot create index at {path}: {exc.strerror}") from exc
            raise
        return cls(conn, path)

    @staticmethod
    def remove(path: Path) -> None:
        """Delete the database at ``path`` with its WAL and shared-memory files."""
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``; any exception (Ctrl-C included) rolls back."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise IndexStoreError(f"index {self.path} is locked or read-only: {exc}") from exc
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # --- writes --------------------------------------------------------------------------------

    def known_files(self) -> dict[str, FileState]:
        rows = self.conn.execute("SELECT path, id, size, mtime_ns, hash FROM files")
        return {path: FileState(fid, size, mtime, digest) for path, fid, size, mtime, digest in rows}

    def write_files(self, records: Sequence[FileRecord]) -> None:
        """Replace the rows of each file with its new extraction, all in one transaction."""
        with self.transaction() as conn:
            for record in records:
                self._write_one(conn, record)

    def _write_one(self, conn: sqlite3.Connection, record: FileRecord) -> None:
        row = conn.execute("SELECT id FROM files WHERE path = ?", (record.path,)).fetchone()
        values = (record.language, record.size, record.mtime_ns, record.hash, record.lines, record.error)
        if row is None:
            fid = conn.execute(
                "INSERT INTO files (language, size, mtime_ns, hash, lines, error, path) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*values, record.path),
            ).lastrowid
        else:
            fid = row[0]
            _delete_rows(conn, [fid])
            conn.execute(
                "UPDATE files SET language = ?, size = ?, mtime_ns = ?, hash = ?, lines = ?, error = ? WHERE id = ?",
                (*values, fid),
            )
        if record.language == "binary":
            return
        path_words = _path_words(record.path)
        words_all = dict.fromkeys(w for chunk in record.chunks for w in chunk[5].split())
        conn.execute(
            "INSERT INTO files_fts (rowid, path, text, words) VALUES (?, ?, ?, ?)",
            (fid, path_words, "\n".join(chunk[4] for chunk in record.chunks), " ".join(words_all)),
        )
        conn.executemany(
            "INSERT INTO symbols (file_id, name, qualname, kind, line, end_line, signature, doc) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(fid, *sym) for sym in record.symbols],
        )
        conn.executemany(
            "INSERT INTO refs (file_id, name, kind, count, lines) VALUES (?, ?, ?, ?, ?)",
            [(fid, *ref) for ref in record.refs],
        )
        first = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM chunks").fetchone()[0]
        ids = range(first, first + len(record.chunks))
        conn.executemany(
            "INSERT INTO chunks (id, file_id, start_line, end_line, symbol, kind) VALUES (?, ?, ?, ?, ?, ?)",
            [(cid, fid, c[0], c[1], c[2], c[3]) for cid, c in zip(ids, record.chunks, strict=True)],
        )
        conn.executemany(
            "INSERT INTO chunks_fts (rowid, path, symbol, text, words) VALUES (?, ?, ?, ?, ?)",
            [(cid, path_words, _symbol_words(c[2]), c[4], c[5]) for cid, c in zip(ids, record.chunks, strict=True)],
        )
        conn.executemany(
            "INSERT INTO names_fts (rowid, symbol) VALUES (?, ?)",
            [(cid, _symbol_words(c[2])) for cid, c in zip(ids, record.chunks, strict=True) if c[2]],
        )

    def touch(self, updates: Iterable[tuple[str, int, int]]) -> None:
        """Record new (path, size, mtime_ns) for files whose content hash did not change."""
        with self.transaction() as conn:
            conn.executemany(
                "UPDATE files SET size = ?, mtime_ns = ? WHERE path = ?",
                [(size, mtime, path) for path, size, mtime in updates],
            )

    def delete_paths(self, file_paths: Iterable[str]) -> int:
        """Remove every row of these files; returns how many were indexed."""
        wanted = list(file_paths)
        if not wanted:
            return 0
        with self.transaction() as conn:
            ids = []
            for path in wanted:
                row = conn.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
                if row:
                    ids.append(row[0])
            _delete_rows(conn, ids)
            conn.executemany("DELETE FROM files WHERE id = ?", [(i,) for i in ids])
        return len(ids)

    def set_ranks(self, ranks: dict[int, float]) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE files SET rank = 0")
            conn.executemany("UPDATE files SET rank = ? WHERE id = ?", [(r, i) for i, r in ranks.items()])

    def set_meta(self, values: dict[str, Any]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [(k, json.dumps(v)) for k, v in values.items()],
            )

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # --- reads ---------------------------------------------------------------------------------

    def file_ranks(self) -> dict[int, float]:
        """Every file's stored PageRank, normalised to [0, 1]; cached until the database changes."""
        from openjarvis.index.rank import normalise

        version = (self.conn.execute("PRAGMA data_version").fetchone()[0], self.conn.total_changes)
        if self._ranks is None or self._ranks[0] != version:
            rows = self.conn.execute("SELECT id, rank FROM files WHERE rank > 0").fetchall()
            self._ranks = (version, normalise(dict(rows)))
        return self._ranks[1]

    def counts(self) -> dict[str, int]:
        return {name: self.db[name].count for name in ("files", "symbols", "refs", "chunks")}

    def graph_rows(self) -> tuple[list[tuple[int, str]], list[tuple[int, str, int]]]:
        """(file_id, name) of definitions and (file_id, name, count) of references."""
        defs = self.conn.execute(
            "SELECT DISTINCT file_id, name FROM symbols WHERE kind NOT IN ('variable', 'field')"
        ).fetchall()
        refs = self.conn.execute(
            "SELECT file_id, name, count FROM refs WHERE kind != 'module'"
        ).fetchall()
        return defs, refs


_REF_STRENGTH = {"call": 0, "import": 1, "type": 2, "use": 3, "module": 4}


def _grouped_refs(ex: Extraction) -> tuple[tuple[str, str, int, str], ...]:
    """One (name, strongest kind, count, "line:kind,...") per referenced name, lines in order."""
    by_name: dict[str, dict[int, str]] = {}
    for t in ex.tags:
        if t.role != "ref":
            continue
        lines = by_name.setdefault(t.name, {})
        if _REF_STRENGTH.get(t.kind, 9) < _REF_STRENGTH.get(lines.get(t.line, ""), 9):
            lines[t.line] = t.kind
    out = []
    for name, lines in by_name.items():
        kind = min(lines.values(), key=lambda k: _REF_STRENGTH.get(k, 9))
        out.append((name, kind, len(lines), ",".join(f"{n}:{lines[n]}" for n in sorted(lines))))
    return tuple(out)


def _delete_rows(conn: sqlite3.Connection, file_ids: Sequence[int]) -> None:
    for fid in file_ids:
        conn.execute(
            "DELETE FROM chunks_fts WHERE rowid IN (SELECT id FROM chunks WHERE file_id = ?)", (fid,)
        )
        conn.execute("DELETE FROM files_fts WHERE rowid = ?", (fid,))
        conn.execute("DELETE FROM names_fts WHERE rowid IN (SELECT id FROM chunks WHERE file_id = ?)", (fid,))
        for table in ("chunks", "symbols", "refs"):
            conn.execute(f"DELETE FROM {table} WHERE file_id = ?", (fid,))


def _symbol_words(symbol: str) -> str:
    """``QuerySet.get_or_create`` -> ``QuerySet.get_or_create query set get or create``."""
    return f"{symbol} {' '.join(split_identifier(symbol))}" if symbol else ""


def _path_words(path: str) -> str:
    """A path as words for FTS: ``django/db/models/query.py`` -> ``django db models query py``."""
    return " ".join(w for w in path.replace("/", " ").replace(".", " ").replace("-", " ").split())


def open_readonly(root: Path) -> Store:
    """Open the index of ``root`` for queries; raises ``IndexNotBuilt`` when there is none."""
    path = db_path_for(root)
    if not path.is_file():
        raise IndexNotBuilt(f"{root} has no index yet; run `jarvis index {root}` first")
    return Store.open(path, create=False)


__all__ = ["FileRecord", "FileState", "Store", "db_path_for", "open_readonly"]
