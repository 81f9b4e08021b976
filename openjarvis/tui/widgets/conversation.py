"""The conversation: the person's messages and the answers, the newest at the bottom."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Markdown, Static


class Conversation(VerticalScroll):
    """A scrolling column of turns; answers are Markdown (code blocks highlighted by Textual)."""

    can_focus = False

    async def add_user(self, text: str) -> None:
        await self.mount(Static(text, classes="user", markup=False))
        self.anchor()

    async def add_answer(self, markdown: str = "") -> Markdown:
        """A new answer block; stream into it with ``Markdown.get_stream``."""
        block = Markdown(markdown, classes="answer")
        await self.mount(block)
        self.anchor()
        return block

    async def add_note(self, markdown: str, *, error: bool = False) -> None:
        """Text from Jarvis itself (help, model list), set apart from answers."""
        await self.mount(Markdown(markdown, classes="note error" if error else "note"))
        self.anchor()

    async def clear(self) -> None:
        await self.remove_children()
