"""Retrieval over a real index of the language fixtures: search, definition, usages, repo map."""

from __future__ import annotations

from pathlib import Path

from openjarvis.index import rank
from openjarvis.index.search import (
    close_names,
    definition,
    is_overview,
    query_terms,
    repo_map,
    search,
    snippet,
    usages,
)
from openjarvis.index.store import Store


def test_query_terms() -> None:
    assert query_terms("How does parseHTTPResponse split the lines?") == [
        "parsehttpresponse", "parse", "http", "response", "split", "lines",
    ]  # fmt: skip
    assert query_terms("what is the") == []


def test_phrases_are_read_as_the_words_code_uses() -> None:
    # "up to date" is about freshness; its "date" would match date parsing
    assert query_terms("How does the index stay up-to-date?") == [
        "index", "stay", "fresh", "stale", "refresh"]  # fmt: skip
    assert query_terms("is the cache OUT OF DATE") == ["cache", "fresh", "stale", "refresh"]
    # a phrasal verb keeps its words and adds the compound an identifier would use
    assert query_terms("look up the view") == ["look", "up", "lookup", "view"]
    assert query_terms("shut  down the daemon, then set-up") == [
        "shut", "down", "shutdown", "daemon", "set", "up", "setup"]  # fmt: skip
    assert query_terms("update the date; lookups") == ["update", "date", "lookups"]


def test_a_freshness_question_finds_the_watcher_not_the_date_parser(workspace: Path) -> None:
    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.store import db_path_for

    # the date code shares more of the question's literal words (index, date, files, change)
    (workspace / "dates.py").write_text(
        'def index_by_date(files):\n    """Index files by date: the date each file last changed."""\n'
        "    return sorted(files)\n")
    (workspace / "watch.py").write_text(
        'class Watcher:\n    """Keep the index fresh: re-index paths as they change, so no entry '
        'goes stale."""\n\n    def on_change(self, path):\n        return path\n')
    with Store.open(db_path_for(workspace)) as s:
        index_workspace(s, workspace, IndexConfig(workers=1))
        hits = search(s, "How does the index stay up to date when files change?", k=2)
    assert hits[0].path == "watch.py"


def test_search_hits_carry_everything(store: Store) -> None:
    hits = search(store, "split a raw response", k=5)
    assert hits, "the fixtures talk about raw responses"
    top = hits[0]
    assert top.path.startswith("src/") and top.symbol and top.kind
    assert top.start_line <= top.end_line
    assert top.score > 0 and any(w in top.snippet.lower() for w in ("split", "raw", "response"))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_exact_symbol_name_ranks_its_definition_first(store: Store) -> None:
    hits = search(store, "formatName", k=3)
    assert (hits[0].path, hits[0].symbol, hits[0].kind) == ("src/tsx/sample.tsx", "formatName", "function")


def test_qualified_name_query(store: Store) -> None:
    hits = search(store, "Net.HttpClient.SplitLines", k=3)
    # The namespace is short enough to be one chunk, so the hit is that chunk.
    assert (hits[0].path, hits[0].symbol, hits[0].start_line) == ("src/csharp/sample.cs", "Net", 3)


def test_no_terms_no_hits(store: Store) -> None:
    assert search(store, "the of and", k=5) == []
    assert search(store, "zzzqqqxxx", k=5) == []


def test_focus_ranks_neighbours_up(workspace: Path) -> None:
    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.store import db_path_for

    (workspace / "a.py").write_text("def render_page():\n    return 'page'\n")
    (workspace / "b.py").write_text("def render_card():\n    return 'card'\n")
    (workspace / "main.py").write_text("from b import render_card\n\ndef run():\n    render_card()\n")
    with Store.open(db_path_for(workspace)) as s:
        index_workspace(s, workspace, IndexConfig(workers=1))
        weights = rank.Weights(graph_prior=5.0)
        focused = search(s, "render", k=2, focus=["main.py"], weights=weights)
    assert focused[0].path == "b.py"


def test_definition(store: Store) -> None:
    found = definition(store, "split_lines")
    assert {(d.path, d.qualname) for d in found} == {
        ("src/python/sample.py", "split_lines"),
        ("src/rust/sample.rs", "split_lines"),
        ("src/c/sample.c", "split_lines"),
        ("src/php/sample.php", "split_lines"),
        ("src/bash/sample.sh", "split_lines"),
        ("src/lua/sample.lua", "split_lines"),
        ("src/ruby/sample.rb", "Net.HttpClient.split_lines"),
    }
    found = definition(store, "HttpClient.parse_http_response")
    assert {d.path for d in found} == {"src/python/sample.py", "src/rust/sample.rs", "src/lua/sample.lua"}
    [exact] = [d for d in found if d.path.endswith(".py")]
    assert (exact.line, exact.kind) == (14, "method")
    assert exact.doc == "Split a raw response into status and body."
    assert definition(store, "splitlines")  # case-insensitive fallback
    assert definition(store, "nothing_like_this") == []


