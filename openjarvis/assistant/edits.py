"""Edits proposed by a model, turned into a reviewed unified diff, applied atomically, undoable.

The model answers change requests in the search/replace format (as Aider popularised)::

    path/to/file.py
    <<<<<<< SEARCH
    exact lines to find
    =======
    lines to put instead
    >>>>>>> REPLACE

An empty SEARCH creates a new file (or appends to an empty one). Everything here is careful in the
same three ways: a malformed or ambiguous edit is reported and nothing is changed (never
half-applied); no path may leave the workspace (``..``, absolute paths, symlinks pointing out);
and applying keeps the exact pre-image of every file so ``undo`` restores it byte for byte.

Parsing and planning are pure (text in, plan out); only ``apply_plan`` and ``undo`` touch disk.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from openjarvis.errors import EditError

SEARCH = re.compile(r"^<{5,9} SEARCH\s*$")
DIVIDER = re.compile(r"^={5,9}\s*$")
REPLACE = re.compile(r"^>{5,9} REPLACE\s*$")
FENCE = re.compile(r"^```")


@dataclass(frozen=True, slots=True)
class EditBlock:
    path: str
    search: str
    replace: str
    line: int  # where the block starts in the model's answer, for error messages


@dataclass(frozen=True, slots=True)
class FileChange:
    path: str  # relative to the workspace, POSIX separators
    before: str | None  # None: the file does not exist yet
    after: str


@dataclass(frozen=True, slots=True)
class EditPlan:
    root: Path
    changes: tuple[FileChange, ...]

    @property
    def diff(self) -> str:
        return "".join(unified_diff(c) for c in self.changes)


def unified_diff(change: FileChange) -> str:
    before = (change.before or "").splitlines(keepends=True)
    after = change.after.splitlines(keepends=True)
    old = f"a/{change.path}" if change.before is not None else "/dev/null"
    lines = difflib.unified_diff(before, after, old, f"b/{change.path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def parse_edits(text: str) -> list[EditBlock]:
    """Find every search/replace block; raise ``EditError`` naming the line of a malformed one."""
    lines = text.splitlines(keepends=True)
    blocks: list[EditBlock] = []
    i = 0
    while i < len(lines):
        if not SEARCH.match(lines[i].rstrip("\n")):
            if DIVIDER.match(lines[i].rstrip("\n")) or REPLACE.match(lines[i].rstrip("\n")):
                raise EditError(
                    f"line {i + 1}: a '{lines[i].strip()}' marker outside a SEARCH block; nothing was changed"
                )
            i += 1
            continue
        start = i
        path = _path_before(lines, i)
        if path is None:
            raise EditError(f"line {i + 1}: SEARCH block without a file path on the line above; nothing was changed")
        i += 1
        search: list[str] = []
        while i < len(lines) and not DIVIDER.match(lines[i].rstrip("\n")):
            if SEARCH.match(lines[i].rstrip("\n")) or REPLACE.match(lines[i].rstrip("\n")):
                raise EditError(f"line {i + 1}: expected '=======' before '{lines[i].strip()}'; nothing was changed")
            search.append(lines[i])
            i += 1
        if i >= len(lines):
            raise EditError(f"line {start + 1}: SEARCH block is never divided by '======='; nothing was changed")
        i += 1
        replace: list[str] = []
        while i < len(lines) and not REPLACE.match(lines[i].rstrip("\n")):
            if SEARCH.match(lines[i].rstrip("\n")) or DIVIDER.match(lines[i].rstrip("\n")):
                raise EditError(
                    f"line {i + 1}: expected '>>>>>>> REPLACE' before '{lines[i].strip()}'; nothing was changed"
                )
            replace.append(lines[i])
            i += 1
        if i >= len(lines):
            raise EditError(f"line {start + 1}: SEARCH block is never closed by '>>>>>>> REPLACE'; nothing was changed")
        i += 1
        blocks.append(EditBlock(path, "".join(search), "".join(replace), start + 1))
    return blocks


def _path_before(lines: list[str], i: int) -> str | None:
    """The file path is the nearest non-empty, non-fence line above the SEARCH marker."""
    j = i - 1
    while j >= 0 and (not lines[j].strip() or FENCE.match(lines[j].strip())):
        j -= 1
    if j < 0:
        return None
    candidate = lines[j].strip().strip("`*").strip()
    if not candidate or " " in candidate or REPLACE.match(candidate):
        return None
    return candidate


def resolve_inside(root: Path, rel: str) -> Path:
    """``root / rel`` after resolving symlinks, or ``EditError`` if that is outside ``root``."""
    root = root.resolve()
    if os.path.isabs(rel) or rel.startswith("~"):
        raise EditError(f"{rel}: absolute paths are not allowed in edits; nothing was changed")
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise EditError(f"{rel}: resolves outside the workspace {root}; nothing was changed")
    return target


def _replace_once(content: str, block: EditBlock) -> str:
    if not block.search.strip():
        return content + block.replace if content else block.replace
    count = content.count(block.search)
    if count == 1:
        return content.replace(block.search, block.replace, 1)
    if count > 1:
        raise EditError(
            f"{block.path}: the SEARCH text of the block at line {block.line} matches {count} places; "
            "it must match exactly one; nothing was changed"
        )
    # Models often get trailing whitespace wrong; accept a match that differs only there.
    stripped = _loose_find(content, block.search)
    if stripped is not None:
        start, end = stripped
        return content[:start] + block.replace + content[end:]
    raise EditError(
        f"{block.path}: the SEARCH text of the block at line {block.line} is not in the file; nothing was changed"
    )


def _loose_find(content: str, search: str) -> tuple[int, int] | None:
    want = [line.rstrip() for line in search.splitlines()]
    lines = content.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    found = [
        k for k in range(len(lines) - len(want) + 1) if [line.rstrip() for line in lines[k : k + len(want)]] == want
    ]
    if len(found) != 1:
        return None
    k = found[0]
    return offsets[k], offsets[k + len(want)]


def plan_edits(root: Path, blocks: list[EditBlock]) -> EditPlan:
    """Apply the blocks in memory, in order; a file touched twice sees the first block's result."""
    if not blocks:
        raise EditError("the answer contains no SEARCH/REPLACE block; nothing to apply")
    current: dict[str, str | None] = {}
    before: dict[str, str | None] = {}
    order: list[str] = []
    for block in blocks:
        target = resolve_inside(root, block.path)
        rel = target.relative_to(root.resolve()).as_posix()
        if rel not in current:
            if target.is_dir():
                raise EditError(f"{rel}: is a directory; nothing was changed")
            text = target.read_text(encoding="utf-8") if target.is_file() else None
            if text is None and block.search.strip():
                raise EditError(
                    f"{rel}: no such file, and the block at line {block.line} searches it; nothing was changed"
                )
            current[rel] = before[rel] = text
            order.append(rel)
        current[rel] = _replace_once(current[rel] or "", block)
    changes = tuple(FileChange(rel, before[rel], current[rel] or "") for rel in order if before[rel] != current[rel])
    return EditPlan(root.resolve(), changes)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.jarvis-{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)


