"""``jarvis history``: the conversations held for the current repository, and one of them whole."""

from __future__ import annotations

import time
from pathlib import Path

import click

from openjarvis import paths
from openjarvis.cli import CONTEXT_SETTINGS
from openjarvis.cli.output import emit_json


@click.command(context_settings=CONTEXT_SETTINGS, short_help="List or show this repository's conversations.")
@click.argument("conversation", required=False, metavar="[ID]")
@click.option("-C", "--workspace", type=click.Path(file_okay=False, path_type=Path), help="Repository (default: here).")
@click.option("-n", "--limit", default=20, show_default=True, help="How many conversations to list.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def history(conversation: str | None, workspace: Path | None, limit: int, as_json: bool) -> None:
    """List the conversations of this repository, newest first, or print one whole.

    Continue one with `jarvis ask --conversation ID "..."` (or `--continue` for the latest).

    \b
    Example:
      jarvis history && jarvis history 3f2a9c1b7d2e
    """
    from openjarvis.daemon.client import Client

    root = (workspace or paths.find_workspace_root() or Path.cwd()).resolve()
    with Client(client_name="jarvis-history") as client:
        if conversation:
            conv = client.call("conversations/get", {"id": conversation})
            if as_json:
                emit_json(conv)
                return
            click.echo(f"# {conv['title']}  ({conv['id']}, {conv['workspace']})")
            for m in conv["messages"]:
                click.echo(f"\n## {m['role']}\n\n{m['content']}")
            return
        rows = client.call("conversations/list", {"workspace": str(root), "limit": limit})["conversations"]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f'no conversations yet in {root}; start one with `jarvis ask "..."`')
        return
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["updated"]))
        click.echo(f"{r['id']}  {when}  {r['messages']:3d} messages  {r['title']}")