def test_usages_with_source_lines(store: Store, sample_repo: Path) -> None:
    found = [u for u in usages(store, "split_lines", root=sample_repo) if u.path.endswith(".py")]
    assert [(u.path, u.line, u.kind, u.text) for u in found] == [
        ("src/python/sample.py", 16, "call", "return split_lines(raw)")
    ]


def test_repo_map_fits_budget_and_skips_focus(store: Store) -> None:
    full = repo_map(store, budget_tokens=4000)
    assert "src/python/sample.py:" in full
    assert "def split_lines(text):" in full
    small = repo_map(store, budget_tokens=40)
    assert 0 < rank.approx_tokens(small) <= 40
    focused = repo_map(store, budget_tokens=4000, focus=["src/python/sample.py"])
    assert "src/python/sample.py:" not in focused


def test_snippet_prefers_lines_with_terms() -> None:
    text = "def a():\n    x = 1\n    return parse(x)\n"
    assert snippet(text, ["parse"]) == "return parse(x)"
    assert snippet(text, ["zzz"]) == "def a():\nx = 1\nreturn parse(x)"


def test_typos_find_close_names(store: Store) -> None:
    assert close_names(store, "splitLnes")[:2] == ["SplitLines", "splitLines"]
    assert close_names(store, "formatName") == []
    hits = search(store, "where is formatNmae", k=2)
    assert (hits[0].path, hits[0].symbol) == ("src/tsx/sample.tsx", "formatName")


GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "index_repo_map.txt"


def test_repo_map_golden(store: Store) -> None:
    """The map of the language fixtures at 300 tokens; regenerate with UPDATE_GOLDEN=1."""
    import difflib
    import os

    text = repo_map(store, budget_tokens=300)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "actual"))
    assert text == expected, diff


def test_tracer_sees_the_queries_of_a_search(sample_repo: Path, store: Store) -> None:
    from openjarvis.index.store import db_path_for

    seen: list[str] = []
    with Store.open(db_path_for(sample_repo), tracer=seen.append) as traced:
        search(traced, "split lines", k=3)
    matches = [sql for sql in seen if "MATCH" in sql]
    assert [sql.split(" FROM ")[1].split()[0] for sql in matches] == ["chunks_fts", "files_fts", "names_fts"]


def test_overview_questions_are_told_from_questions_about_a_part(overview_question: str) -> None:
    assert is_overview(overview_question)
    assert is_overview("Give me an overview of the architecture")
    assert not is_overview("Where are HTTP dates parsed?")
    assert not is_overview("how does parse_http_date handle two-digit years")
    assert not is_overview("recursively project each value to an observable")  # the verb
    for whole in ("What is this project for?", "what is the repo?", "Explain the architecture",
                  "the overall project structure", "the design of this codebase",
                  "a summary of the whole repository", "How is this repo organized?"):
        assert is_overview(whole), whole
    for part in ("How does the project price an order?", "how does the project print receipts",
                 "where is the CPU architecture detected", "what is the project's build command"):
        assert not is_overview(part), part


def test_an_overview_question_draws_on_the_readme_and_design_doc(
        overview_repo: Path, overview_question: str) -> None:
    """The README's opening says what the repository is; eight small router functions that repeat
    the question's words ("request", "flow", "repository") must not take its place."""
    from openjarvis.index.store import open_readonly

    with open_readonly(overview_repo) as store:
        hits = search(store, overview_question, k=8)
    places = [(h.path, h.start_line) for h in hits]
    assert ("README.md", 1) in places[:3], places
    assert "docs/DESIGN.md" in [h.path for h in hits[:3]], places
    assert any(h.path.startswith("shop/router/") for h in hits), "the code the question names stays"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_a_root_design_doc_is_not_crowded_out_by_the_readme(
        overview_repo: Path, overview_question: str) -> None:
    """Root files share one directory; the README's two opening chunks must not use up the share
    that a root ARCHITECTURE.md needs (each overview document counts as a directory of its own)."""
    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.store import Store, db_path_for

    (overview_repo / "ARCHITECTURE.md").write_text(
        "# Architecture\n\nThe stall runs one process: pricing, then receipts.\n"
    )
    with Store.open(db_path_for(overview_repo)) as store:
        index_workspace(store, overview_repo, IndexConfig(workers=1))
        hits = search(store, overview_question, k=4)
    assert "ARCHITECTURE.md" in [h.path for h in hits], [(h.path, h.start_line) for h in hits]


def test_a_named_definition_still_comes_first_in_a_question_about_the_project(overview_repo: Path) -> None:
    from openjarvis.index.store import open_readonly

    with open_readonly(overview_repo) as store:
        hits = search(store, "How does this project compute price_order totals?", k=8)
    assert (hits[0].path, hits[0].symbol) == ("shop/pricing/orders.py", "price_order")
