"""The index database's schema as numbered migrations, recorded in ``_migrations``.

Each migration runs once, in its own transaction, in order. A database recorded at a version newer
than this code knows is refused (an older Open Jarvis must not write a newer index). To change the
schema, append a migration; never edit one that has shipped.

Tables:

- ``files``: one row per indexed file: path, language, size, mtime, content hash, lines, the
  parse error if any, and ``rank`` (its PageRank in the reference graph, refreshed after runs);
- ``symbols``: definitions (name, qualified name, kind, lines, signature, doc);
- ``refs``: references per (file, name): the strongest kind (call > import > type > use >
  module), the count of lines and ``lines`` as ``"12:call,40:use"`` (one row per name keeps the
  table small);
- ``chunks`` + ``chunks_fts``: searchable runs of lines; the FTS5 row with the same rowid holds
  the path, symbol, text and the ``words`` that split camelCase identifiers;
- ``names_fts``: the symbol (qualified name and its split words) of each chunk that has one;
- ``files_fts``: one full-text row per file (rowid = ``files.id``): path, text, split words;
- ``meta``: key/value facts about the last run (skip counts, timings).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

from openjarvis.errors import IndexStoreError

Migration = Callable[[sqlite3.Connection], None]


def _run(conn: sqlite3.Connection, script: str) -> None:
    # Not executescript(): it commits first, which would break the migration's transaction.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _m001_initial(conn: sqlite3.Connection) -> None:
    _run(
        conn,
        """
        CREATE TABLE files (
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL UNIQUE,
            language TEXT NOT NULL,
            size INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            hash TEXT NOT NULL,
            lines INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            rank REAL NOT NULL DEFAULT 0
        );
        CREATE TABLE symbols (
            id INTEGER PRIMARY KEY,
            file_id INTEGER NOT NULL REFERENCES files(id),
            name TEXT NOT NULL,
            qualname TEXT NOT NULL,
            kind TEXT NOT NULL,
            line INTEGER NOT NULL,
            end_line INTEGER NOT NULL,
            signature TEXT NOT NULL DEFAULT '',
            doc TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX symbols_file ON symbols(file_id);
        CREATE INDEX symbols_name ON symbols(name COLLATE NOCASE);
        CREATE INDEX symbols_qualname ON symbols(qualname COLLATE NOCASE);
        CREATE TABLE refs (
            file_id INTEGER NOT NULL REFERENCES files(id),
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            count INTEGER NOT NULL,
            lines TEXT NOT NULL
        );
        CREATE INDEX refs_file ON refs(file_id);
        CREATE INDEX refs_name ON refs(name);
        CREATE TABLE chunks (
            id INTEGER PRIMARY KEY,
            file_id INTEGER NOT NULL REFERENCES files(id),
            start_line INTEGER NOT NULL,
            end_line INTEGER NOT NULL,
            symbol TEXT NOT NULL DEFAULT '',
            kind TEXT NOT NULL DEFAULT 'text'
        );
        CREATE INDEX chunks_file ON chunks(file_id);
        CREATE VIRTUAL TABLE chunks_fts USING fts5(
            path, symbol, text, words, tokenize = 'porter unicode61 remove_diacritics 2'
        );
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        """
    )


def _m002_files_fts(conn: sqlite3.Connection) -> None:
    # Whole-file documents for the ``file`` signal of search. Existing rows have none yet, so
    # their hashes are cleared: the next run re-reads every file and fills the table.
    _run(
        conn,
        """
        CREATE VIRTUAL TABLE files_fts USING fts5(
            path, text, words, tokenize = 'porter unicode61 remove_diacritics 2'
        );
        UPDATE files SET hash = ''
        """,
    )


def _m003_names_fts(conn: sqlite3.Connection) -> None:
    # A small FTS table over the symbol of each chunk (rowid = chunks.id): the name signal
    # no longer reads the big chunk index. Filled by the next run, as in migration 2.
    _run(
        conn,
        """
        CREATE VIRTUAL TABLE names_fts USING fts5(symbol, tokenize = 'porter unicode61 remove_diacritics 2');
        UPDATE files SET hash = ''
        """,
    )


#: (version, name, function); versions are 1, 2, 3, ... with no gaps.
MIGRATIONS: list[tuple[int, str, Migration]] = [
    (1, "initial", _m001_initial),
    (2, "whole-file full text", _m002_files_fts),
    (3, "symbol names full text", _m003_names_fts),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def current_version(conn: sqlite3.Connection) -> int:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'"
    ).fetchone()
    if not exists:
        return 0
    row = conn.execute("SELECT max(version) FROM _migrations").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection, where: str) -> int:
    """Bring the database up to ``SCHEMA_VERSION``; returns the number of migrations applied.

    ``conn`` must be in autocommit mode (``isolation_level=None``): each migration is wrapped
    in ``BEGIN IMMEDIATE ... COMMIT`` here, so a crash leaves the previous version intact.
    """
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    version = current_version(conn)
    if version > SCHEMA_VERSION:
        raise IndexStoreError(
            f"index {where} has schema version {version}, newer than this Open Jarvis knows "
            f"({SCHEMA_VERSION}); upgrade openjarvis or rebuild with `jarvis index --rebuild`"
        )
    applied = 0
    for number, name, step in MIGRATIONS:
        if number <= version:
            continue
        conn.execute("BEGIN IMMEDIATE")
        if current_version(conn) >= number:  # another connection applied it while we waited
            conn.execute("COMMIT")
            continue
        try:
            step(conn)
            conn.execute(
                "INSERT INTO _migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (number, name, datetime.now(UTC).isoformat(timespec="seconds")),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        applied += 1
    return applied
