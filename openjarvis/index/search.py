"""Retrieval over an index: hybrid ``search``, ``repo_map``, ``definition`` and ``usages``.

``search`` gathers ranked lists of chunks, then fuses them with ``rank.fuse``:

- ``text``: BM25 over chunk text, path, symbol and the split identifier words (FTS5);
- ``file``: BM25 over whole files (``files_fts``), each file contributing its best chunks;
- ``name``: BM25 over symbol names (``names_fts``), a fuzzy match on definition names, keeping
  symbols that share two query words;
- ``exact``: definitions whose name or qualified name is a word of the query;
- ``fuzzy``: definitions whose name is close to one (``parse_htpp_date``), by ``close_names``;
- ``focus``: chunks of the focused files (the editor's or conversation's files), if any;
- ``overview``: for a question about the repository as a whole (``is_overview``) that names no
  definition, the openings of its overview documents (the root README first, then design /
  architecture pages);

and two priors: each file's PageRank in the reference graph (personalised toward the focus files
when given), and ``rank.path_prior`` (prose and test files weigh less, except overview documents
in an overview question). An overview question also takes at most
``Weights.overview_per_package`` chunks from one directory before every other has had its turn.

Example::

    with open_readonly(root) as store:
        hits = search(store, "parse http response", k=5)
        hits[0].path, hits[0].symbol, hits[0].start_line
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from openjarvis.index import rank
from openjarvis.index.store import Store
from openjarvis.index.tags import has_grammar, split_identifier, split_lines

#: Rows each ranked list contributes before fusion.
CANDIDATES = 60
#: Chunk hits read for the text and file signals.
TEXT_POOL = 400
#: Files the whole-file signal takes, and chunks it takes from each.
FILE_CANDIDATES = 30
CHUNKS_PER_FILE = 2
#: BM25 over chunks, columns weighted: path, symbol, text, split words.
_CHUNK_BM25 = "bm25(chunks_fts, 2.0, 6.0, 1.0, 1.0)"
#: The name signal keeps symbols sharing this many query words, from this many FTS rows.
NAME_MIN_WORDS = 2
NAME_POOL = 150
#: Reference graphs kept in memory (one per workspace and set of mentioned names).
GRAPH_CACHE_SIZE = 8
#: difflib similarity a name needs to count as a fuzzy match of a query identifier.
FUZZY_CUTOFF = 0.85
#: (file id, path, symbol, kind, start, end, is code) of a chunk.
_Info = tuple[int, str, str, str, int, int, bool]
SNIPPET_LINES = 3
SNIPPET_LINE_CHARS = 160
#: Leading chunks each overview document offers: two, since a README's first chunk may be only
#: its title and badges, with the sentence that says what the repository is in the next one.
OVERVIEW_CHUNKS = 2
#: What makes a question about the repository as a whole rather than a part of it: what the whole
#: is or does ("what does this repository do", "what is the project for?"), how it is organized,
#: its architecture, structure or purpose, the whole or entire repository, or an overview. Naming the repository is
#: not enough: "how does the project price an order?" asks about one part ("project" alone is also
#: a verb, as in "project each value"), and so does "where is the CPU architecture detected".
_WHOLE = r"(?:repository|repo|project|codebase|code\s*base)"
_THE = r"(?:this|the|my|our|your)"
_OVERVIEW = re.compile(
    rf"\bwhat\s+(?:does|do|is)\s+{_THE}\s+{_WHOLE}(?:\s+(?:do|does|for|about)\b|\s*[?,.;!]|\s*$)"
    rf"|\b(?:{_THE}|whole|entire|overall)\s+{_WHOLE}(?:'s)?\s+(?:architecture|structure|layout|design|purpose)\b"
    rf"|\b(?:architecture|structure|layout|design)\s+of\s+{_THE}\s+{_WHOLE}\b"
    rf"|\bhow\s+is\s+{_THE}\s+{_WHOLE}\s+(?:organi[sz]ed|structured|laid\s+out|built)\b"
    rf"|\b(?:whole|entire)\s+{_WHOLE}\b"
    r"|\b(?:the|this|overall|high[- ]level)\s+architecture\b"
    r"|\boverview\b",
    re.IGNORECASE,
)

STOPWORDS = frozenset(
    (
        "a an and are as at be by can do does for from how i if in into is it its of on or that the "
        "their then there these this to was we what when where which who why will with you your "
        "get gets code function method class file find me show does should would"
    ).split()
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
#: English phrases whose words mislead a match on code, and the words code uses for them. Phrasal
#: verbs that identifiers write as one word ("look up the view" for ``View.lookup``) add that word
#: and keep their own; "up to date" and "out of date" are about freshness, not dates, so their
#: words are replaced ("how does the index stay up to date" ranked a date parser above the
#: watcher that keeps the index fresh).
#: Not "log in", "sign in", "back up" or "check out": their words are as often literal ("the log
#: in the file", "go back up the stack", "check out this function").
_COMPOUNDS = ("look up", "set up", "shut down", "start up", "clean up", "time out", "sign up",
              "roll back", "tear down")
_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(?:up|out)[-\s]+(?:to|of)[-\s]+date\b", re.IGNORECASE), "fresh stale refresh"),
    *((re.compile(rf"\b{a}[-\s]+{b}\b", re.IGNORECASE), rf"\g<0> {a}{b}")
      for a, b in (c.split() for c in _COMPOUNDS)),
)


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: a chunk of a file, with the definition it belongs to."""

    path: str
    symbol: str
    kind: str
    start_line: int
    end_line: int
    score: float
    snippet: str


