"""``jarvis tui`` (and bare ``jarvis`` in a terminal): the Textual TUI, a client of the daemon."""

from __future__ import annotations

from pathlib import Path

import click

from openjarvis import paths
from openjarvis.cli import CONTEXT_SETTINGS, flag_overrides


def run_tui(ctx: click.Context, workspace: Path | None = None) -> None:
    """Open the TUI on ``workspace`` (default: the repository around here)."""
    from openjarvis.config import load_config
    from openjarvis.tui.app import make_app

    found = workspace or paths.find_workspace_root()
    root = (found or Path.cwd()).resolve()
    config = load_config(cwd=root, overrides=flag_overrides(ctx))
    # Outside a repository (say, in ~) nothing is indexed until the person asks something.
    make_app(config, root, index_on_start=found is not None).run()


@click.command(context_settings=CONTEXT_SETTINGS, short_help="Open the terminal UI (also bare `jarvis`).")
@click.option("-C", "--workspace", type=click.Path(file_okay=False, path_type=Path), help="Repository (default: here).")
@click.pass_context
def tui(ctx: click.Context, workspace: Path | None) -> None:
    """Open the Jarvis terminal UI on the repository you are in.

    Ask questions and watch answers stream, search the index, review and apply edits hunk by
    hunk, resume earlier conversations. Running `jarvis` with no command in a terminal does the
    same. Keys: Enter sends, Ctrl+J breaks the line, Esc cancels an answer, Ctrl+P lists every
    action, /help lists the slash commands.

    \b
    Example:
      jarvis tui -C ~/src/app
    """
    run_tui(ctx, workspace)
