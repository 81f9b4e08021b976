"""The history database: rows a person's resumed conversation depends on, and its migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from openjarvis.history import HistoryError, history_path, migrate, open_history


def test_conversation_round_trip_and_listing() -> None:
    with open_history() as db:
        a = db.new_conversation("/ws", "first question")
        db.add_message(a, "user", "first question")
        db.add_message(a, "assistant", "an answer", {"route": "local", "sources": ["x.py"]})
        b = db.new_conversation("/ws", "second")
        db.new_conversation("/other", "elsewhere")
    with open_history() as db:  # reopened: it persisted
        msgs = db.messages(a)
        assert [(m.role, m.content) for m in msgs] == [("user", "first question"), ("assistant", "an answer")]
        assert msgs[1].meta == {"route": "local", "sources": ["x.py"]}
        listed = db.conversations("/ws")
        assert [c.id for c in listed] == [b, a] and listed[1].messages == 2
        assert db.conversation("nope") is None
        with pytest.raises(HistoryError, match="no conversation 'nope'"):
            db.add_message("nope", "user", "x")


def test_wal_mode_and_migrations_are_recorded_once() -> None:
    with open_history() as db:
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn = sqlite3.connect(history_path())
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [1, 2, 3]
    assert migrate(conn) == 3  # idempotent
    assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations")] == [1, 2, 3]
    conn.close()


def test_telemetry_row() -> None:
    with open_history() as db:
        db.record_request(
            workspace="/ws",
            method="chat",
            route="local",
            model="qwen2.5-coder-1.5b",
            prompt_tokens=100,
            completion_tokens=20,
            ttft_s=0.3,
            total_s=1.2,
            tokens_per_s=22.0,
            acceptance=0.6,
            outcome="ok",
        )
        row = db.conn.execute("SELECT method, route, completion_tokens, outcome FROM requests").fetchone()
    assert row == ("chat", "local", 20, "ok")


def test_a_corrupt_database_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "history.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(HistoryError, match="cannot open the history database .* move it aside"):
        with open_history(bad):
            pass


def test_processes_opening_a_fresh_database_at_once_do_not_collide(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def open_and_write(_: int) -> None:
        with open_history(tmp_path / "fresh.db") as db:
            db.new_conversation("/ws", "x")

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(open_and_write, range(6)))  # re-raises the first failure here
    with open_history(tmp_path / "fresh.db") as db:
        assert len(db.conversations("/ws")) == 6
