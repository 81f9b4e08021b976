"""Pick an earlier conversation of this workspace to resume; dismisses with its id or None."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from openjarvis.tui import format


class HistoryScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Close")]

    def __init__(self, conversations: list[dict[str, Any]]) -> None:
        super().__init__()
        self.conversations = conversations

    def compose(self) -> ComposeResult:
        with Vertical(id="history-box"):
            yield Label(f"Resume a conversation ({len(self.conversations)}); Enter opens it, Esc closes")
            yield OptionList(
                *[Option(format.conversation_label(c), id=c["id"]) for c in self.conversations], id="history-list"
            )

    def on_mount(self) -> None:
        self.query_one("#history-list", OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
