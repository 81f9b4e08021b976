"""Review a proposed edit hunk by hunk: accept or reject each, then apply the accepted ones.

Dismisses with the accepted hunks as (file index, hunk index) pairs, or None when cancelled.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Label, OptionList, Static
from textual.widgets.option_list import Option

from openjarvis.tui.hunks import FileDiff, Hunk

Key = tuple[int, int]


def diff_content(diff: str) -> Content:
    """Diff text coloured with the theme's own success/error colours, so it reads in light and dark."""
    styles = {"+": "$text-success", "-": "$text-error", "@": "$text-accent"}
    return Content("\n").join(Content.styled(line, styles.get(line[:1], "")) for line in diff.splitlines())


class DiffReviewScreen(Screen[set[Key] | None]):
    BINDINGS = [
        Binding("space", "toggle_hunk", "Accept/reject"),
        Binding("a", "accept_all", "Accept all"),
        Binding("r", "reject_all", "Reject all"),
        Binding("y", "apply", "Apply accepted"),
        Binding("escape", "cancel", "Cancel"),
    ]

    accepted: reactive[frozenset[Key]] = reactive(frozenset(), init=False)

    def __init__(self, files: list[FileDiff]) -> None:
        super().__init__()
        self.files = files
        self.keys: list[Key] = [(fi, hi) for fi, fd in enumerate(files) for hi in range(len(fd.hunks))]
        self.set_reactive(DiffReviewScreen.accepted, frozenset(self.keys))

    def compose(self) -> ComposeResult:
        n_files = len(self.files)
        yield Label(
            f"Review edit: {len(self.keys)} hunk(s) in {n_files} file(s). "
            "Space accepts/rejects, y applies the accepted ones, Esc cancels.",
            id="review-title",
        )
        yield OptionList(*[Option(self._label(k), id=f"h{i}") for i, k in enumerate(self.keys)], id="hunks")
        with VerticalScroll(id="hunk-scroll"):
            yield Static("", id="hunk-diff")
        yield Footer()

    def on_mount(self) -> None:
        hunks = self.query_one("#hunks", OptionList)
        hunks.focus()
        if self.keys:
            hunks.highlighted = 0
            self._show(0)

    def hunk(self, key: Key) -> Hunk:
        return self.files[key[0]].hunks[key[1]]

    def _label(self, key: Key) -> str:
        h = self.hunk(key)
        mark = "✔" if key in self.accepted else "✘"
        return f"{mark} {h.path} {h.header.split('@@')[1].strip()} +{h.added} -{h.removed}"

    def watch_accepted(self) -> None:
        hunks = self.query_one("#hunks", OptionList)
        for i, key in enumerate(self.keys):
            hunks.replace_option_prompt_at_index(i, self._label(key))

    def _show(self, index: int) -> None:
        diff = self.hunk(self.keys[index]).as_diff()
        self.query_one("#hunk-diff", Static).update(diff_content(diff))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._show(event.option_index)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._toggle(event.option_index)

    def _toggle(self, index: int) -> None:
        key = self.keys[index]
        self.accepted = self.accepted - {key} if key in self.accepted else self.accepted | {key}

    def action_toggle_hunk(self) -> None:
        index = self.query_one("#hunks", OptionList).highlighted
        if index is not None:
            self._toggle(index)

    def action_accept_all(self) -> None:
        self.accepted = frozenset(self.keys)

    def action_reject_all(self) -> None:
        self.accepted = frozenset()

    def action_apply(self) -> None:
        self.dismiss(set(self.accepted))

    def action_cancel(self) -> None:
        self.dismiss(None)
