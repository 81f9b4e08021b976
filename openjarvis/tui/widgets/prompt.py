"""The multi-line input: Enter sends, Ctrl+J (or Alt/Shift+Enter) breaks the line, Up/Down recall.

Pasting keeps newlines (TextArea inserts pasted text as it is). History is per app run: Up on the
first line recalls older entries, Down on the last line newer ones, back to what was being typed.
"""

from __future__ import annotations

from textual import events
from textual.widgets import TextArea

from openjarvis.tui import commands
from openjarvis.tui.messages import PromptSubmitted

NEWLINE_KEYS = frozenset({"ctrl+j", "shift+enter", "alt+enter", "ctrl+enter"})


class PromptInput(TextArea):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, tab_behavior="focus", show_line_numbers=False)
        self.input_history: list[str] = []
        self._history_pos: int | None = None
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        row, _ = self.cursor_location
        if event.key == "enter":
            self._stop(event)
            self.submit()
            return
        if event.key in NEWLINE_KEYS:
            self._stop(event)
            self.insert("\n")
            return
        if event.key == "tab" and (done := commands.complete(self.text)) is not None:
            self._stop(event)
            self.load_text(done)
            self.move_cursor(self.document.end)
            return
        if event.key == "up" and row == 0 and self.input_history:
            self._stop(event)
            self.recall(-1)
            return
        if event.key == "down" and row == self.document.line_count - 1 and self._history_pos is not None:
            self._stop(event)
            self.recall(+1)
            return
        await super()._on_key(event)

    @staticmethod
    def _stop(event: events.Key) -> None:
        event.stop()
        event.prevent_default()

    def submit(self) -> None:
        text = self.text.strip()
        if not text:
            return
        if not self.input_history or self.input_history[-1] != text:
            self.input_history.append(text)
        self._history_pos = None
        self._draft = ""
        self.clear()
        self.post_message(PromptSubmitted(text))

    def recall(self, step: int) -> None:
        """Move through the history: -1 older, +1 newer; past the newest returns to the draft."""
        if self._history_pos is None:
            self._draft = self.text
            pos = len(self.input_history)
        else:
            pos = self._history_pos
        pos = max(0, min(len(self.input_history), pos + step))
        self._history_pos = None if pos == len(self.input_history) else pos
        self.load_text(self._draft if self._history_pos is None else self.input_history[pos])
        self.move_cursor(self.document.end)