@dataclass(frozen=True, slots=True)
class Definition:
    path: str
    qualname: str
    kind: str
    line: int
    end_line: int
    signature: str
    doc: str


@dataclass(frozen=True, slots=True)
class Usage:
    path: str
    line: int
    kind: str
    text: str


def query_terms(query: str) -> list[str]:
    """Search words of a query: identifiers split into parts, stopwords dropped, order kept,
    misleading phrases read as code words (``_PHRASES``)."""
    terms: dict[str, None] = {}
    for pattern, words in _PHRASES:
        query = pattern.sub(words, query)
    for word in _WORD.findall(query):
        lower = word.lower()
        parts = split_identifier(word)
        if lower not in STOPWORDS or len(parts) > 1:
            terms.setdefault(lower, None)
        for part in parts:
            if part not in STOPWORDS and len(part) > 1:
                terms.setdefault(part, None)
    return list(terms)


def is_overview(query: str) -> bool:
    """Whether ``query`` asks about the repository as a whole ("what does this repository do?").

    Such a question is answered by the repository's own description; its words ("repository",
    "request") match scattered docstrings better than they match the README, so without this the
    answer is built from whichever package happens to say "repository" most.
    """
    return _OVERVIEW.search(query) is not None


def _fts_expr(terms: Sequence[str]) -> str:
    return " OR ".join(f'"{t}"' for t in terms)


def search(
    store: Store, query: str, k: int = 10, focus: Sequence[str] = (), weights: rank.Weights = rank.WEIGHTS
) -> list[Hit]:
    """The ``k`` best chunks for ``query``; ``focus`` paths pull their neighbourhood up."""
    terms = query_terms(query)
    if not terms:
        return []
    conn = store.conn
    signals: dict[str, list[int]] = {}
    expr = _fts_expr(terms)
    text_rows = conn.execute(
        f"SELECT c.id, c.file_id FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid "
        f"WHERE chunks_fts MATCH ? ORDER BY {_CHUNK_BM25} LIMIT ?",
        (expr, TEXT_POOL),
    ).fetchall()
    signals["text"] = [cid for cid, _ in text_rows[:CANDIDATES]]
    signals["file"] = _file_matches(store, expr, text_rows)
    signals["name"] = _name_matches(store, terms)
    signals["exact"] = _exact_chunks(store, _identifier_words(query))
    signals["fuzzy"] = _exact_chunks(
        store, [close for word in _identifier_words(query) for close in close_names(store, word, limit=3)]
    )
    # A question that names a definition is about it, whatever scope it mentions ("how does this
    # project compute price_order?"): the definition, not the README, should come first.
    overview = not signals["exact"] and is_overview(query)
    if overview:
        signals["overview"] = _overview_chunks(store)
    file_rank = _file_ranks(store, focus)
    if focus:
        ids = [r[0] for r in conn.execute(
            f"SELECT c.id FROM chunks c JOIN files f ON f.id = c.file_id "
            f"WHERE f.path IN ({','.join('?' * len(focus))}) LIMIT ?", (*focus, CANDIDATES)
        )]  # fmt: skip
        pool = set().union(*signals.values())
        signals["focus"] = [i for i in ids if i in pool]
    candidates = list(dict.fromkeys(i for ids in signals.values() for i in ids))
    if not candidates:
        return []
    info = _chunk_info(store, candidates)
    prior = {cid: file_rank.get(info[cid][0], 0.0) for cid in candidates if cid in info}
    mult = {cid: rank.path_prior(v[1], v[6], weights, overview) for cid, v in info.items()}
    fused = [(cid, score) for cid, score in rank.fuse(signals, prior, weights, mult) if cid in info]
    if overview:
        # Breadth over depth: pick the k across directories, then show them best first.
        fused = rank.diversify(fused, lambda cid: _package(info[cid][1]), weights.overview_per_package)
        fused = sorted(fused[:k], key=lambda kv: -kv[1])
    return [_hit(store, cid, score, info[cid], terms) for cid, score in fused[:k]]


