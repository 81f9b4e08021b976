"""The store and incremental runs: rows after indexing, freshness, crashes, migrations, FTS words."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from openjarvis.config import IndexConfig
from openjarvis.errors import IndexNotBuilt, IndexStoreError
from openjarvis.index import indexer, schema
from openjarvis.index.indexer import Progress, index_workspace
from openjarvis.index.store import Store, db_path_for, open_readonly

CONFIG = IndexConfig(workers=1)


def snapshot(store: Store) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the content tables, in a stable order (ids excluded where they can move)."""
    q = {
        "files": "SELECT path, language, size, hash, lines, error FROM files ORDER BY path",
        "symbols": "SELECT f.path, s.qualname, s.kind, s.line, s.end_line, s.signature, s.doc "
        "FROM symbols s JOIN files f ON f.id = s.file_id ORDER BY 1, 4, 2",
        "refs": "SELECT f.path, r.name, r.kind, r.count, r.lines FROM refs r "
        "JOIN files f ON f.id = r.file_id ORDER BY 1, 2",
        "chunks": "SELECT f.path, c.start_line, c.end_line, c.symbol, t.text FROM chunks c "
        "JOIN files f ON f.id = c.file_id JOIN chunks_fts t ON t.rowid = c.id ORDER BY 1, 2",
    }
    return {k: [tuple(r) for r in store.conn.execute(sql)] for k, sql in q.items()}


def test_index_rows(store: Store) -> None:
    rows = store.conn.execute(
        "SELECT f.path, s.qualname, s.kind, s.line FROM symbols s JOIN files f ON f.id = s.file_id "
        "WHERE f.path = 'src/python/sample.py' ORDER BY s.line"
    ).fetchall()
    assert rows == [
        ("src/python/sample.py", "MAX_RETRIES", "constant", 6),
        ("src/python/sample.py", "HttpClient", "class", 9),
        ("src/python/sample.py", "HttpClient.timeout", "field", 12),
        ("src/python/sample.py", "HttpClient.parse_http_response", "method", 14),
        ("src/python/sample.py", "split_lines", "function", 20),
    ]
    languages = dict(store.conn.execute("SELECT language, count(*) FROM files GROUP BY language"))
    assert languages["python"] == 1 and languages["markdown"] == 1 and len(languages) == 15
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_second_run_changes_nothing(store: Store, sample_repo: Path) -> None:
    before = snapshot(store)
    summary = index_workspace(store, sample_repo, CONFIG)
    assert (summary.indexed, summary.deleted, summary.unchanged) == (0, 0, summary.scanned)
    assert snapshot(store) == before


def test_touch_without_content_change_is_not_reparsed(store: Store, sample_repo: Path) -> None:
    path = sample_repo / "src/python/sample.py"
    path.write_bytes(path.read_bytes())
    summary = index_workspace(store, sample_repo, CONFIG)
    assert (summary.indexed, summary.unchanged) == (0, summary.scanned)


def test_edit_delete_and_rename(store: Store, sample_repo: Path) -> None:
    (sample_repo / "src/python/sample.py").write_text("def brand_new():\n    return 2\n")
    (sample_repo / "src/go/sample.go").unlink()
    (sample_repo / "src/lua/sample.lua").rename(sample_repo / "src/lua/moved.lua")
    summary = index_workspace(store, sample_repo, CONFIG)
    assert (summary.indexed, summary.deleted) == (2, 2)
    paths = {r[0] for r in store.conn.execute("SELECT path FROM files")}
    assert "src/go/sample.go" not in paths and "src/lua/sample.lua" not in paths
    assert "src/lua/moved.lua" in paths
    py = store.conn.execute(
        "SELECT s.qualname FROM symbols s JOIN files f ON f.id = s.file_id "
        "WHERE f.path = 'src/python/sample.py'"
    ).fetchall()
    assert py == [("brand_new",)]
    orphans = store.conn.execute(
        "SELECT (SELECT count(*) FROM symbols WHERE file_id NOT IN (SELECT id FROM files)) + "
        "(SELECT count(*) FROM refs WHERE file_id NOT IN (SELECT id FROM files)) + "
        "(SELECT count(*) FROM chunks WHERE file_id NOT IN (SELECT id FROM files)) + "
        "(SELECT count(*) FROM chunks_fts WHERE rowid NOT IN (SELECT id FROM chunks)) + "
        "(SELECT count(*) FROM names_fts WHERE rowid NOT IN (SELECT id FROM chunks)) + "
        "(SELECT count(*) FROM files_fts WHERE rowid NOT IN (SELECT id FROM files))"
    ).fetchone()[0]
    assert orphans == 0


def test_interrupted_run_leaves_a_consistent_db_and_resumes(
    sample_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexer, "WRITE_BATCH", 4)

    def interrupt(p: Progress) -> None:
        if p.done == 10:
            raise KeyboardInterrupt

    db = db_path_for(sample_repo)
    with Store.open(db) as s, pytest.raises(KeyboardInterrupt):
        index_workspace(s, sample_repo, CONFIG, on_progress=interrupt)
    with Store.open(db) as s:
        assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        indexed = s.conn.execute("SELECT count(*) FROM files").fetchone()[0]
        assert indexed == 8  # two whole batches committed, the third rolled back
        without_chunks = s.conn.execute(
            "SELECT count(*) FROM files WHERE id NOT IN (SELECT file_id FROM chunks)"
        ).fetchone()[0]
        assert without_chunks == 0
        summary = index_workspace(s, sample_repo, CONFIG)
        assert summary.indexed == summary.scanned - 8
        full = snapshot(s)
    with Store.open(db.with_name("fresh.db")) as fresh:
        index_workspace(fresh, sample_repo, CONFIG)
        assert snapshot(fresh) == full


