"""The ``jarvis`` command: a click group whose subcommands live one concept per module.

Subcommands are registered by name in ``COMMANDS`` and imported only when used (or when
``--help`` lists them), so ``jarvis --help`` stays instant. Each subcommand module keeps heavy
imports (llama.cpp, torch, tree-sitter) inside its functions.

Errors: any ``JarvisError`` becomes one line on stderr and its exit code; nothing else is caught
here, so a bug still shows its traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import click

from openjarvis import __version__
from openjarvis.errors import JarvisError

#: name -> "module:attribute" of a click command or group; one line per subcommand.
COMMANDS: dict[str, str] = {
    "ask": "openjarvis.cli.ask_cmd:ask",
    "audit": "openjarvis.cli.audit_cmd:audit",
    "config": "openjarvis.cli.config_cmd:config",
    "daemon": "openjarvis.cli.daemon_cmd:daemon",
    "doctor": "openjarvis.cli.doctor:doctor",
    "generate": "openjarvis.cli.generate_cmd:generate",
    "history": "openjarvis.cli.history_cmd:history",
    "locate": "openjarvis.cli.doctor:locate",
    "models": "openjarvis.cli.models_cmd:models",
    "serve": "openjarvis.cli.serve_cmd:serve",
    "def": "openjarvis.cli.index_cmd:def_",
    "index": "openjarvis.cli.index_cmd:index",
    "map": "openjarvis.cli.index_cmd:repo_map",
    "refs": "openjarvis.cli.index_cmd:refs",
    "search": "openjarvis.cli.index_cmd:search",
    "tui": "openjarvis.cli.tui_cmd:tui",
}

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand is needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module_name, attr = COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``-c section.key=value`` flags into a dict; a malformed flag is a usage error."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or "." not in key:
            raise click.BadParameter(f"expected SECTION.KEY=VALUE, got {pair!r}", param_hint="-c")
        overrides[key.strip()] = value
    return overrides


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS, invoke_without_command=True)
@click.version_option(__version__, "-V", "--version", prog_name="jarvis")
@click.option(
    "-c",
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one configuration value for this run (highest precedence). Repeatable.",
)
@click.pass_context
def cli(ctx: click.Context, overrides: tuple[str, ...]) -> None:
    """Open Jarvis: a local-first coding assistant that runs on your own machine.

    \b
    Examples:
      jarvis doctor                     # what a bug report needs
      jarvis models install --default   # assemble and verify the default model pair
      jarvis -c engine.threads=2 doctor # one-off configuration override
    """
    ctx.ensure_object(dict)
    ctx.obj["overrides"] = parse_overrides(overrides)
    if ctx.invoked_subcommand is None:
        if sys.stdin.isatty() and sys.stdout.isatty():  # bare `jarvis` in a terminal: the TUI (issue 6)
            from openjarvis.cli.tui_cmd import run_tui

            run_tui(ctx)
        else:
            click.echo(ctx.get_help())


def flag_overrides(ctx: click.Context) -> dict[str, str]:
    """The ``-c`` overrides given to the root command, for subcommands that load config."""
    root = ctx.find_root()
    obj = root.obj or {}
    return dict(obj.get("overrides", {}))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; tests call this with an argv list."""
    try:
        rc = cli.main(args=list(argv) if argv is not None else None, prog_name="jarvis", standalone_mode=False)
    except JarvisError as exc:
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return rc if isinstance(rc, int) else 0  # ctx.exit(N) inside a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
