"""Pure ranking on tiny graphs: edges, PageRank, spreading to definitions, fusion, budgets."""

from __future__ import annotations

import pytest

from openjarvis.index import rank
from openjarvis.index.rank import MapEntry, Weights


def test_graph_edges_and_weights() -> None:
    defs = [(1, "parse_response"), (2, "helper"), (3, "_private")]
    refs = [(2, "parse_response", 4), (1, "helper", 1), (1, "_private", 1), (2, "missing", 9)]
    graph = rank.build_graph(defs, refs)
    assert graph.edges == {2: {1: 10.0 * 2.0}, 1: {2: 1.0, 3: 0.1}}
    assert graph.nodes == {1, 2, 3}


def test_names_defined_everywhere_link_nothing() -> None:
    w = Weights(max_definers=2)
    graph = rank.build_graph([(1, "get"), (2, "get"), (3, "get")], [(4, "get", 1)], weights=w)
    assert graph.edges == {}


def test_mentioned_names_weigh_more() -> None:
    plain = rank.build_graph([(1, "launch")], [(2, "launch", 1)])
    mentioned = rank.build_graph([(1, "launch")], [(2, "launch", 1)], mentioned=frozenset({"launch"}))
    assert mentioned.edges[2][1] == 10 * plain.edges[2][1]


def test_pagerank_star() -> None:
    # Three files use one hub: the hub ranks first, the users tie.
    graph = rank.build_graph([(0, "hub")], [(1, "hub", 1), (2, "hub", 1), (3, "hub", 1)])
    ranks = rank.pagerank(graph)
    assert sum(ranks.values()) == pytest.approx(1.0)
    assert max(ranks, key=ranks.__getitem__) == 0
    assert ranks[1] == pytest.approx(ranks[2]) == pytest.approx(ranks[3])


def test_personalisation_pulls_toward_focus() -> None:
    # 1 -> 0 and 2 -> 3: focusing on file 2 must rank 3 above 0.
    graph = rank.build_graph([(0, "alpha"), (3, "beta")], [(1, "alpha", 1), (2, "beta", 1)])
    plain = rank.pagerank(graph)
    focused = rank.pagerank(graph, {2: 1.0})
    assert plain[0] == pytest.approx(plain[3])
    assert focused[3] > focused[0]


def test_rank_definitions_spreads_file_rank_along_edges() -> None:
    graph = rank.build_graph(
        [(0, "alpha"), (0, "beta"), (1, "gamma")], [(2, "alpha", 4), (2, "beta", 1), (0, "gamma", 1)]
    )
    ranked = rank.rank_definitions(graph, {0: 0.5, 1: 0.2, 2: 0.3})
    assert [(f, n) for f, n, _ in ranked] == [(1, "gamma"), (0, "alpha"), (0, "beta")]
    assert ranked[0][2] == pytest.approx(0.5)
    assert ranked[1][2] == pytest.approx(0.3 * 2 / 3)


def test_fuse_reciprocal_rank_with_prior() -> None:
    w = Weights(rrf_k=0.0, signals={"a": 1.0, "b": 2.0}, graph_prior=1.0)
    fused = rank.fuse({"a": ["x", "y"], "b": ["y"]}, prior={"x": 1.0}, weights=w)
    assert fused == [("y", pytest.approx(0.5 + 2.0)), ("x", pytest.approx(1.0 * 2))]


def test_fuse_keeps_first_seen_order_on_ties() -> None:
    w = Weights(signals={"a": 1.0, "b": 1.0})
    assert [k for k, _ in rank.fuse({"a": ["p"], "b": ["q"]}, {}, w)] == ["p", "q"]


def test_normalise() -> None:
    assert rank.normalise({"a": 4.0, "b": 1.0, "c": 0.0}) == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert rank.normalise({}) == {}


def test_fit_to_budget_takes_the_longest_prefix_that_fits() -> None:
    items = ["aaaa", "bbbb", "cccc", "dddd"]

    def render(xs: object) -> str:
        return "".join(xs)  # type: ignore[arg-type]

    assert rank.fit_to_budget(items, render, 3) == "aaaabbbbcccc"
    assert rank.fit_to_budget(items, render, 0) == ""
    assert rank.fit_to_budget(items, render, 100) == "aaaabbbbccccdddd"


def test_render_map_groups_files_and_indents_members() -> None:
    text = rank.render_map(
        [
            MapEntry("b.py", 9, "Client.send", "def send(self, data):"),
            MapEntry("a.py", 1, "main", "def main():"),
            MapEntry("b.py", 3, "Client", "class Client:"),
        ]
    )
    assert text == (
        "a.py:\n"
        "  1: def main():\n"
        "b.py:\n"
        "  3: class Client:\n"
        "    9: def send(self, data):\n"
    )


def test_ambiguous_names_share_their_weight_and_stop_names_link_nothing() -> None:
    graph = rank.build_graph([(1, "render"), (2, "render"), (3, "super")], [(4, "render", 1), (4, "super", 5)])
    assert graph.edges == {4: {1: 0.5, 2: 0.5}}


def test_overview_documents_readme_first_then_root_then_docs() -> None:
    paths = ["docs/design.md", "src/README.md", "ARCHITECTURE.md", "readme.rst", "docs/README.md", "docs/gpu.md"]
    ordered = sorted((o, p) for p in paths if (o := rank.overview_doc_order(p)) is not None)
    assert [p for _, p in ordered] == ["readme.rst", "ARCHITECTURE.md", "docs/README.md", "docs/design.md"]


def test_overview_documents_lose_the_prose_discount_only_in_an_overview_question() -> None:
    w = Weights()
    assert rank.path_prior("README.md", False, w) == w.prose
    assert rank.path_prior("README.md", False, w, overview=True) == w.overview_doc
    assert rank.path_prior("NOTES.md", False, w, overview=True) == w.prose
    assert rank.path_prior("src/app.py", True, w, overview=True) == 1.0


def test_diversify_defers_a_groups_extra_entries_behind_the_others() -> None:
    ranked = [("a/1", 9.0), ("a/2", 8.0), ("a/3", 7.0), ("b/1", 6.0), ("a/4", 5.0), ("c/1", 4.0)]
    out = rank.diversify(ranked, lambda key: key.split("/")[0], per_group=2)
    assert [k for k, _ in out] == ["a/1", "a/2", "b/1", "c/1", "a/3", "a/4"]
    assert sorted(out) == sorted(ranked)  # nothing lost, scores untouched
