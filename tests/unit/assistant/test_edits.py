"""Search/replace edits: the diff a person reviews, the files on disk, exact undo, nothing half-done."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from openjarvis.assistant.edits import apply_plan, parse_edits, plan_edits, undo
from openjarvis.errors import EditError

ORIGINAL = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "math.py").write_text(ORIGINAL)
    (root / "README.md").write_text("# demo\n")
    (root / "pkg" / "dup.py").write_text("pass\npass\n")
    return root


ANSWER = """I'll make `add` check its types.

pkg/math.py
```python
<<<<<<< SEARCH
def add(a, b):
    return a + b
=======
def add(a: int, b: int) -> int:
    return a + b
>>>>>>> REPLACE
```

And add a changelog:

CHANGES.md
<<<<<<< SEARCH
=======
- typed add()
>>>>>>> REPLACE
"""


def test_parse_plan_apply_undo_round_trip(repo: Path) -> None:
    blocks = parse_edits(ANSWER)
    assert [(b.path, b.line) for b in blocks] == [("pkg/math.py", 5), ("CHANGES.md", 17)]
    plan = plan_edits(repo, blocks)
    assert plan.diff == (
        "--- a/pkg/math.py\n+++ b/pkg/math.py\n@@ -1,4 +1,4 @@\n"
        "-def add(a, b):\n+def add(a: int, b: int) -> int:\n     return a + b\n \n \n"
        "--- /dev/null\n+++ b/CHANGES.md\n@@ -0,0 +1 @@\n+- typed add()\n"
    )
    assert (repo / "pkg" / "math.py").read_text() == ORIGINAL  # preview changes nothing
    apply_plan(plan)
    assert (repo / "pkg" / "math.py").read_text().startswith("def add(a: int, b: int) -> int:\n")
    assert (repo / "CHANGES.md").read_text() == "- typed add()\n"
    undo(plan)
    assert (repo / "pkg" / "math.py").read_text() == ORIGINAL
    assert not (repo / "CHANGES.md").exists()
    assert sorted(p.name for p in repo.rglob("*") if p.is_file()) == ["README.md", "dup.py", "math.py"]


def test_two_blocks_on_one_file_compose(repo: Path) -> None:
    text = (
        "pkg/math.py\n<<<<<<< SEARCH\n    return a + b\n=======\n    return b + a\n>>>>>>> REPLACE\n"
        "pkg/math.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return -(b - a)\n>>>>>>> REPLACE\n"
    )
    plan = plan_edits(repo, parse_edits(text))
    apply_plan(plan)
    assert (repo / "pkg" / "math.py").read_text() == ORIGINAL.replace("a + b", "b + a").replace(
        "return a - b", "return -(b - a)"
    )


def test_trailing_whitespace_mismatch_is_tolerated(repo: Path) -> None:
    text = (
        "pkg/math.py\n<<<<<<< SEARCH\ndef sub(a, b):   \n    return a - b\n"
        "=======\ndef sub(a, b):\n    return a-b\n>>>>>>> REPLACE\n"
    )
    apply_plan(plan_edits(repo, parse_edits(text)))
    assert (repo / "pkg" / "math.py").read_text().endswith("def sub(a, b):\n    return a-b\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pkg/math.py\n<<<<<<< SEARCH\nx\n", "line 2: SEARCH block is never divided by '======='"),
        ("pkg/math.py\n<<<<<<< SEARCH\nx\n=======\ny\n", "line 2: SEARCH block is never closed"),
        ("<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n", "line 1: SEARCH block without a file path"),
        ("stray\n=======\n", "line 2: a '=======' marker outside a SEARCH block"),
    ],
)
def test_malformed_answers_are_reported_by_line(text: str, message: str) -> None:
    with pytest.raises(EditError, match=message):
        parse_edits(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pkg/math.py\n<<<<<<< SEARCH\nnot there\n=======\ny\n>>>>>>> REPLACE\n", "is not in the file"),
        ("pkg/dup.py\n<<<<<<< SEARCH\npass\n=======\ny\n>>>>>>> REPLACE\n", "matches 2 places"),
        ("../outside.py\n<<<<<<< SEARCH\n=======\ny\n>>>>>>> REPLACE\n", "resolves outside the workspace"),
        ("/etc/passwd\n<<<<<<< SEARCH\n=======\ny\n>>>>>>> REPLACE\n", "absolute paths are not allowed"),
        ("nope.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n", "no such file"),
        ("just prose, no edit", "contains no SEARCH/REPLACE block"),
    ],
)
def test_bad_edits_change_nothing(repo: Path, text: str, message: str) -> None:
    # The first block is fine; the bad one must stop the whole answer from being applied.
    good = "README.md\n<<<<<<< SEARCH\n# demo\n=======\n# changed\n>>>>>>> REPLACE\n"
    with pytest.raises(EditError, match=message) as err:
        apply_plan(plan_edits(repo, parse_edits((good + text) if "no edit" not in text else text)))
    assert str(err.value).endswith("nothing was changed") or "no SEARCH/REPLACE" in str(err.value)
    assert (repo / "README.md").read_text() == "# demo\n"
    assert (repo / "pkg" / "math.py").read_text() == ORIGINAL
    assert not (repo.parent / "outside.py").exists()


def test_symlink_out_of_the_workspace_is_refused(repo: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("keep\n")
    os.symlink(secret, repo / "link.txt")
    with pytest.raises(EditError, match="resolves outside the workspace"):
        plan_edits(repo, parse_edits("link.txt\n<<<<<<< SEARCH\nkeep\n=======\ngone\n>>>>>>> REPLACE\n"))
    assert secret.read_text() == "keep\n"


def test_file_changed_after_preview_is_not_overwritten(repo: Path) -> None:
    plan = plan_edits(repo, parse_edits(ANSWER))
    (repo / "pkg" / "math.py").write_text(ORIGINAL + "# my own edit\n")
    with pytest.raises(EditError, match="pkg/math.py changed since the edit was previewed; nothing was changed"):
        apply_plan(plan)
    assert not (repo / "CHANGES.md").exists()


def test_undo_refuses_when_the_file_changed_after_apply(repo: Path) -> None:
    plan = plan_edits(repo, parse_edits(ANSWER))
    apply_plan(plan)
    (repo / "CHANGES.md").write_text("- typed add()\n- more\n")
    with pytest.raises(EditError, match="CHANGES.md changed since the edit was applied"):
        undo(plan)
    assert (repo / "CHANGES.md").read_text() == "- typed add()\n- more\n"


def test_file_mode_is_kept(repo: Path) -> None:
    script = repo / "run.sh"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    apply_plan(plan_edits(repo, parse_edits("run.sh\n<<<<<<< SEARCH\necho hi\n=======\necho bye\n>>>>>>> REPLACE\n")))
    assert script.stat().st_mode & 0o777 == 0o755
