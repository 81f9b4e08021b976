"""Textual messages the workers post to the app: dataclasses, one per event a person can see.

Workers talk to the daemon and post these; handlers on the app update reactives and widgets.
Every message that belongs to a request carries the app's own ``seq`` for it, so a handler drops
results of a request that was cancelled or superseded (as Textual's dictionary example does).
High-rate messages (the growing answer, index progress) coalesce with ``can_replace``: when the
screen falls behind, only the newest is painted, and nothing is lost because each carries the
whole state so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class PromptSubmitted(Message):
    """The person sent the input (Enter): a question or a slash command."""

    text: str


@dataclass
class AnswerGrew(Message):
    """The answer so far (whole text, not a delta), so a newer one may replace an older one."""

    seq: int
    text: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, AnswerGrew) and message.seq == self.seq


@dataclass
class AnswerDone(Message):
    seq: int
    result: dict[str, Any]


@dataclass
class AnswerFailed(Message):
    seq: int
    code: int | None
    error: str


@dataclass
class IndexProgress(Message):
    done: int
    total: int

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, IndexProgress)


@dataclass
class PromptProgress(Message):
    """How much of a chat's prompt the local model has read (``chat/progress``)."""

    seq: int
    done: int
    total: int

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PromptProgress)


@dataclass
class IndexState(Message):
    status: dict[str, Any]


@dataclass
class SearchDone(Message):
    seq: int
    query: str
    hits: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Connected(Message):
    server_info: dict[str, Any]


@dataclass
class Disconnected(Message):
    error: str