def test_pool_and_serial_runs_write_the_same_rows(sample_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(indexer, "POOL_MIN_FILES", 1)
    root = sample_repo
    with Store.open(root.parent / "pool.db") as pooled, Store.open(root.parent / "serial.db") as serial:
        index_workspace(pooled, root, IndexConfig(workers=2))
        index_workspace(serial, root, CONFIG)
        assert snapshot(pooled) == snapshot(serial)


@pytest.mark.parametrize(
    "query", ["parseHTTPResponse", "parse_http_response", "http response", "ParseHttpResponse"]
)
def test_code_aware_full_text(workspace: Path, query: str) -> None:
    (workspace / "client.js").write_text(
        "function parseHTTPResponse(raw) {\n  return raw.split('\\n');\n}\n"
    )
    (workspace / "other.js").write_text("function unrelated() {\n  return 1;\n}\n")
    from openjarvis.index.search import search

    with Store.open(db_path_for(workspace)) as s:
        index_workspace(s, workspace, CONFIG)
        hits = search(s, query, k=3)
    assert [(h.path, h.symbol) for h in hits] == [("client.js", "parseHTTPResponse")]


def test_migrations_are_recorded_once(workspace: Path) -> None:
    db = db_path_for(workspace)
    Store.open(db).close()
    with Store.open(db) as s:
        rows = s.conn.execute("SELECT version, name FROM _migrations").fetchall()
    assert rows == [(v, n) for v, n, _ in schema.MIGRATIONS]


def test_newer_schema_is_refused(workspace: Path) -> None:
    db = db_path_for(workspace)
    Store.open(db).close()
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO _migrations VALUES (99, 'future', 'now')")
    conn.commit()
    conn.close()
    with pytest.raises(IndexStoreError, match="schema version 99, newer than this Open Jarvis"):
        Store.open(db)


def test_corrupt_database_names_the_fix(workspace: Path) -> None:
    db = db_path_for(workspace)
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(IndexStoreError, match=r"rebuild it with `jarvis index --rebuild`"):
        Store.open(db)


def test_reading_a_workspace_never_indexed(workspace: Path) -> None:
    with pytest.raises(IndexNotBuilt, match="has no index yet; run `jarvis index "):
        open_readonly(workspace)


def test_upgrade_from_schema_1_reindexes_for_the_new_table(
    sample_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = db_path_for(sample_repo)
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
        m.setattr(schema, "SCHEMA_VERSION", 1)
        m.setattr("openjarvis.index.store.Store._write_one", _write_v1)
        with Store.open(db) as old:
            assert index_workspace(old, sample_repo, CONFIG).indexed == 15
    with Store.open(db) as new:
        assert new.conn.execute("SELECT count(*) FROM files WHERE hash = ''").fetchone()[0] == 15
        assert index_workspace(new, sample_repo, CONFIG).indexed == 15
        assert new.conn.execute("SELECT count(*) FROM files_fts").fetchone()[0] == 15


def _write_v1(self: Store, conn: sqlite3.Connection, record: object) -> None:
    """What version 1 wrote: the files row only (enough to test the upgrade path)."""
    from openjarvis.index.store import FileRecord

    assert isinstance(record, FileRecord)
    conn.execute(
        "INSERT INTO files (language, size, mtime_ns, hash, path) VALUES (?, ?, ?, ?, ?)",
        (record.language, record.size, record.mtime_ns, record.hash, record.path),
    )


def test_interrupt_with_the_pool_running(sample_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(indexer, "POOL_MIN_FILES", 1)
    monkeypatch.setattr(indexer, "WRITE_BATCH", 4)

    def interrupt(p: Progress) -> None:
        if p.done == 6:
            raise KeyboardInterrupt

    db = db_path_for(sample_repo)
    with Store.open(db) as s, pytest.raises(KeyboardInterrupt):
        index_workspace(s, sample_repo, IndexConfig(workers=2), on_progress=interrupt)
    with Store.open(db) as s:
        assert s.conn.execute("SELECT count(*) FROM files").fetchone()[0] == 4
        assert index_workspace(s, sample_repo, IndexConfig(workers=2)).indexed == 11


def test_connections_opening_a_fresh_index_at_once_do_not_collide(tmp_path: Path) -> None:
    """The daemon, its watcher and the CLI may open a new index together: switching the fresh
    file to WAL from several connections at once answers "database is locked" immediately,
    which ``Store.open`` waits out rather than reporting a corrupt index."""
    from concurrent.futures import ThreadPoolExecutor

    from openjarvis.index.store import Store

    def open_index(_: int) -> None:
        with Store.open(tmp_path / "fresh" / "index.db"):
            pass

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(open_index, range(8)))  # re-raises the first failure here