def _check_unchanged(root: Path, changes: tuple[FileChange, ...], expect_after: bool) -> None:
    for c in changes:
        target = resolve_inside(root, c.path)
        now = target.read_text(encoding="utf-8") if target.is_file() else None
        want = c.after if expect_after else c.before
        if now != want:
            what = "since the edit was applied" if expect_after else "since the edit was previewed"
            raise EditError(f"{c.path} changed {what}; nothing was changed, review it again")


def apply_plan(plan: EditPlan) -> None:
    """Write every change, or none: files are checked first, then replaced by rename."""
    _check_unchanged(plan.root, plan.changes, expect_after=False)
    done: list[FileChange] = []
    try:
        for c in plan.changes:
            _write_atomic(resolve_inside(plan.root, c.path), c.after)
            done.append(c)
    except OSError as exc:
        _restore(plan.root, done)
        raise EditError(
            f"could not write {plan.changes[len(done)].path} ({exc.strerror}); nothing was changed"
        ) from exc


def _restore(root: Path, changes: list[FileChange] | tuple[FileChange, ...]) -> None:
    for c in reversed(changes):
        target = resolve_inside(root, c.path)
        if c.before is None:
            target.unlink(missing_ok=True)
        else:
            _write_atomic(target, c.before)


def undo(plan: EditPlan) -> None:
    """Restore every pre-image exactly; refused if a file changed after the edit was applied."""
    _check_unchanged(plan.root, plan.changes, expect_after=True)
    _restore(plan.root, plan.changes)
