"""Hunk review arithmetic: a unified diff split into hunks, and any subset of them rebuilt exactly."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openjarvis.assistant.edits import FileChange, parse_edits, plan_edits, unified_diff
from openjarvis.tui.hunks import HunkError, apply_hunks, parse_unified_diff, subset_edit_text

BEFORE = "".join(f"line {i}\n" for i in range(1, 31))
AFTER = BEFORE.replace("line 2\n", "line two\n").replace("line 15\n", "").replace("line 29\n", "line 29\nnew\n")


def test_a_diff_splits_into_its_hunks_and_all_of_them_rebuild_the_file() -> None:
    (fd,) = parse_unified_diff(unified_diff(FileChange("a.txt", BEFORE, AFTER)))
    assert fd.path == "a.txt" and not fd.new_file and len(fd.hunks) == 3
    assert [(h.added, h.removed) for h in fd.hunks] == [(1, 1), (0, 1), (1, 0)]
    assert apply_hunks(BEFORE, fd.hunks) == AFTER


@pytest.mark.parametrize("keep", [k for n in range(4) for k in itertools.combinations(range(3), n)])
def test_every_subset_of_hunks_is_applied_exactly_through_the_edit_parser(
    keep: tuple[int, ...], tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text(BEFORE)
    files = parse_unified_diff(unified_diff(FileChange("a.txt", BEFORE, AFTER)))
    want = apply_hunks(BEFORE, [files[0].hunks[i] for i in keep])
    if not keep:
        assert subset_edit_text(files, set(), lambda p: BEFORE) == ""
        return
    text = subset_edit_text(files, {(0, i) for i in keep}, lambda p: (tmp_path / p).read_text())
    plan = plan_edits(tmp_path, parse_edits(text))  # what the daemon does with it
    got = plan.changes[0].after if plan.changes else BEFORE
    assert got == want


def test_new_file_and_missing_newline_at_the_end() -> None:
    diff = unified_diff(FileChange("n.py", None, "x = 1\ny = 2")) + unified_diff(FileChange("o.py", "a\nb", "a\nc"))
    new, old = parse_unified_diff(diff)
    assert new.new_file and apply_hunks("", new.hunks) == "x = 1\ny = 2"
    assert apply_hunks("a\nb", old.hunks) == "a\nc"


def test_a_file_changed_since_the_preview_is_refused() -> None:
    (fd,) = parse_unified_diff(unified_diff(FileChange("a.txt", BEFORE, AFTER)))
    with pytest.raises(HunkError, match="no longer matches"):
        apply_hunks(BEFORE.replace("line 1\n", "changed\n"), fd.hunks[:1])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["a\n", "b\n", "c\n", "\n", "def f():\n", "    pass\n"]), max_size=25),
    st.lists(st.sampled_from(["a\n", "b\n", "x\n", "\n", "    pass\n"]), max_size=25),
)
def test_all_hunks_round_trip_any_diff(before: list[str], after: list[str]) -> None:
    b, a = "".join(before), "".join(after)
    files = parse_unified_diff(unified_diff(FileChange("f", b, a)))
    assert apply_hunks(b, files[0].hunks if files else ()) == a


def test_part_of_a_file_with_marker_like_lines_is_refused_clearly() -> None:
    before = "Title\n=======\n\n" + BEFORE
    after = before.replace("line 2\n", "line two\n").replace("line 29\n", "line 29\nnew\n")
    files = parse_unified_diff(unified_diff(FileChange("README.rst", before, after)))
    assert len(files[0].hunks) == 2
    with pytest.raises(HunkError, match="all or none"):
        subset_edit_text(files, {(0, 1)}, lambda p: before)
