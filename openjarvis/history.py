"""The per-user history database: conversations and their messages, and one telemetry row per
request. One SQLite file (``$XDG_DATA_HOME/openjarvis/history.db``) in WAL mode, so a crash loses
at most the request in flight; schema changes are numbered migrations recorded in a table.

Example::

    with open_history() as db:
        conv = db.new_conversation("/home/me/project", "how does routing work?")
        db.add_message(conv, "user", "how does routing work?")
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjarvis import paths
from openjarvis.errors import JarvisError
from openjarvis.sqlite_retry import retry_locked

#: (version, description, SQL). Append only; never edit a released migration.
MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "conversations and messages",
        """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            workspace TEXT NOT NULL,
            title TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL
        );
        CREATE INDEX conversations_by_workspace ON conversations(workspace, updated);
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            meta TEXT NOT NULL DEFAULT '{}',
            created REAL NOT NULL
        );
        CREATE INDEX messages_by_conversation ON messages(conversation, id);
        """,
    ),
    (
        2,
        "telemetry: one row per request",
        """
        CREATE TABLE requests (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            workspace TEXT NOT NULL,
            method TEXT NOT NULL,
            route TEXT NOT NULL,
            model TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            ttft_s REAL,
            total_s REAL NOT NULL,
            tokens_per_s REAL,
            acceptance REAL,
            energy_j REAL,
            cost_usd REAL NOT NULL DEFAULT 0,
            outcome TEXT NOT NULL
        );
        CREATE INDEX requests_by_time ON requests(time);
        """,
    ),
    (
        3,
        "audit: every request that left the machine (openjarvis.router.audit)",
        """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,              -- unix seconds
        workspace TEXT NOT NULL,
        target TEXT NOT NULL,
        model TEXT NOT NULL,
        host TEXT NOT NULL,
        trigger TEXT NOT NULL,           -- why it left: asked, context, low-confidence, local-failed
        bytes_sent INTEGER NOT NULL,
        redactions TEXT NOT NULL,        -- JSON object: kind -> count
        tokens_in INTEGER NOT NULL,
        tokens_out INTEGER NOT NULL,
        tokens_estimated INTEGER NOT NULL,  -- 1 when the target reported no usage
        cost_usd REAL NOT NULL,
        status TEXT NOT NULL             -- "ok", "cancelled" or the one-line error
    );
    CREATE INDEX audit_time ON audit(time);
        """,
    ),
]


class HistoryError(JarvisError):
    """The history database cannot be opened or migrated."""


@dataclass(frozen=True, slots=True)
class ConversationInfo:
    id: str
    workspace: str
    title: str
    created: float
    updated: float
    messages: int


@dataclass(frozen=True, slots=True)
class StoredMessage:
    role: str
    content: str
    meta: dict[str, Any]
    created: float


def history_path() -> Path:
    return paths.data_dir() / "history.db"


def migrate(conn: sqlite3.Connection) -> int:
    """Apply pending migrations under the database's write lock; returns the schema version.

    ``BEGIN IMMEDIATE`` takes the write lock before reading what is applied, so two processes
    opening a fresh database at once (two daemon requests, the CLI beside the daemon) cannot both
    try to create the same tables: the second waits, then finds nothing left to do.
    """
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, description TEXT, applied REAL)"
    )
    conn.commit()
    latest = max(v for v, _, _ in MIGRATIONS)
    done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    if latest in done and all(v in done for v, _, _ in MIGRATIONS):
        return latest
    conn.execute("BEGIN IMMEDIATE")
    try:
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        for version, description, sql in MIGRATIONS:
            if version in done:
                continue
            for statement in filter(str.strip, sql.split(";")):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, description, time.time()))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return latest


class History:
    """Conversations and telemetry rows; one instance per thread (sqlite3 connections are not shared)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def close(self) -> None:
        self.conn.close()

    def new_conversation(self, workspace: str, title: str) -> str:
        cid = uuid.uuid4().hex[:12]
        now = time.time()
        with self.conn:
            self.conn.execute(
                "INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                (cid, workspace, title.strip()[:80] or "untitled", now, now),
            )
        return cid

    def add_message(self, conversation: str, role: str, content: str, meta: dict[str, Any] | None = None) -> None:
        now = time.time()
        with self.conn:
            cur = self.conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation))
            if cur.rowcount == 0:
                raise HistoryError(f"no conversation {conversation!r}; list them with `jarvis history`")
            self.conn.execute(
                "INSERT INTO messages (conversation, role, content, meta, created) VALUES (?, ?, ?, ?, ?)",
                (conversation, role, content, json.dumps(meta or {}), now),
            )

    def messages(self, conversation: str) -> list[StoredMessage]:
        rows = self.conn.execute(
            "SELECT role, content, meta, created FROM messages WHERE conversation = ? ORDER BY id", (conversation,)
        ).fetchall()
        return [StoredMessage(r[0], r[1], json.loads(r[2]), r[3]) for r in rows]

    def conversation(self, conversation: str) -> ConversationInfo | None:
        rows = self._infos("WHERE c.id = ?", (conversation,))
        return rows[0] if rows else None

    def conversations(self, workspace: str, limit: int = 50) -> list[ConversationInfo]:
        return self._infos("WHERE c.workspace = ? ORDER BY c.updated DESC LIMIT ?", (workspace, limit))

    def _infos(self, where: str, args: tuple[Any, ...]) -> list[ConversationInfo]:
        sql = (
            "SELECT c.id, c.workspace, c.title, c.created, c.updated, "
            "(SELECT COUNT(*) FROM messages m WHERE m.conversation = c.id) FROM conversations c " + where
        )
        return [ConversationInfo(*row) for row in self.conn.execute(sql, args)]

    def record_request(self, **row: Any) -> None:
        """One telemetry row; the columns are those of the ``requests`` table."""
        row.setdefault("time", time.time())
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.conn:
            self.conn.execute(f"INSERT INTO requests ({cols}) VALUES ({marks})", tuple(row.values()))


def connect(path: Path | None = None) -> sqlite3.Connection:
    path = path or history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():  # conversations, workspaces and hosts are nobody else's business
        path.touch(mode=0o600)
    try:
        conn = sqlite3.connect(path, timeout=10, check_same_thread=False)
        retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"))
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")
        retry_locked(lambda: migrate(conn))
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{path}: cannot open the history database ({exc}); move it aside to start afresh") from exc
    return conn


@contextmanager
def open_history(path: Path | None = None) -> Iterator[History]:
    h = History(connect(path))
    try:
        yield h
    finally:
        h.close()
