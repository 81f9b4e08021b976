"""``jarvis ask``: one question about the current repository, answered through the daemon."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from openjarvis import paths
from openjarvis.cli import CONTEXT_SETTINGS, flag_overrides
from openjarvis.cli.output import emit_json
from openjarvis.config import load_config

#: The ``generation`` settings a chat request carries, so `-c generation.X=...` reaches a running
#: daemon (which otherwise answers with the configuration files it reads itself).
_PER_REQUEST = ("max_tokens", "temperature", "drafter")


def footer(result: dict[str, Any]) -> str:
    """The one-line stats footer: route, speed, acceptance, time to first token."""
    s = result["stats"]
    if result["route"] != "local":
        where = "⇡ left this machine" if result.get("left_machine") else "another engine on this machine"
        return (
            f"{where}: {result['route']} · {result['model']} · {s['tokens']} tokens · "
            f"${s.get('cost_usd', 0.0):.4f} · {result.get('route_reason', '')}"
        )
    ttft = f"{s['ttft_s']:.2f} s" if s.get("ttft_s") is not None else "-"
    # an answer cut where it began writing the same lines over again says so, and how to allow it
    looped = " · stopped: it began repeating itself (generation.loop_repeats)" if (
        s.get("finish_reason") == "repetition") else ""
    # a local answer the policy would have sent elsewhere, had router.cloud = ask not held it back
    reason = result.get("route_reason", "local")
    held = f" · {reason}" if reason != "local" else ""
    return (
        f"{result['route']} · {result['model']} · {s['tokens']} tokens · {s['tokens_per_s']:.1f} tok/s · "
        f"acceptance {s['acceptance']:.0%} · first token {ttft}{looped}{held}"
    )


@click.command(context_settings=CONTEXT_SETTINGS, short_help="Ask a question about the current repository.")
@click.argument("question", nargs=-1, required=True)
@click.option("-C", "--workspace", type=click.Path(file_okay=False, path_type=Path), help="Repository (default: here).")
@click.option("--continue", "resume", is_flag=True, help="Continue the last conversation in this repository.")
@click.option("--conversation", metavar="ID", help="Continue the conversation with this id.")
@click.option("--max-tokens", type=click.IntRange(1, 32768), help="Longest answer, in tokens.")
@click.option("--cloud", "route", flag_value="cloud", help="Answer with the configured cloud target (policy allowing).")
@click.option("--local", "route", flag_value="local", help="Answer on this machine only.")
@click.option("--offline", "route", flag_value="local", help="Same as --local: no byte leaves the machine.")
@click.option(
    "--drafter",
    type=click.Choice(["auto", "model", "ngram", "none"]),
    help="Speculative drafter for this answer (default: generation.drafter; auto picks per step; "
    "model loads the drafter model if the daemon has not).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (answer, sources, stats) for scripts.")
@click.option(
    "--yes", "-y", is_flag=True, help="Confirm sending to a cloud target when the policy asks (router.cloud = ask)."
)
@click.pass_context
def ask(
    ctx: click.Context,
    question: tuple[str, ...],
    workspace: Path | None,
    resume: bool,
    conversation: str | None,
    max_tokens: int | None,
    route: str | None,
    drafter: str | None,
    as_json: bool,
    yes: bool,
) -> None:
    """Answer QUESTION about the repository you are in, streaming the answer.

    The first question about a repository indexes it (with a progress bar); the daemon then keeps
    the index fresh and the models warm, so later questions start at once. The answer is Markdown
    rendered in a terminal and plain text in a pipe, followed by the files it drew on and a line of
    statistics.

    \b
    Example:
      jarvis ask "where are HTTP responses parsed?"
    """
    from openjarvis.daemon.client import Client
    from openjarvis.errors import DaemonError

    root = (workspace or paths.find_workspace_root() or Path.cwd()).resolve()
    params: dict[str, Any] = {"workspace": str(root), "message": " ".join(question)}
    # A running daemon answers with its own configuration: send what `-c` asked for of the
    # settings a chat request carries (a flag of this command wins over its `-c`).
    overrides = flag_overrides(ctx)
    asked = [k for k in _PER_REQUEST if f"generation.{k}" in overrides]
    if asked:
        gen = load_config(overrides=overrides).generation
        params.update({k: getattr(gen, k) for k in asked})
    if max_tokens:
        params["max_tokens"] = max_tokens
    if drafter:
        params["drafter"] = drafter
    if route:
        params["route"] = route
    tty = sys.stdout.isatty() and not as_json
    with Client(client_name="jarvis-ask") as client:
        if resume and not conversation:
            recent = client.call("conversations/list", {"workspace": str(root), "limit": 1})["conversations"]
            conversation = recent[0]["id"] if recent else None
        if conversation:
            params["conversation"] = conversation
        view = _View(tty=tty, quiet=as_json)
        try:
            try:
                result = client.call("chat", params, on_notification=view.on_event)
            except DaemonError as exc:
                if not (isinstance(exc.data, dict) and exc.data.get("needs_confirmation")):
                    raise
                view.close()
                if not (yes or (sys.stdin.isatty() and click.confirm(f"{exc}. Send it?", err=True))):
                    raise DaemonError(f"{exc}; not sent (pass --yes to confirm)") from None
                result = client.call("chat", {**params, "confirm_cloud": True}, on_notification=view.on_event)
        finally:
            view.close()
    if as_json:
        emit_json(result)
        return
    view.finish(result["answer"])
    if result["sources"]:
        click.echo(
            "\nsources: " + ", ".join(f"{s['path']}:{s['start_line']}-{s['end_line']}" for s in result["sources"])
        )
    click.echo(footer(result), err=True)


class _View:
    """Streams the answer: live Markdown in a terminal, raw text otherwise; on stderr (a
    terminal), bars for indexing and for reading the prompt (a long prompt on a small CPU is
    most of the wait: 45 s for 1,350 tokens of the 1.5B on 2 AVX2 cores)."""

    def __init__(self, *, tty: bool, quiet: bool) -> None:
        self.tty, self.quiet = tty, quiet
        self.text = ""
        self._live: Any = None
        self._progress: Any = None
        self._task: Any = None
        self._last = 0.0

    def on_event(self, method: str, params: dict[str, Any]) -> None:
        if self.quiet:
            return
        if method == "index/progress":
            self._bar("indexing", params["done"], params["total"], transient=False)
        elif method == "chat/progress":
            if not self.text:  # (sent only before the first token; never drawn over the answer)
                # (transient: the bar gives way to the answer)
                self._bar("reading the prompt", params["done"], params["total"], transient=True)
        elif method == "chat/restart":
            self._close_progress()
            self.text = ""
            click.echo(f"\n[{params['reason']}: the answer follows]", err=True)
        elif method == "chat/token":
            self._close_progress()
            self.text += params["text"]
            if self.tty:
                self._render()
            else:
                click.echo(params["text"], nl=False)

    def _bar(self, label: str, done: int, total: int, *, transient: bool) -> None:
        if not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        if self._progress is not None and self._progress.tasks[0].description != label:
            self._close_progress()
        if self._progress is None:
            self._progress = Progress(
                label,
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=transient,
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total)
        self._progress.update(self._task, completed=done, total=total)

    def _close_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _render(self) -> None:
        from rich.live import Live
        from rich.markdown import Markdown

        if self._live is None:
            self._live = Live(Markdown(self.text), auto_refresh=False, vertical_overflow="visible")
            self._live.start()
        now = time.monotonic()
        if now - self._last > 0.05:  # repaint at most 20 times a second
            self._live.update(Markdown(self.text), refresh=True)
            self._last = now

    def finish(self, answer: str) -> None:
        if self.tty:
            from rich.console import Console
            from rich.markdown import Markdown

            if self._live is not None:
                self._live.update(Markdown(answer), refresh=True)
                self._live.stop()
                self._live = None
            else:
                Console().print(Markdown(answer))
        elif not self.text.endswith("\n"):
            click.echo()

    def close(self) -> None:
        self._close_progress()
        if self._live is not None:
            self._live.stop()
            self._live = None