def _package(path: str) -> str:
    """The directory a file lives in: the unit an overview question should not see ten hits of.
    Each overview document is a unit of its own, so that the README's chunks do not use up the
    root's share before a root ARCHITECTURE.md or DESIGN.md is reached."""
    if rank.overview_doc_order(path) is not None:
        return path
    return path.rpartition("/")[0]


def _overview_chunks(store: Store) -> list[int]:
    """The leading chunks of the repository's overview documents, root README first.

    Only the root and one folder down can hold one (``rank.overview_doc_order``); SQLite drops
    deeper paths before Python sees them, so the cost is one pass over the files table's paths.
    """
    docs = sorted(
        (order, path, fid)
        for fid, path in store.conn.execute("SELECT id, path FROM files WHERE path NOT LIKE '%/%/%'")
        if (order := rank.overview_doc_order(path)) is not None
    )
    out: list[int] = []
    for _, _, fid in docs:
        out.extend(
            r[0]
            for r in store.conn.execute(
                "SELECT id FROM chunks WHERE file_id = ? ORDER BY start_line LIMIT ?", (fid, OVERVIEW_CHUNKS)
            )
        )
    return out[:CANDIDATES]


def _name_matches(store: Store, terms: Sequence[str]) -> list[int]:
    """Chunks whose symbol name shares words with the query: two or more words (or the only one).

    A single shared word is too weak in a sentence (``url`` in "validate that a URL is well
    formed" would pull every ``url`` method); two rarely happen by chance.
    """
    need = min(NAME_MIN_WORDS, len(terms))
    wanted = set(terms)
    out: list[int] = []
    rows = store.conn.execute(
        "SELECT rowid, symbol FROM names_fts WHERE names_fts MATCH ? ORDER BY rank LIMIT ?",
        (_fts_expr(terms), NAME_POOL),
    )
    stems = _stems(wanted)
    for cid, symbol in rows:
        if len(stems & _stems({w.lower() for w in _WORD.findall(symbol)})) >= need:
            out.append(cid)
    return out[:CANDIDATES]


def _stems(words: set[str]) -> set[str]:
    # Crude plural folding, enough to match "values" to "value" as FTS5's porter stemmer does.
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words}


def _file_matches(store: Store, expr: str, text_rows: Sequence[tuple[int, int]]) -> list[int]:
    """The best chunks of the files that match best as a whole (BM25 over ``files_fts``).

    A question's words are often spread over a file (a class docstring, a method, a helper);
    this is the whole-file view, mapped back to each file's best chunks among ``text_rows``
    (chunk hits, best first) or, for a file with none there, its first chunk.
    """
    files = [
        r[0]
        for r in store.conn.execute(
            "SELECT rowid FROM files_fts WHERE files_fts MATCH ? ORDER BY bm25(files_fts, 2.0, 1.0, 1.0) LIMIT ?",
            (expr, FILE_CANDIDATES),
        )
    ]
    wanted = set(files)
    best: dict[int, list[int]] = {}
    for cid, fid in text_rows:
        if fid in wanted:
            kept = best.setdefault(fid, [])
            if len(kept) < CHUNKS_PER_FILE:
                kept.append(cid)
    missing = [fid for fid in files if fid not in best]
    if missing:
        for fid, cid in store.conn.execute(
            f"SELECT file_id, min(id) FROM chunks WHERE file_id IN ({','.join('?' * len(missing))}) GROUP BY file_id",
            missing,
        ):
            best[fid] = [cid]
    return [cid for fid in files for cid in best.get(fid, [])]


