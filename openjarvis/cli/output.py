"""Output helpers shared by subcommands: human tables by default, ``--json`` for machines."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from openjarvis.install import Progress


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError("unreachable")


@contextmanager
def byte_progress(label: str) -> Iterator[Progress]:
    """A rich progress bar (bytes, rate, ETA) on stderr; quiet when stderr is not a terminal."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress

    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]{task.fields[label]}[/] {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with RichProgress(*columns, console=console, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("", total=None, label=label)

        def update(n: int, total: int, what: str) -> None:
            bar.update(task, advance=n, total=total, description=what)

        yield update
