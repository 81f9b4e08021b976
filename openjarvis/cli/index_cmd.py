"""``jarvis index``, ``index status``, ``search``, ``map``, ``def`` and ``refs``: the codebase index.

Each command works on the workspace of the current directory (the nearest folder with ``.git``
or ``.jarvis.toml``, else the current directory itself) or the one given with ``--workspace``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from openjarvis import paths
from openjarvis.cli import flag_overrides
from openjarvis.config import IndexConfig, load_config
from openjarvis.errors import IndexCorrupt, IndexPathError

_WORKSPACE = click.option(
    "-w",
    "--workspace",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Workspace root (default: the one enclosing the current directory).",
)


def _root(workspace: Path | None) -> Path:
    if workspace is not None:
        if not workspace.is_dir():
            raise IndexPathError(f"workspace {workspace} is not a directory; pass an existing folder")
        return workspace.resolve()
    return paths.find_workspace_root() or Path.cwd().resolve()


class _IndexGroup(click.Group):
    """``jarvis index [PATH]`` builds; ``jarvis index status`` reports. A PATH is not a command."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] [PATH]  |  status [OPTIONS]")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The options shown are those of building (the hidden default command), then `status`.
        build_cmd = self.commands["build"]
        build_cmd.format_options(click.Context(build_cmd, info_name=ctx.info_name, parent=ctx.parent), formatter)
        self.format_commands(ctx, formatter)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, cmd in sorted(self.commands.items()) if not cmd.hidden]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        first = next((a for a in args if not a.startswith("-")), None)
        if not any(a in ("-h", "--help") for a in args) and (first is None or first not in self.commands):
            args = ["build", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_IndexGroup)
def index() -> None:
    """Build or update the index of a workspace (PATH, default: the current one).

    Only files whose content changed are parsed again; rows of deleted files are removed.

    \b
    Examples:
      jarvis index                  # index the current workspace
      jarvis index ~/src/project    # index another folder
      jarvis index --watch          # then keep it fresh as files change
      jarvis index status           # counts, skips by rule, parse errors
    """


@index.command("build", hidden=True)
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--rebuild", is_flag=True, help="Delete the existing index first and index from scratch.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--watch", is_flag=True, help="Then keep the index fresh as files change, until Ctrl-C.")
@click.pass_context
def build(ctx: click.Context, path: Path | None, rebuild: bool, as_json: bool, watch: bool) -> None:
    """Build or update the index of PATH (default: the current workspace).

    \b
    Example:
      jarvis index --rebuild .
      jarvis index --watch
    """
    from openjarvis.index.indexer import Progress, index_workspace
    from openjarvis.index.store import Store, db_path_for

    if path is not None and not path.exists():
        raise IndexPathError(f"{path} does not exist; pass a folder to index")
    if path is not None and not path.is_dir():
        raise IndexPathError(f"{path} is not a directory; pass the folder that contains it")
    root = path.resolve() if path is not None else _root(None)
    config = load_config(cwd=root, overrides=flag_overrides(ctx))
    db_path = db_path_for(root)
    if rebuild:
        Store.remove(db_path)
    try:
        Store.open(db_path).close()
    except IndexCorrupt as exc:
        # The index is a cache: a broken one is rebuilt, with a warning (never silently).
        click.echo(f"warning: {exc}; rebuilding it now", err=True)
        Store.remove(db_path)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    with Store.open(db_path) as store:
        show = not as_json
        bar = Bar(
            TextColumn("indexing"), BarColumn(), MofNCompleteColumn(),
            TextColumn("files"), _rate_column(), TimeRemainingColumn(),
            console=Console(stderr=True), disable=not show or not sys.stderr.isatty(), transient=True,
        )  # fmt: skip
        with bar:
            task = bar.add_task("index", total=None)

            def on_progress(p: Progress) -> None:
                bar.update(task, completed=p.done, total=p.total)

            summary = index_workspace(store, root, config.index, on_progress=on_progress)
    if as_json:
        click.echo(json.dumps({"workspace": str(root), **dataclasses.asdict(summary)}))
        return
    skipped = sum(summary.skipped.values())
    rate = summary.scanned / summary.seconds if summary.seconds else 0.0
    click.echo(
        f"indexed {summary.indexed} files ({summary.lines:,} lines), {summary.unchanged} unchanged, "
        f"{summary.deleted} removed, {skipped} skipped, {summary.errors} with parse errors "
        f"in {summary.seconds:.1f} s ({rate:,.0f} files/s)"
    )
    click.echo(f"index: {db_path}")
    if watch:
        _watch(root, config.index)


def _watch(root: Path, config: IndexConfig) -> None:
    from openjarvis.index.indexer import RunSummary
    from openjarvis.index.watch import Watcher

    def report(summary: RunSummary) -> None:
        if summary.changed:
            click.echo(f"{time.strftime('%H:%M:%S')} updated {summary.indexed}, removed {summary.deleted}")

    click.echo(f"watching {root}; Ctrl-C to stop")
    with Watcher(root, config, on_update=report):
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            click.echo("stopped")


