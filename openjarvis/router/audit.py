"""The audit log: one row for every request that left the machine, in the per-user history database.

The cloud client writes a row for each request that sent bytes to a target, whether it ended in
an answer, an error or a cancellation: what went where (workspace, target, model, host), how much
(bytes sent, tokens in and out, cost) and what was taken out first (redaction counts per kind).
``jarvis audit`` prints it; the router's spend cap reads :meth:`AuditLog.spent_today` from it.

The database is ``$XDG_DATA_HOME/openjarvis/history.db`` (shared with conversation history and
telemetry: one per-user database, as DESIGN.md says), opened through ``openjarvis.history.connect``
(WAL mode, so a reader never blocks the daemon's writes and a crash loses at most the row in
flight). Its table is created by the history database's numbered migrations (``history.MIGRATIONS``).

Example::

    log = AuditLog()
    log.write(AuditRecord(time=time.time(), workspace="/src/app", target="openai", model="gpt-4o-mini",
                          host="api.openai.com", bytes_sent=5120, redactions={"openai_key": 1},
                          tokens_in=1200, tokens_out=300, cost_usd=0.0004))
    log.spent_today()   # 0.0004
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from openjarvis import history

#: Status of a row written before the request is sent; it stays if the process dies mid-request.
IN_FLIGHT = "in flight"

_COLUMNS = (
    "time",
    "workspace",
    "target",
    "model",
    "host",
    "trigger",
    "bytes_sent",
    "redactions",
    "tokens_in",
    "tokens_out",
    "tokens_estimated",
    "cost_usd",
    "status",
)


def _values(r: AuditRecord) -> tuple[object, ...]:
    redactions = json.dumps(dict(sorted(r.redactions.items())))
    return (
        r.time,
        r.workspace,
        r.target,
        r.model,
        r.host,
        r.trigger,
        r.bytes_sent,
        redactions,
        r.tokens_in,
        r.tokens_out,
        int(r.tokens_estimated),
        r.cost_usd,
        r.status,
    )


def history_db_path() -> Path:
    """The per-user history database, shared with conversations and telemetry (``openjarvis.history``)."""
    return history.history_path()


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One request that left the machine, as stored and as ``jarvis audit --json`` prints it."""

    time: float
    workspace: str
    target: str
    model: str
    host: str
    bytes_sent: int
    redactions: Mapping[str, int] = field(default_factory=dict)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    status: str = "ok"
    trigger: str = ""
    tokens_estimated: bool = False

    def to_json(self) -> dict[str, object]:
        """A plain dict with ISO-8601 local time, for ``--json`` output."""
        return {
            "time": datetime.fromtimestamp(self.time).astimezone().isoformat(timespec="seconds"),
            "workspace": self.workspace,
            "target": self.target,
            "model": self.model,
            "host": self.host,
            "trigger": self.trigger,
            "bytes_sent": self.bytes_sent,
            "redactions": dict(self.redactions),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_estimated": self.tokens_estimated,
            "cost_usd": self.cost_usd,
            "status": self.status,
        }


def start_of_local_day(now: datetime | None = None) -> float:
    """Unix time of the last local midnight: the spend cap is per calendar day where you are."""
    now = (now or datetime.now()).astimezone()
    return now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


class AuditLog:
    """Reads and writes the audit table; opens a short-lived connection per call (thread-safe)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or history_db_path()

    def _connect(self) -> sqlite3.Connection:
        # WAL, 0600, pragmas and every table's migrations (the audit table's included), in one place.
        return history.connect(self.path)

    def write(self, record: AuditRecord) -> int:
        """Append one row and return its id; committed before returning, so a crash keeps it."""
        with closing(self._connect()) as conn, conn:
            cur = conn.execute(
                f"INSERT INTO audit ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})",
                _values(record),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def update(self, row_id: int, record: AuditRecord) -> None:
        """Replace row ``row_id`` (written as ``IN_FLIGHT`` before sending) with the outcome."""
        with closing(self._connect()) as conn, conn:
            conn.execute(
                f"UPDATE audit SET {', '.join(c + ' = ?' for c in _COLUMNS)} WHERE id = ?",
                (*_values(record), row_id),
            )

    def delete(self, row_id: int) -> None:
        """Drop an in-flight row when, after all, no byte was sent (the connection never opened)."""
        with closing(self._connect()) as conn, conn:
            conn.execute("DELETE FROM audit WHERE id = ?", (row_id,))

    def records(self, since: float | None = None, limit: int | None = None) -> list[AuditRecord]:
        """Rows oldest first; ``since`` in unix seconds; ``limit`` keeps the most recent ones."""
        if not self.path.exists():
            return []
        query = (
            "SELECT time, workspace, target, model, host, bytes_sent, redactions, tokens_in, tokens_out, "
            "cost_usd, status, trigger, tokens_estimated FROM audit WHERE time >= ? ORDER BY time DESC, id DESC"
        )
        args: list[object] = [since if since is not None else float("-inf")]
        if limit:
            query += " LIMIT ?"
            args.append(limit)
        with closing(self._connect()) as conn:
            rows = conn.execute(query, args).fetchall()
        return [
            AuditRecord(
                time=r[0],
                workspace=r[1],
                target=r[2],
                model=r[3],
                host=r[4],
                bytes_sent=r[5],
                redactions=json.loads(r[6]),
                tokens_in=r[7],
                tokens_out=r[8],
                cost_usd=r[9],
                status=r[10],
                trigger=r[11],
                tokens_estimated=bool(r[12]),
            )
            for r in reversed(rows)
        ]

    def spent_since(self, since: float) -> float:
        """US dollars recorded since ``since`` (unix seconds), failed requests included."""
        if not self.path.exists():
            return 0.0
        with closing(self._connect()) as conn:
            (total,) = conn.execute(
                "SELECT COALESCE(SUM(cost_usd), 0.0) FROM audit WHERE time >= ?", (since,)
            ).fetchone()
        return float(total)

    def spent_today(self, now: datetime | None = None) -> float:
        """What the daily spend cap compares against: spend since the last local midnight."""
        return self.spent_since(start_of_local_day(now))
