"""Hunk-by-hunk review of a previewed edit: parse its unified diff, rebuild the accepted subset.

The daemon previews an edit as one unified diff (``edits/preview``). The review screen lets the
person accept or reject each hunk; applying only some of them must still be exact, so
``subset_edit_text`` rebuilds every touched file from the file on disk plus the accepted hunks
(placed by their line numbers, their old lines checked), and writes the result as one
whole-file search/replace block per file. The daemon then previews and applies that text with
its usual all-or-nothing guarantees. Everything here is pure: file contents come in through
``read``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_NEWLINE = "\\ No newline at end of file"
#: Lines the edit parser reads as SEARCH / divider / REPLACE markers (openjarvis.assistant.edits).
MARKER = re.compile(r"^(<{5,9} SEARCH|={5,9}|>{5,9} REPLACE)\s*$", re.MULTILINE)


class HunkError(ValueError):
    """A hunk no longer fits the file on disk (it changed since the preview)."""


@dataclass(frozen=True, slots=True)
class Hunk:
    path: str
    header: str
    old_start: int
    old_len: int
    #: The hunk's lines as (kind, text) with kind one of " ", "-", "+"; text keeps its newline.
    lines: tuple[tuple[str, str], ...]

    @property
    def old_text(self) -> list[str]:
        return [text for kind, text in self.lines if kind in " -"]

    @property
    def new_text(self) -> list[str]:
        return [text for kind, text in self.lines if kind in " +"]

    @property
    def added(self) -> int:
        return sum(kind == "+" for kind, _ in self.lines)

    @property
    def removed(self) -> int:
        return sum(kind == "-" for kind, _ in self.lines)

    def as_diff(self) -> str:
        """The hunk as unified-diff text, for display."""
        out = [self.header + "\n"]
        for kind, text in self.lines:
            out.append(kind + text if text.endswith("\n") else f"{kind}{text}\n{NO_NEWLINE}\n")
        return "".join(out)


@dataclass(frozen=True, slots=True)
class FileDiff:
    path: str
    new_file: bool
    hunks: tuple[Hunk, ...]


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse_unified_diff(diff: str) -> list[FileDiff]:
    """The files and hunks of a unified diff as ``difflib`` writes it (``--- a/p``, ``+++ b/p``)."""
    files: list[FileDiff] = []
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_name = lines[i][4:].rstrip("\n")
        path = _strip_prefix(lines[i + 1][4:].rstrip("\n"))
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and (m := HUNK_HEADER.match(lines[i])):
            header = lines[i].rstrip("\n")
            old_start, old_len = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
            new_len = int(m.group(4) if m.group(4) is not None else 1)
            i += 1
            body: list[tuple[str, str]] = []
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len or lines[i].startswith("\\")):
                line = lines[i]
                if line.startswith("\\"):
                    if body:  # the previous line has no newline at the end of the file
                        kind, text = body[-1]
                        body[-1] = (kind, text.rstrip("\n"))
                elif line[:1] in (" ", "-", "+"):
                    kind, text = line[0], line[1:]
                    if not text.endswith("\n"):
                        text += "\n"
                    body.append((kind, text))
                    seen_old += kind in " -"
                    seen_new += kind in " +"
                elif line in ("\n", ""):  # an empty context line whose space was lost
                    body.append((" ", "\n"))
                    seen_old += 1
                    seen_new += 1
                else:
                    break
                i += 1
            hunks.append(Hunk(path, header, old_start, old_len, tuple(body)))
        files.append(FileDiff(path, old_name.strip() == "/dev/null", tuple(hunks)))
    return files


def apply_hunks(original: str, hunks: Collection[Hunk]) -> str:
    """``original`` with ``hunks`` applied at their line numbers; ``HunkError`` if one does not fit."""
    src = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for hunk in sorted(hunks, key=lambda h: h.old_start):
        start = hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1
        if start < pos or src[start : start + hunk.old_len] != hunk.old_text:
            raise HunkError(f"{hunk.path}: {hunk.header} no longer matches the file; preview the edit again")
        out.extend(src[pos:start])
        out.extend(hunk.new_text)
        pos = start + hunk.old_len
    out.extend(src[pos:])
    return "".join(out)


def subset_edit_text(
    files: list[FileDiff], accepted: Collection[tuple[int, int]], read: Callable[[str], str | None]
) -> str:
    """Search/replace text that makes exactly the accepted hunks, as (file index, hunk index) pairs.

    Each touched file becomes one block whose SEARCH is the whole current file and whose REPLACE
    is that file with the accepted hunks applied, so the block always matches exactly once. The
    block format cannot say "no newline at the end", so such a file ends with one afterwards.
    """
    blocks: list[str] = []
    for fi, fd in enumerate(files):
        chosen = [h for hi, h in enumerate(fd.hunks) if (fi, hi) in accepted]
        if not chosen:
            continue
        before = read(fd.path)
        if before is None and not fd.new_file:
            raise HunkError(f"{fd.path}: the file is gone since the preview; preview the edit again")
        after = apply_hunks(before or "", chosen)
        search = before or ""
        if MARKER.search(search) or MARKER.search(after):
            raise HunkError(
                f"{fd.path}: has lines that read as edit markers (like '======='), so only all or none of "
                "its hunks can be applied; accept all of them or reject all"
            )
        blocks.append(f"{fd.path}\n<<<<<<< SEARCH\n{_block_body(search)}=======\n{_block_body(after)}>>>>>>> REPLACE\n")
    return "\n".join(blocks)


def _block_body(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"