def _rate_column() -> Any:
    """Files per second, for the progress bar."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f}/s" if speed else "", style="progress.data.speed")

    return Rate()


@index.command("status")
@_WORKSPACE
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(workspace: Path | None, as_json: bool) -> None:
    """Counts, languages, skips by rule and parse errors of the workspace's index.

    \b
    Example:
      jarvis index status --json
    """
    from openjarvis.index.store import open_readonly

    root = _root(workspace)
    with open_readonly(root) as store:
        counts = store.counts()
        languages = dict(
            store.conn.execute(
                "SELECT language, count(*) FROM files GROUP BY language ORDER BY count(*) DESC"
            ).fetchall()
        )
        errors = store.conn.execute("SELECT path, error FROM files WHERE error IS NOT NULL ORDER BY path").fetchall()
        skipped: dict[str, int] = store.get_meta("skipped", {})
        last = store.get_meta("last_run")
        info: dict[str, Any] = {
            "workspace": str(root),
            "database": str(store.path),
            "size_bytes": store.path.stat().st_size,
            **counts,
            "languages": languages,
            "skipped": skipped,
            "errors": [{"path": p, "error": e} for p, e in errors],
            "last_run": last,
        }
    if as_json:
        click.echo(json.dumps(info))
        return
    click.echo(f"workspace  {root}")
    click.echo(f"database   {info['database']} ({info['size_bytes'] / 1e6:.1f} MB)")
    click.echo(
        f"files      {counts['files']}  symbols {counts['symbols']}  "
        f"references {counts['refs']}  chunks {counts['chunks']}"
    )
    click.echo("languages  " + ", ".join(f"{k} {v}" for k, v in languages.items()))
    click.echo("skipped    " + (", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "none"))
    if last:
        click.echo(f"last run   {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(last))}")
    click.echo(f"errors     {len(errors)}")
    for path, error in errors[:20]:
        click.echo(f"  {path}: {error}")


@click.command()
@click.argument("query")
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, 200), help="Number of hits.")
@click.option("--focus", multiple=True, help="A file you are working on (repeatable); ranks its neighbours up.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_WORKSPACE
def search(query: str, k: int, focus: tuple[str, ...], as_json: bool, workspace: Path | None) -> None:
    """Hybrid search of the workspace index: full text, symbol names and the reference graph.

    \b
    Example:
      jarvis search "parse http response" -k 5 --json
    """
    from openjarvis.index.search import search as run_search
    from openjarvis.index.store import open_readonly

    root = _root(workspace)
    with open_readonly(root) as store:
        hits = run_search(store, query, k=k, focus=[_rel(root, f) for f in focus])
    for hit in hits:
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(hit)))
        else:
            where = f"{hit.path}:{hit.start_line}-{hit.end_line}"
            click.echo(f"{where}  {hit.symbol or '-'} ({hit.kind})  {hit.score:.4f}")
            for line in hit.snippet.splitlines():
                click.echo(f"    {line}")
    if not hits and not as_json:
        click.echo("no matches", err=True)


@click.command("map")
@click.option("--tokens", default=1024, show_default=True, type=click.IntRange(16), help="Token budget.")
@click.option("--focus", multiple=True, help="A file the model already sees (repeatable).")
@_WORKSPACE
def repo_map(tokens: int, focus: tuple[str, ...], workspace: Path | None) -> None:
    """The repository map: the most relevant signatures, as an outline within a token budget.

    \b
    Example:
      jarvis map --tokens 2048 --focus src/app.py
    """
    from openjarvis.index.search import repo_map as build_map
    from openjarvis.index.store import open_readonly

    root = _root(workspace)
    with open_readonly(root) as store:
        click.echo(build_map(store, tokens, focus=[_rel(root, f) for f in focus]), nl=False)


@click.command("def")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_WORKSPACE
@click.pass_context
def def_(ctx: click.Context, name: str, as_json: bool, workspace: Path | None) -> None:
    """Where NAME (a name or a qualified name like Class.method) is defined.

    \b
    Example:
      jarvis def QuerySet.filter
    """
    from openjarvis.index.search import close_names, definition
    from openjarvis.index.store import open_readonly

    root = _root(workspace)
    with open_readonly(root) as store:
        found = definition(store, name)
        close = close_names(store, name) if not found else []
    if not found:
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        click.echo(f"no definition of {name!r} in the index{hint}", err=True)
        ctx.exit(1)
    for d in found:
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(d)))
        else:
            click.echo(f"{d.path}:{d.line}  {d.qualname} ({d.kind})  {d.signature}")


@click.command("refs")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_WORKSPACE
@click.pass_context
def refs(ctx: click.Context, name: str, as_json: bool, workspace: Path | None) -> None:
    """Where NAME is used: calls, imports, type and identifier uses.

    \b
    Example:
      jarvis refs get_or_create
    """
    from openjarvis.index.search import usages
    from openjarvis.index.store import open_readonly

    root = _root(workspace)
    with open_readonly(root) as store:
        found = usages(store, name, root=root)
    if not found:
        click.echo(f"no references to {name!r} in the index", err=True)
        ctx.exit(1)
    for u in found:
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(u)))
        else:
            click.echo(f"{u.path}:{u.line}  ({u.kind})  {u.text}")


def _rel(root: Path, path: str) -> str:
    p = Path(path)
    full = (Path.cwd() / p).resolve() if not p.is_absolute() else p.resolve()
    try:
        return full.relative_to(root).as_posix()
    except ValueError:
        return p.as_posix()
