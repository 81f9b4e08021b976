"""The context panel: what an answer drew on, or search results, each selectable to preview the code.

The preview reads the file from the workspace on disk (the TUI may read files; it never opens
the index database) and shows the lines around the source, highlighted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.containers import ScrollableContainer, Vertical
from textual.content import Content
from textual.highlight import highlight
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

from openjarvis.tui import format

MAX_PREVIEW_BYTES = 2 * 1024 * 1024
CONTEXT_LINES = 3
MAX_PREVIEW_LINES = 400


@dataclass(frozen=True, slots=True)
class Item:
    path: str
    start_line: int
    end_line: int
    label: str


def read_snippet(workspace: Path, item: Item) -> tuple[str, int] | str:
    """(code around the item, its first line number), or a one-line reason it cannot be shown."""
    root = workspace.resolve()
    target = (root / item.path).resolve()
    if target != root and root not in target.parents:
        return f"{item.path}: outside the workspace"
    try:
        if target.stat().st_size > MAX_PREVIEW_BYTES:
            return f"{item.path}: too large to preview"
        lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return f"{item.path}: cannot read it ({exc.strerror or exc})"
    first = max(1, item.start_line - CONTEXT_LINES)
    last = min(len(lines), max(item.end_line, item.start_line) + CONTEXT_LINES, first + MAX_PREVIEW_LINES - 1)
    return "\n".join(lines[first - 1 : last]), first


def numbered(code: str, first: int, path: str, mark: range) -> Content:
    """Highlighted code with line numbers; lines in ``mark`` get a bar in the gutter."""
    body = highlight(code, path=path) if code else Content("")
    width = len(str(first + code.count("\n")))
    out = []
    for n, line in enumerate(body.split("\n", allow_blank=True), start=first):
        gutter = Content.styled(f"{n:>{width}} {'▌' if n in mark else ' '}", "$text-muted")
        out.append(gutter + line)
    return Content("\n").join(out)


class ContextPanel(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.workspace = Path(".")
        self.items: list[Item] = []

    def compose(self) -> ComposeResult:
        yield Label("Sources", id="context-title")
        yield OptionList(id="context-list")
        with ScrollableContainer(id="context-preview-scroll"):
            yield Static("", id="context-preview")

    def show(self, title: str, items: list[Item]) -> None:
        self.items = items
        self.query_one("#context-title", Label).update(title)
        options = self.query_one("#context-list", OptionList)
        options.set_options(Option(item.label) for item in items)
        self.query_one("#context-preview", Static).update("")
        if items:
            options.highlighted = 0

    def show_sources(self, sources: list[dict[str, Any]]) -> None:
        self.show(
            f"Sources ({len(sources)})",
            [Item(s["path"], s["start_line"], s["end_line"], format.source_label(s)) for s in sources],
        )

    def show_hits(self, query: str, hits: list[dict[str, Any]]) -> None:
        items = [Item(h["path"], h["start_line"], h["end_line"], format.source_label(h)) for h in hits]
        self.show(f"Search: {query} ({len(hits)})", items)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option_index < len(self.items):
            self.preview(self.items[event.option_index])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_index < len(self.items):
            self.preview(self.items[event.option_index])
            self.query_one("#context-preview-scroll").focus()

    def preview(self, item: Item) -> None:
        got = read_snippet(self.workspace, item)
        view = self.query_one("#context-preview", Static)
        if isinstance(got, str):
            view.update(Content(got))
            return
        code, first = got
        view.update(numbered(code, first, item.path, range(item.start_line, item.end_line + 1)))
