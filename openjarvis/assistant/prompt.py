"""Prompt assembly under a token budget: what the model sees of the codebase and the conversation.

Pure: text and token counts in, messages out. The token counter is passed in (the verifier's own
tokenizer in the daemon, a word count in tests), so budgets are exact for the model that reads
the prompt.

What goes in, by priority (a lower part only gets what the higher ones left):

1. the system prompt and the question: always; if they alone overflow, ``ContextOverflow``
   (the router may then send the request to a target with a larger context);
2. the repository map, cut at line boundaries to ``map_budget`` tokens (``MAP_SHARE`` of the
   budget unless the caller fixes it), reserved before anything that depends on the question;
3. the editor's selection;
4. the most recent conversation turns, whole turns only, up to ``HISTORY_SHARE`` of the budget;
5. retrieved chunks, best score first, each whole or not at all, down to the first wide gap in
   their scores (``weak_matches_cut``);
6. the open file, a window of lines around the cursor.

Layout: the system turn holds only the system prompt and the repository map, the *stable head*
that does not depend on the question, the retrieved code or the editor; earlier turns follow, and
the last user turn carries the question with its context (selection, open file, retrieved code).
So consecutive questions about one repository share the head token for token, and its KV state
is computed once and reused (in memory, and from the persistent prefix cache after a restart).
The map is reserved first for the same reason: were it cut to whatever the question's chunks
left, every question would have a different head.

The answer lists the sources it was given, so a person can see what it drew on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from openjarvis.engine.templates import Message
from openjarvis.errors import ContextOverflow

#: Share of the prompt budget that old conversation turns may take.
HISTORY_SHARE = 0.35
#: Share of the prompt budget that the repository map may take.
MAP_SHARE = 0.20
#: Tokens kept free for chat-template markup around each message.
MESSAGE_OVERHEAD = 8
#: Retrieved chunks are cut at the first gap in their scores where one scores under 1 /
#: ``SCORE_GAP`` of the one before it, past the first ``MIN_CHUNKS``. Where one kind of chunk
#: clearly answers (the README and design pages for a question about the whole repository), the
#: small default models copy a weak match below it into the answer rather than ignore it: asked
#: the README's own question, the 1.5B pasted a docstring from ``index/rank.py`` (scores 0.168,
#: 0.165, 0.144, 0.085, then 0.041) as if it described the repository, and wrote it four times.
#: A cut at a gap, not at a share of the best, never splits a cluster of similar scores (a code
#: question's chunks), and a question naming one symbol, whose definition scores 2-3x the
#: rest, keeps the next ``MIN_CHUNKS`` - 1 too.
SCORE_GAP = 1.75
MIN_CHUNKS = 3

SYSTEM_PROMPT = (
    "You are Open Jarvis, a coding assistant running locally on the user's machine. Answer questions "
    "about the user's codebase using the repository map below and the code given with each question. "
    "Explain in a few sentences or a short list, citing the files you draw on as path:line; a citation "
    "alone is not an answer. Be concise and exact. "
    "When asked to change code, answer with edits in this format, one block per change:\n"
    "path/to/file.py\n<<<<<<< SEARCH\nexact lines from the file\n=======\nnew lines\n>>>>>>> REPLACE"
)

Counter = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class Source:
    """A piece of the codebase the answer may draw on (a retrieved chunk)."""

    path: str
    start_line: int
    end_line: int
    text: str
    symbol: str = ""
    score: float = 0.0

    def render(self) -> str:
        label = f"{self.path}:{self.start_line}-{self.end_line}" + (f" ({self.symbol})" if self.symbol else "")
        return f"{label}\n```\n{self.text.rstrip()}\n```"


@dataclass(frozen=True, slots=True)
class EditorContext:
    path: str
    text: str
    selection: str = ""
    cursor_line: int = 1


@dataclass(frozen=True, slots=True)
class Prompt:
    messages: tuple[Message, ...]
    sources: tuple[Source, ...]
    tokens: int
    #: Human-readable notes on what did not fit ("3 of 8 chunks dropped").
    dropped: tuple[str, ...] = field(default_factory=tuple)
    #: Leading messages that do not depend on the question (the system turn: system prompt and
    #: repository map): the stable head whose KV state the engine may cache.
    stable: int = 1


def _cost(count: Counter, text: str) -> int:
    return count(text) + MESSAGE_OVERHEAD


def _window(text: str, cursor: int, budget: int, count: Counter) -> str:
    """Lines around ``cursor`` (1-based), growing both ways while the budget allows."""
    lines = text.splitlines()
    if not lines:
        return ""
    lo = hi = min(max(cursor - 1, 0), len(lines) - 1)
    used = count(lines[lo])
    if used > budget:
        return ""
    while lo > 0 or hi < len(lines) - 1:
        grew = False
        for side in ("up", "down"):
            idx = lo - 1 if side == "up" else hi + 1
            if 0 <= idx < len(lines):
                c = count(lines[idx]) + 1
                if used + c <= budget:
                    used += c
                    lo, hi = (idx, hi) if side == "up" else (lo, idx)
                    grew = True
        if not grew:
            break
    return "\n".join(lines[lo : hi + 1])


def _cut_lines(text: str, budget: int, count: Counter) -> str:
    out: list[str] = []
    used = 0
    for line in text.splitlines():
        c = count(line) + 1
        if used + c > budget:
            break
        out.append(line)
        used += c
    return "\n".join(out)


def weak_matches_cut(sources: Sequence[Source]) -> list[Source]:
    """``sources`` best first, down to the first one past ``MIN_CHUNKS`` that scores under
    1 / ``SCORE_GAP`` of the one before it (see ``SCORE_GAP``)."""
    ranked = sorted(sources, key=lambda s: -s.score)
    for i in range(MIN_CHUNKS, len(ranked)):
        if ranked[i - 1].score > 0 and ranked[i].score * SCORE_GAP < ranked[i - 1].score:
            return ranked[:i]
    return ranked


def assemble(
    question: str,
    *,
    budget: int,
    count: Counter,
    system: str = SYSTEM_PROMPT,
    history: Sequence[Message] = (),
    sources: Sequence[Source] = (),
    editor: EditorContext | None = None,
    repo_map: str = "",
    map_budget: int | None = None,
) -> Prompt:
    """Build the chat messages for ``question`` within ``budget`` prompt tokens.

    ``map_budget`` (default ``MAP_SHARE`` of ``budget``) caps the repository map; a caller that
    re-assembles one request at a smaller budget passes the same value both times, so the head
    stays the same. Only a question too long to leave the map its room shrinks it.
    """
    used = _cost(count, system) + _cost(count, question)
    if used > budget:
        raise ContextOverflow(
            f"the question alone needs {used} tokens but the prompt budget is {budget}; "
            "shorten it, raise engine.context, or allow a cloud target with a larger context"
        )
    dropped: list[str] = []
    context_parts: list[str] = []
    system_text = system

    if repo_map:
        room = min(int(budget * MAP_SHARE) if map_budget is None else map_budget, budget - used - 16)
        cut = _cut_lines(repo_map, room, count) if room > 0 else ""
        if cut:
            part = f"Repository map (the most relevant definitions):\n{cut}"
            system_text = f"{system}\n\n{part}"
            used += count(part) + 1
        if cut != repo_map.rstrip("\n"):
            dropped.append("part of the repository map")

    if editor is not None and editor.selection:
        sel = f"Selected in {editor.path}:\n```\n{editor.selection}\n```"
        c = count(sel) + 1
        if used + c <= budget:
            context_parts.append(sel)
            used += c
        else:
            dropped.append("the selection")

    kept_history: list[Message] = []
    history_budget = min(int(budget * HISTORY_SHARE), budget - used)
    spent = 0
    for msg in reversed(history):
        c = _cost(count, msg.content)
        if spent + c > history_budget:
            break
        kept_history.insert(0, msg)
        spent += c
    used += spent
    if len(kept_history) < len(history):
        dropped.append(f"{len(history) - len(kept_history)} of {len(history)} earlier messages")

    kept_sources: list[Source] = []
    # a weak match is left out, not dropped for want of room: it is not reported as dropped
    wanted = weak_matches_cut(sources)
    for src in wanted:
        c = count(src.render()) + 1
        if used + c <= budget:
            kept_sources.append(src)
            used += c
    if len(kept_sources) < len(wanted):
        dropped.append(f"{len(wanted) - len(kept_sources)} of {len(wanted)} retrieved chunks")

    if editor is not None and editor.text:
        header = f"Open in the editor: {editor.path} (around line {editor.cursor_line})\n```\n"
        room = budget - used - count(header) - 4
        window = _window(editor.text, editor.cursor_line, room, count) if room > 0 else ""
        if window:
            part = f"{header}{window}\n```"
            context_parts.append(part)
            used += count(part) + 1
        else:
            dropped.append("the open file")

    if kept_sources:
        context_parts.append("Relevant code:\n\n" + "\n\n".join(s.render() for s in kept_sources))
    user_text = "\n\n".join([*context_parts, question])
    messages = (Message("system", system_text), *kept_history, Message("user", user_text))
    return Prompt(messages, tuple(kept_sources), used, tuple(dropped), stable=1)
