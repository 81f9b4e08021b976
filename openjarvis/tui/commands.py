"""Slash commands: their table, parsing and completion (pure, so tests need no app)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlashCommand:
    name: str
    args: str
    help: str


#: Every slash command, in the order ``/help`` lists them.
SLASH_COMMANDS: tuple[SlashCommand, ...] = (
    SlashCommand("search", "QUERY", "search the index; results go to the context panel"),
    SlashCommand("cloud", "", "send the next questions to the cloud target (policy allowing)"),
    SlashCommand("local", "", "answer on this machine only"),
    SlashCommand("auto", "", "let the routing policy decide, local first"),
    SlashCommand("model", "", "show the installed models and the pair in use"),
    SlashCommand("clear", "", "clear the screen; the conversation goes on"),
    SlashCommand("new", "", "start a new conversation"),
    SlashCommand("history", "", "resume an earlier conversation"),
    SlashCommand("apply", "", "review the last answer's edits hunk by hunk, then apply"),
    SlashCommand("undo", "", "undo the last applied edit"),
    SlashCommand("help", "", "list commands and keys"),
)
NAMES = {c.name for c in SLASH_COMMANDS}


@dataclass(frozen=True, slots=True)
class Parsed:
    name: str
    arg: str


def parse(text: str) -> Parsed | None:
    """``/name rest`` -> Parsed(name, rest); None when the text is a question, not a command.

    ``//text`` escapes a question that starts with a slash. An unknown ``/word`` still parses,
    so the app can say it is unknown instead of sending it to the model.
    """
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    head, _, rest = stripped[1:].partition(" ")
    if not head or "/" in head:  # a path such as /usr/lib is a question
        return None
    return Parsed(head.lower(), rest.strip())


def completions(text: str) -> list[SlashCommand]:
    """Commands whose name starts with what is typed after the slash (nothing once a space follows)."""
    if not text.startswith("/") or " " in text or "\n" in text:
        return []
    prefix = text[1:].lower()
    return [c for c in SLASH_COMMANDS if c.name.startswith(prefix)]


def complete(text: str) -> str | None:
    """The input after Tab: the single match, the matches' longer common prefix, else the first match."""
    matches = completions(text)
    if not matches:
        return None
    if len(matches) == 1:
        return f"/{matches[0].name} "
    names = [c.name for c in matches]
    common = names[0]
    for n in names[1:]:
        while not n.startswith(common):
            common = common[:-1]
    return f"/{common}" if len(common) > len(text) - 1 else f"/{names[0]} "


def help_markdown(keys: list[tuple[str, str]]) -> str:
    rows = "\n".join(f"| `/{c.name}{' ' + c.args if c.args else ''}` | {c.help} |" for c in SLASH_COMMANDS)
    key_rows = "\n".join(f"| `{k}` | {d} |" for k, d in keys)
    return f"| command | what it does |\n|---|---|\n{rows}\n\n| key | action |\n|---|---|\n{key_rows}\n"
