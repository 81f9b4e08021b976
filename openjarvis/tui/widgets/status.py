"""The status bar: workspace, routing, the last answer's model and speed, the index, the daemon."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual.reactive import reactive
from textual.widgets import Static

from openjarvis.tui import format


class StatusBar(Static):
    """One line; the app sets the reactives, ``render`` draws them."""

    workspace: reactive[str] = reactive("")
    route_mode: reactive[str] = reactive("auto")
    last_result: reactive[dict[str, Any] | None] = reactive(None)
    index_status: reactive[dict[str, Any] | None] = reactive(None)
    index_progress: reactive[tuple[int, int] | None] = reactive(None)
    #: Prompt tokens the local model has read of all it must, before the answer's first token.
    prompt_progress: reactive[tuple[int, int] | None] = reactive(None)
    connected: reactive[bool] = reactive(False)
    #: True until the first connection attempt has an outcome (starting the daemon takes a moment).
    connecting: reactive[bool] = reactive(False)
    busy: reactive[bool] = reactive(False)

    def render(self) -> str:
        parts = [f"[b]{escape(format.short_workspace(self.workspace))}[/b]"]
        if self.connecting:
            parts.append("[i]connecting…[/i]")
        elif not self.connected:
            parts.append("[reverse $error] daemon offline [/]")
        parts.append(f"route {self.route_mode}" if self.route_mode != "auto" else "auto")
        if self.busy:
            parts.append("[i]answering… Esc cancels[/i]")
            if self.prompt_progress is not None:
                parts.append(_bar("reading the prompt", *self.prompt_progress))
        if self.last_result is not None:
            if format.left_machine(self.last_result):
                target = escape(str(self.last_result.get("route")))
                parts.append(f"[reverse $warning] ☁ LEFT MACHINE: {target} [/]")
            else:
                parts.append("[$success]● local[/]")
            parts.append(format.answer_stats(self.last_result))
        if self.index_progress is not None:
            parts.append(_bar("indexing", *self.index_progress))
        else:
            parts.append(escape(format.index_state(self.index_status)))
        return " · ".join(parts)


def _bar(label: str, done: int, total: int) -> str:
    filled = min(10, round(10 * done / total)) if total else 0
    return f"{label} [$accent]{'█' * filled}[/][$text-muted]{'░' * (10 - filled)}[/] {done}/{total}"