def _identifier_words(query: str) -> list[str]:
    """Words of the query that name code: all of a short query, else only identifier-shaped ones."""
    words = [w for w in re.findall(r"[A-Za-z_][\w.]*", query) if len(w) > 2]
    if len(words) <= 2:
        return words
    return [w for w in words if "_" in w or "." in w.strip(".") or (w[1:] != w[1:].lower())]


def close_names(store: Store, name: str, limit: int = 5) -> list[str]:
    """Defined names that look like ``name`` but are not it (typos, other casing), closest first.

    Candidates share the first two characters (an index range scan), then difflib ranks them.
    """
    import difflib

    short = name.rsplit(".", 1)[-1]
    if len(short) < 4:
        return []
    prefix = short[:2].replace("%", "").replace("_", "\\_")
    candidates = [
        r[0]
        for r in store.conn.execute(
            "SELECT DISTINCT name FROM symbols WHERE name LIKE ? ESCAPE '\\' LIMIT 5000", (prefix + "%",)
        )
        if r[0] != short
    ]
    lowered: dict[str, list[str]] = {}
    for c in candidates:
        lowered.setdefault(c.lower(), []).append(c)
    close = difflib.get_close_matches(short.lower(), list(lowered), n=limit, cutoff=FUZZY_CUTOFF)
    return [original for c in close for original in sorted(lowered[c])][:limit]


def _exact_chunks(store: Store, names: Sequence[str]) -> list[int]:
    out: list[int] = []
    for name in names:
        rows = store.conn.execute(
            "SELECT s.file_id, s.line FROM symbols s WHERE (s.name = ? COLLATE NOCASE "
            "OR s.qualname = ? COLLATE NOCASE) AND s.kind NOT IN ('variable', 'field') LIMIT 20",
            (name.rsplit(".", 1)[-1] if "." not in name else "\0", name),
        ).fetchall()
        for fid, line in rows:
            row = store.conn.execute(
                "SELECT id FROM chunks WHERE file_id = ? AND start_line <= ? AND end_line >= ? "
                "ORDER BY start_line DESC LIMIT 1",
                (fid, line, line),
            ).fetchone()
            if row and row[0] not in out:
                out.append(row[0])
    return out


def _file_ranks(store: Store, focus: Sequence[str]) -> dict[int, float]:
    if not focus:
        return store.file_ranks()
    ids = {
        r[0]
        for r in store.conn.execute(
            f"SELECT id FROM files WHERE path IN ({','.join('?' * len(focus))})", tuple(focus)
        )
    }
    return rank.normalise(rank.pagerank(_graph(store), {fid: 1.0 for fid in ids}))


#: Reference graphs by database path, with the files-table signature they were built from.
_GRAPHS: dict[tuple[str, frozenset[str]], tuple[tuple[object, ...], rank.Graph]] = {}


def _graph(store: Store, mentioned: frozenset[str] = frozenset()) -> rank.Graph:
    """The store's reference graph, rebuilt only when its files changed (0.7 s on Django)."""
    row = store.conn.execute("SELECT count(*), total(mtime_ns), total(size), max(id) FROM files").fetchone()
    signature = tuple(row)
    key = (str(store.path), mentioned)
    cached = _GRAPHS.get(key)
    if cached is not None and cached[0] == signature:
        return cached[1]
    defs, refs = store.graph_rows()
    graph = rank.build_graph(defs, refs, mentioned)
    if len(_GRAPHS) >= GRAPH_CACHE_SIZE:
        _GRAPHS.pop(next(iter(_GRAPHS)))
    _GRAPHS[key] = (signature, graph)
    return graph


def _chunk_info(store: Store, ids: Sequence[int]) -> dict[int, _Info]:
    marks = ",".join("?" * len(ids))
    rows = store.conn.execute(
        f"SELECT c.id, c.file_id, f.path, c.symbol, c.kind, c.start_line, c.end_line, f.language "
        f"FROM chunks c JOIN files f ON f.id = c.file_id WHERE c.id IN ({marks})",
        tuple(ids),
    )
    return {r[0]: (r[1], r[2], r[3], r[4], r[5], r[6], has_grammar(r[7])) for r in rows}


def _hit(
    store: Store, cid: int, score: float, info: _Info, terms: list[str]
) -> Hit:
    _, path, symbol, kind, start, end, _ = info
    row = store.conn.execute("SELECT text FROM chunks_fts WHERE rowid = ?", (cid,)).fetchone()
    return Hit(path, symbol, kind, start, end, round(score, 6), snippet(row[0] if row else "", terms))


