"""``jarvis daemon``: start, stop, inspect the one daemon per user."""

from __future__ import annotations

from pathlib import Path

import click

from openjarvis import paths
from openjarvis.cli import CONTEXT_SETTINGS
from openjarvis.cli.output import emit_json


@click.group(context_settings=CONTEXT_SETTINGS, short_help="Start, stop and inspect the daemon.")
def daemon() -> None:
    """Start, stop and inspect the daemon that holds warm models and live indexes.

    Clients start it on demand; these commands are for when you want control.

    \b
    Example:
      jarvis daemon start && jarvis daemon status
    """


@daemon.command("start")
def start() -> None:
    """Start the daemon in the background (no-op when it is already running).

    \b
    Example:
      jarvis daemon start
    """
    from openjarvis.daemon.lifecycle import daemon_pid, ensure_running

    started = ensure_running()
    pid = daemon_pid(paths.socket_path())
    click.echo(f"daemon {'started' if started else 'already running'} (pid {pid}) on {paths.socket_path()}")


@daemon.command("stop")
def stop() -> None:
    """Stop the daemon gracefully: requests in flight finish or are cancelled, databases close.

    \b
    Example:
      jarvis daemon stop
    """
    from openjarvis.daemon.lifecycle import stop as stop_daemon

    click.echo("daemon stopped" if stop_daemon() else "daemon was not running")


@daemon.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(as_json: bool) -> None:
    """Say whether the daemon runs, and its pid, uptime, connections and requests.

    \b
    Example:
      jarvis daemon status --json
    """
    from openjarvis.daemon.client import Client
    from openjarvis.daemon.lifecycle import daemon_pid
    from openjarvis.daemon.server import socket_alive

    sock = paths.socket_path()
    if not socket_alive(sock):
        if as_json:
            emit_json({"running": False, "socket": str(sock)})
        else:
            click.echo(f"daemon not running (socket {sock}); `jarvis daemon start` starts it")
        return
    with Client(autostart=False, client_name="jarvis-status") as c:
        stats = c.call("stats")
    info = {"running": True, "pid": daemon_pid(sock), "socket": str(sock), **stats}
    if as_json:
        emit_json(info)
        return
    click.echo(
        f"daemon running (pid {info['pid']}) on {sock}: up {stats['uptime_s']:.0f} s, "
        f"{stats['connections']} connection(s), {stats['requests']} request(s), {stats['in_flight']} in flight"
    )


@daemon.command("logs")
@click.option("-n", "--lines", default=40, show_default=True, help="How many of the last lines to print.")
def logs(lines: int) -> None:
    """Print the end of the daemon's log (rotated in the XDG state dir).

    \b
    Example:
      jarvis daemon logs -n 100
    """
    from openjarvis.daemon.lifecycle import log_file

    path = log_file()
    if not path.is_file():
        click.echo(f"no daemon log yet ({path})")
        return
    for line in path.read_text(errors="replace").splitlines()[-lines:]:
        click.echo(line)


@daemon.command("run")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help="Socket path (default: XDG runtime).")
def run(socket_path: Path | None) -> None:
    """Run the daemon in the foreground (what `start` launches; useful under a supervisor).

    \b
    Example:
      jarvis daemon run
    """
    from openjarvis.daemon.lifecycle import run_foreground

    run_foreground(socket_path)
