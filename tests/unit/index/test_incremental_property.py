"""Property: however a tree changes between runs, the incremental index equals a fresh one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openjarvis.config import IndexConfig
from openjarvis.index.indexer import index_workspace
from openjarvis.index.store import Store

from .test_store import snapshot

NAMES = st.sampled_from(["alpha", "beta", "gamma", "parse_http", "renderPage", "Client"])
SOURCES = st.lists(NAMES, min_size=0, max_size=4).map(
    lambda names: "".join(f"def {n}_{i}():\n    return {n}_{(i + 1) % 4}()\n\n" for i, n in enumerate(names))
)
TREES = st.dictionaries(st.sampled_from([f"pkg/m{i}.py" for i in range(6)] + ["README.md"]), SOURCES, max_size=6)


def write_tree(root: Path, tree: dict[str, str]) -> None:
    if root.exists():
        shutil.rmtree(root)
    for rel, text in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(exist_ok=True)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=TREES, second=TREES)
def test_incremental_equals_fresh(first: dict[str, str], second: dict[str, str]) -> None:
    config = IndexConfig(workers=1)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = base / "ws"
        write_tree(root, first)
        with Store.open(base / "incremental.db") as inc:
            index_workspace(inc, root, config)
            # Rewrite every file (new mtimes), then apply the second tree over the same folder.
            for rel in first:
                (root / rel).unlink()
            write_tree(root, second)
            index_workspace(inc, root, config)
            with Store.open(base / "fresh.db") as fresh:
                index_workspace(fresh, root, config)
                assert snapshot(inc) == snapshot(fresh)