def snippet(text: str, terms: Sequence[str]) -> str:
    """Up to three lines of ``text``: those that mention a term, else the first ones."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    wanted = [t for t in terms if len(t) > 2]
    chosen = [line for line in lines if any(t in line.lower() for t in wanted)][:SNIPPET_LINES]
    chosen = chosen or lines[:SNIPPET_LINES]
    return "\n".join(
        line if len(line) <= SNIPPET_LINE_CHARS else line[: SNIPPET_LINE_CHARS - 3] + "..."
        for line in chosen
    )


def definition(store: Store, name: str) -> list[Definition]:
    """Definitions named ``name`` (or with that qualified name, or ending in ``.name``)."""
    rows = store.conn.execute(
        "SELECT f.path, s.qualname, s.kind, s.line, s.end_line, s.signature, s.doc "
        "FROM symbols s JOIN files f ON f.id = s.file_id "
        "WHERE s.qualname = ? OR s.name = ? ORDER BY f.rank DESC, f.path, s.line",
        (name, name.rsplit(".", 1)[-1] if "." not in name else "\0"),
    ).fetchall()
    if not rows:
        rows = store.conn.execute(
            "SELECT f.path, s.qualname, s.kind, s.line, s.end_line, s.signature, s.doc "
            "FROM symbols s JOIN files f ON f.id = s.file_id "
            "WHERE s.qualname = ? COLLATE NOCASE OR s.name = ? COLLATE NOCASE "
            "ORDER BY f.rank DESC, f.path, s.line",
            (name, name),
        ).fetchall()
    return [Definition(*row) for row in rows]


def usages(store: Store, name: str, root: Path | None = None, limit: int = 1000) -> list[Usage]:
    """References to ``name`` (the last part of a dotted name), with the source line if ``root``."""
    short = name.rsplit(".", 1)[-1]
    grouped = store.conn.execute(
        "SELECT f.path, r.lines, r.kind FROM refs r JOIN files f ON f.id = r.file_id "
        "WHERE r.name = ? ORDER BY f.path",
        (short,),
    ).fetchall()
    rows = [
        (path, int(line), kind)
        for path, lines, _ in grouped
        for line, _, kind in (item.partition(":") for item in lines.split(","))
    ]
    rows = rows[:limit]
    cache: dict[str, list[str]] = {}
    out = []
    for path, line, kind in rows:
        text = ""
        if root is not None:
            if path not in cache:
                try:
                    cache[path] = split_lines((root / path).read_text(encoding="utf-8", errors="replace"))
                except OSError:
                    cache[path] = []
            lines = cache[path]
            text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        out.append(Usage(path, line, kind, text))
    return out


def repo_map(
    store: Store,
    budget_tokens: int = 1024,
    focus: Sequence[str] = (),
    mentioned: Sequence[str] = (),
) -> str:
    """The most relevant signatures of the repository as an outline within ``budget_tokens``.

    Files in ``focus`` are what the model already sees, so the map shows the rest: what they
    use and what uses them, ranked by personalised PageRank.
    """
    files = dict(store.conn.execute("SELECT id, path FROM files").fetchall())
    focus_ids = {fid for fid, path in files.items() if path in set(focus)}
    graph = _graph(store, frozenset(mentioned))
    file_rank = rank.pagerank(graph, {fid: 1.0 for fid in focus_ids} or None)
    scored = [
        (score * rank.path_prior(files[fid], True), fid, name)
        for fid, name, score in rank.rank_definitions(graph, file_rank)
        if fid not in focus_ids
    ]
    ranked = [(fid, name) for _, fid, name in sorted(scored, key=lambda t: -t[0])]
    # Files nothing references still deserve a line each, after the ranked definitions.
    entries: list[rank.MapEntry] = []
    seen: set[tuple[int, str]] = set()
    for fid, name in ranked[: budget_tokens * 2]:
        if (fid, name) in seen:
            continue
        seen.add((fid, name))
        for qualname, line, signature in store.conn.execute(
            "SELECT qualname, line, signature FROM symbols WHERE file_id = ? AND name = ? "
            "ORDER BY line LIMIT 3",
            (fid, name),
        ):
            entries.append(rank.MapEntry(files[fid], line, qualname, signature))
    return rank.fit_to_budget(entries, rank.render_map, budget_tokens)
