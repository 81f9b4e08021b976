"""The audit table in history.db and `jarvis audit`, as a person reads them."""

from __future__ import annotations

import json
import sqlite3
import stat
from contextlib import closing
from datetime import datetime, timedelta

import pytest

from openjarvis import history, paths
from openjarvis.cli import main
from openjarvis.router.audit import AuditLog, AuditRecord, start_of_local_day

NOW = datetime.now().astimezone()


@pytest.fixture(autouse=True)
def _now_at_the_test() -> None:
    """``NOW`` taken as each test starts: taken once at collection, a local midnight between the
    two (the suite runs for minutes) put "today's" records in yesterday."""
    global NOW
    NOW = datetime.now().astimezone()


def record(ago: timedelta = timedelta(0), **kw: object) -> AuditRecord:
    fields: dict[str, object] = {
        "time": (NOW - ago).timestamp(),
        "workspace": str(paths.find_workspace_root() or "/src/app"),
        "target": "openai",
        "model": "gpt-4o-mini",
        "host": "api.openai.com",
        "bytes_sent": 5120,
        "redactions": {"openai_key": 1, "high_entropy": 2},
        "tokens_in": 1200,
        "tokens_out": 300,
        "cost_usd": 0.0125,
        "trigger": "asked",
        **kw,
    }
    return AuditRecord(**fields)  # type: ignore[arg-type]


def test_rows_round_trip_in_a_private_wal_database() -> None:
    log = AuditLog()
    first, second = record(timedelta(minutes=5)), record(status="target 'openai' failed (503); try again later")
    log.write(first)
    log.write(second)
    assert log.path == paths.data_dir() / "history.db"
    assert log.records() == [first, second]
    assert log.records(limit=1) == [second]
    assert log.records(since=second.time) == [second]
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600
    with closing(sqlite3.connect(log.path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        description = conn.execute("SELECT description FROM schema_migrations WHERE version = 3").fetchone()[0]
        assert description.startswith("audit:")


def test_it_shares_the_history_database_with_conversations() -> None:
    with history.open_history() as db:
        conv = db.new_conversation("/src/app", "why")
    log = AuditLog()
    log.write(record())
    with history.open_history() as db:
        assert db.conversation(conv) is not None
    assert len(log.records()) == 1


def test_spent_today_counts_since_local_midnight_failed_requests_included() -> None:
    log = AuditLog()
    midnight = start_of_local_day(NOW)
    log.write(record(time=midnight - 1, cost_usd=5.0))  # yesterday
    log.write(record(time=midnight + 1, cost_usd=0.25))
    log.write(record(time=midnight + 2, cost_usd=0.5, status="cut off"))
    assert log.spent_today(NOW) == pytest.approx(0.75)
    assert log.spent_since(midnight - 10) == pytest.approx(5.75)
    assert AuditLog(log.path.with_name("absent.db")).spent_today() == 0.0


def test_jarvis_audit_with_nothing_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit"]) == 0
    assert capsys.readouterr().out == (
        "no request has left this machine; requests leave only where your policy allows (router.cloud = never)\n"
    )


def test_jarvis_audit_table_and_footer(capsys: pytest.CaptureFixture[str]) -> None:
    log = AuditLog()
    log.write(record(timedelta(days=3), cost_usd=1.0))
    log.write(record(tokens_estimated=True, redactions={}))
    assert main(["audit"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "time",
        "workspace",
        "target",
        "model",
        "sent",
        "redacted",
        "tokens",
        "in/out",
        "cost",
        "status",
    ]
    assert "openai (api.openai.com)" in lines[1] and "3 (high_entropy 2, openai_key 1)" in lines[1]
    assert "1200/300" in lines[1] and "$1.0000" in lines[1]
    assert "~1200/~300" in lines[2] and " 0 " in lines[2]
    assert lines[-1] == (
        "2 requests, 10.2 KB sent, $1.0125; today $0.0125 of the $1.00 daily cap (router.daily_spend_cap_usd)"
    )


def test_jarvis_audit_since_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    log = AuditLog()
    log.write(record(timedelta(days=3), target="old"))
    log.write(record(timedelta(hours=1), target="new"))
    assert main(["audit", "--since", "1d", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["target"] for r in data["requests"]] == ["new"]
    row = data["requests"][0]
    assert row["redactions"] == {"high_entropy": 2, "openai_key": 1}
    assert datetime.fromisoformat(row["time"]).timestamp() == pytest.approx(
        (NOW - timedelta(hours=1)).timestamp(), abs=1
    )
    assert data["spent_today_usd"] == pytest.approx(log.spent_today())
    assert data["daily_spend_cap_usd"] == 1.0 and data["database"] == str(log.path)
    assert main(["audit", "--since", (NOW - timedelta(days=5)).date().isoformat(), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["requests"]) == 2


def test_jarvis_audit_rejects_a_bad_since(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--since", "last tuesday"]) == 2
    assert "'last tuesday' is neither a duration (30m, 24h, 7d, 2w) nor a date (2026-11-30)" in capsys.readouterr().err
