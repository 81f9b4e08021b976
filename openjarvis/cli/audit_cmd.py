"""``jarvis audit``: every request that left this machine, from the router's audit table."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import click

from openjarvis.cli import CONTEXT_SETTINGS, flag_overrides
from openjarvis.cli.output import emit_json, human_bytes
from openjarvis.config import load_config
from openjarvis.router.audit import AuditLog, AuditRecord

_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """``30m``, ``24h``, ``7d``, ``2w`` ago, or an ISO date/time in local time, as unix seconds."""
    now = time.time() if now is None else now
    m = re.fullmatch(r"\s*(\d+)\s*([mhdw])\s*", text)
    if m:
        return now - int(m.group(1)) * _UNITS[m.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).astimezone().timestamp()
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration (30m, 24h, 7d, 2w) nor a date (2026-11-30)", param_hint="--since"
        ) from None


def _redactions(r: AuditRecord) -> str:
    total = sum(r.redactions.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} {n}" for k, n in r.redactions.items() if n) + ")"


def _short_path(path: str) -> str:
    home = str(Path.home())
    return "~" + path[len(home) :] if path == home or path.startswith(home + "/") else path


@click.command(context_settings=CONTEXT_SETTINGS, short_help="Show every request that left this machine.")
@click.option("--since", metavar="WHEN", help="Only requests since WHEN: 30m, 24h, 7d, 2w, or a date like 2026-11-30.")
@click.option("--limit", default=50, show_default=True, help="Show the most recent N requests (0 = all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def audit(ctx: click.Context, since: str | None, limit: int, as_json: bool) -> None:
    """Show every request the router sent off this machine, oldest first.

    Each row: when, from which workspace, to which target, model and host, the bytes sent, the
    secrets redacted before sending (by kind), tokens in/out (~ marks an estimate where the target
    reported none), the cost, and how it ended. A footer compares today's spend with
    router.daily_spend_cap_usd. Rows live in $XDG_DATA_HOME/openjarvis/history.db.

    \b
    Example:
      jarvis audit --since 7d
    """
    config = load_config(overrides=flag_overrides(ctx))
    log = AuditLog()
    start = parse_since(since) if since else None
    records = log.records(since=start, limit=limit or None)
    spent = log.spent_today()
    cap = config.router.daily_spend_cap_usd
    if as_json:
        emit_json(
            {
                "requests": [r.to_json() for r in records],
                "spent_today_usd": spent,
                "daily_spend_cap_usd": cap,
                "database": str(log.path),
            }
        )
        return
    if not records:
        when = f" since {since}" if since else ""
        click.echo(
            f"no request has left this machine{when}; "
            f"requests leave only where your policy allows (router.cloud = {config.router.cloud})"
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("time", "workspace", "target", "model", "sent", "redacted", "tokens in/out", "cost", "status"):
        table.add_column(col, no_wrap=col != "status")
    for r in records:
        approx = "~" if r.tokens_estimated else ""
        table.add_row(
            datetime.fromtimestamp(r.time).strftime("%Y-%m-%d %H:%M:%S"),
            _short_path(r.workspace) or "-",
            f"{r.target} ({r.host})",
            r.model,
            human_bytes(r.bytes_sent),
            _redactions(r),
            f"{approx}{r.tokens_in}/{approx}{r.tokens_out}",
            f"${r.cost_usd:.4f}",
            r.status,
        )
    console = Console()
    if not console.is_terminal:
        console.width = 240  # pipes and logs: never wrap paths or hosts
    console.print(table)
    sent = sum(r.bytes_sent for r in records)
    cost = sum(r.cost_usd for r in records)
    console.print(
        f"{len(records)} requests, {human_bytes(sent)} sent, ${cost:.4f}; "
        f"today ${spent:.4f} of the ${cap:.2f} daily cap (router.daily_spend_cap_usd)",
        highlight=False,
    )
