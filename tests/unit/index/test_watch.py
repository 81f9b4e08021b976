"""Freshness with a real watchdog observer: edits, atomic saves, deletes, moves, many files.

Every wait is bounded (``WAIT_S``) and polls the database; no timing is asserted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from openjarvis.config import IndexConfig
from openjarvis.index.indexer import index_workspace
from openjarvis.index.search import definition
from openjarvis.index.store import Store, db_path_for
from openjarvis.index.watch import Watcher

#: Generous: the watcher runs niced (``lower_priority``), so any other load on a 2-core machine
#: slows it several-fold (1,000 files: 1.9 s alone, 21.6 s beside three busy processes).
WAIT_S = 60.0


def eventually(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError("the index did not catch up within the bounded wait")


@pytest.fixture
def watched(workspace: Path) -> Iterator[tuple[Path, Store]]:
    (workspace / "app.py").write_text("def original():\n    return 1\n")
    config = IndexConfig(workers=1)
    with Store.open(db_path_for(workspace)) as store:
        index_workspace(store, workspace, config)
        with Watcher(workspace, config, rank_idle_s=0.2) as watcher:
            yield workspace, store
        assert watcher.errors == []


def paths(store: Store) -> set[str]:
    return {r[0] for r in store.conn.execute("SELECT path FROM files")}


def defined(store: Store, name: str) -> set[str]:
    return {d.path for d in definition(store, name)}


def test_edit_becomes_searchable(watched: tuple[Path, Store]) -> None:
    root, store = watched
    (root / "app.py").write_text("def renamed_function():\n    return 2\n")
    eventually(lambda: defined(store, "renamed_function") == {"app.py"})
    assert defined(store, "original") == set()


def test_atomic_save_via_rename(watched: tuple[Path, Store]) -> None:
    root, store = watched
    tmp = root / ".app.py.swp~"
    tmp.write_text("def saved_atomically():\n    return 3\n")
    os.replace(tmp, root / "app.py")
    eventually(lambda: defined(store, "saved_atomically") == {"app.py"})
    assert paths(store) == {"app.py"}


def test_delete_and_move(watched: tuple[Path, Store]) -> None:
    root, store = watched
    (root / "pkg").mkdir()
    (root / "pkg" / "mod.py").write_text("def in_package():\n    pass\n")
    eventually(lambda: "pkg/mod.py" in paths(store))
    (root / "pkg").rename(root / "lib")
    eventually(lambda: paths(store) == {"app.py", "lib/mod.py"})
    (root / "app.py").unlink()
    eventually(lambda: paths(store) == {"lib/mod.py"})


def test_checkout_touching_a_thousand_files(watched: tuple[Path, Store]) -> None:
    root, store = watched
    (root / "gen").mkdir()
    for i in range(1000):
        (root / "gen" / f"m{i}.py").write_text(f"def generated_{i}():\n    return {i}\n")
    eventually(lambda: len(paths(store)) == 1001)
    # A second "checkout": half the files go, a quarter change, the rest stay.
    for i in range(500):
        (root / "gen" / f"m{i}.py").unlink()
    for i in range(500, 750):
        (root / "gen" / f"m{i}.py").write_text(f"def switched_{i}():\n    return {i}\n")
    eventually(lambda: len(paths(store)) == 501 and defined(store, "switched_749") == {"gen/m749.py"})
    assert defined(store, "generated_0") == set()
    assert defined(store, "generated_600") == set()
    assert defined(store, "generated_999") == {"gen/m999.py"}


def test_ignored_and_secret_files_stay_out(watched: tuple[Path, Store]) -> None:
    root, store = watched
    (root / ".env").write_text("TOKEN=secret\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / "debug.log").write_text("noise\n")
    (root / "node_modules" / "lib").mkdir(parents=True)
    (root / "node_modules" / "lib" / "index.js").write_text("function dep() {}\n")
    (root / "kept.py").write_text("def kept():\n    pass\n")
    eventually(lambda: "kept.py" in paths(store))
    assert paths(store) == {"app.py", "kept.py", ".gitignore"}
