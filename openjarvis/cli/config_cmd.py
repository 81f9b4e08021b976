"""``jarvis config``: show the effective configuration, where it comes from, and change it."""

from __future__ import annotations

import click

from openjarvis import paths
from openjarvis.cli import CONTEXT_SETTINGS, flag_overrides
from openjarvis.cli.output import emit_json
from openjarvis.config import REPO_FILE, load_config, set_user_value, settings


@click.group(context_settings=CONTEXT_SETTINGS, short_help="Show and change the layered configuration.")
def config() -> None:
    """Show and change configuration (defaults < user file < .jarvis.toml < JARVIS_* < -c flags).

    \b
    Example:
      jarvis config set engine.threads 4 && jarvis config show
    """


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: key -> {value, source, doc}.")
@click.option("--doc", "with_doc", is_flag=True, help="Also print each key's explanation.")
@click.pass_context
def show(ctx: click.Context, as_json: bool, with_doc: bool) -> None:
    """Print every setting's effective value and which layer set it.

    \b
    Example:
      JARVIS_ENGINE_THREADS=2 jarvis config show
    """
    cfg = load_config(overrides=flag_overrides(ctx))
    docs = settings()
    if as_json:
        emit_json({k: {"value": v, "source": s, "doc": docs[k].doc} for k, v, s in cfg.items()})
        return
    width = max(len(k) for k, _, _ in cfg.items())
    vwidth = max(len(repr(v)) for _, v, _ in cfg.items())
    for key, value, source in cfg.items():
        click.echo(f"{key:<{width}}  {value!r:<{vwidth}}  # {source}")
        if with_doc:
            click.echo(f"{'':<{width}}  {docs[key].doc} ({docs[key].describe_type()})")


@config.command("path")
def path() -> None:
    """Print the configuration files that are read, in precedence order, and whether they exist.

    \b
    Example:
      jarvis config path
    """
    user = paths.user_config_file()
    click.echo(f"user file: {user}{'' if user.is_file() else '  (absent)'}")
    root = paths.find_workspace_root()
    if root is None:
        click.echo(f"repo file: none (not inside a repository; would be <repo>/{REPO_FILE})")
    else:
        repo = root / REPO_FILE
        click.echo(f"repo file: {repo}{'' if repo.is_file() else '  (absent)'}")


@config.command("set")
@click.argument("key", metavar="SECTION.KEY")
@click.argument("value")
def set_(key: str, value: str) -> None:
    """Validate VALUE and write it to the user file, keeping the file's comments.

    \b
    Example:
      jarvis config set router.cloud ask
    """
    written = set_user_value(key, value)
    click.echo(f"{key} = {load_config().get(key)!r} written to {written}")


@config.command("keys")
def keys() -> None:
    """List every key with its type, default and explanation.

    \b
    Example:
      jarvis config keys | grep engine
    """
    for key, s in settings().items():
        click.echo(f"{key}  ({s.describe_type()}, default {s.default!r})\n    {s.doc}")
