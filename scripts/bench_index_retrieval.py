"""Retrieval quality of hybrid search against plain BM25 over whole files, in the same run.

Usage::

    python scripts/bench_index.py --fetch                  # once: the three repositories
    python scripts/bench_index_retrieval.py [--show-misses]

The query set is ``scripts/data/index_queries.jsonl`` (``--queries`` picks another, such as the
held-out ``index_queries_holdout.jsonl``, written after the weights were fixed and never tuned
on): one JSON object per line with ``repo``
(django, express or rxjs), a natural-language ``question``, and the known answer: the ``path``
and qualified ``symbol`` of the definition that answers it. Every answer is checked to exist in
the index before scoring (a missing one fails the run), so the set stays honest as it grows.

Metrics, over all questions:

- file level (both systems): recall@1, recall@5 and MRR of the answer's file among the first
  distinct files returned (hybrid returns chunks; repeated files are collapsed in order);
- symbol level (hybrid only): a hit counts if it is in the answer's file and its lines overlap
  the answer definition's lines (from its first overload or declaration to its last line).

The baseline is SQLite FTS5 BM25 over one row per file (path and full text, ``porter unicode61``
tokenizer), queried with the question's words OR-ed after the same stopword list: the plain
"grep with ranking" a tool without an index would do.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_index import QUERIES, repo_roots  # noqa: E402

K = 5


def load_queries(path: Path = QUERIES) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def baseline_db(root: Path, paths: list[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE docs USING fts5(path, body, tokenize = 'porter unicode61')")
    rows = []
    for path in paths:
        try:
            rows.append((path, (root / path).read_text(encoding="utf-8", errors="replace")))
        except OSError:
            continue
    conn.executemany("INSERT INTO docs (path, body) VALUES (?, ?)", rows)
    return conn


def baseline_search(conn: sqlite3.Connection, question: str, k: int) -> list[str]:
    from openjarvis.index.search import STOPWORDS

    words = [w.lower() for w in re.findall(r"[A-Za-z0-9]+", question)]
    terms = list(dict.fromkeys(w for w in words if w not in STOPWORDS))
    if not terms:
        return []
    expr = " OR ".join(f'"{t}"' for t in terms)
    rows = conn.execute("SELECT path FROM docs WHERE docs MATCH ? ORDER BY rank LIMIT ?", (expr, k))
    return [r[0] for r in rows]


def first_rank(found: list[str], answer: str) -> int | None:
    return found.index(answer) + 1 if answer in found else None


def score(ranks: list[int | None]) -> dict[str, float]:
    n = len(ranks)
    return {
        "recall@1": sum(1 for r in ranks if r == 1) / n,
        "recall@5": sum(1 for r in ranks if r is not None and r <= 5) / n,
        "mrr": sum(1 / r for r in ranks if r is not None) / n,
    }


def main() -> None:
    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.search import search
    from openjarvis.index.store import Store

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "openjarvis-bench")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--queries", type=Path, default=QUERIES, help="a query set (JSON lines)")
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument("--ablate", action="store_true", help="also score hybrid with each signal removed")
    args = parser.parse_args()
    variants = ablations() if args.ablate else {}
    ablated: dict[str, list[int | None]] = defaultdict(list)

    queries = load_queries(args.queries)
    by_repo: dict[str, list[dict[str, str]]] = defaultdict(list)
    for q in queries:
        by_repo[q["repo"]].append(q)
    roots = repo_roots(args.cache)
    ranks: dict[str, list[int | None]] = defaultdict(list)
    per_repo: dict[str, dict[str, list[int | None]]] = defaultdict(lambda: defaultdict(list))
    missing: list[str] = []
    misses: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repo, items in sorted(by_repo.items()):
            root = roots[repo]
            with Store.open(Path(tmp) / f"{repo}.db") as store:
                index_workspace(store, root, IndexConfig(workers=args.workers))
                paths = [r[0] for r in store.conn.execute("SELECT path FROM files")]
                base = baseline_db(root, paths)
                for q in items:
                    span = store.conn.execute(
                        "SELECT min(s.line), max(s.end_line) FROM symbols s JOIN files f ON f.id = s.file_id "
                        "WHERE f.path = ? AND s.qualname = ? HAVING count(*) > 0",
                        (q["path"], q["symbol"]),
                    ).fetchone()
                    if span is None:
                        missing.append(f"{repo}: {q['path']} {q['symbol']}")
                        continue
                    hits = search(store, q["question"], k=20)
                    files = list(dict.fromkeys(h.path for h in hits))[:K]
                    sym_rank = next(
                        (i for i, h in enumerate(hits[:K], 1) if h.path == q["path"]
                         and h.start_line <= span[1] and h.end_line >= span[0]), None,
                    )  # fmt: skip
                    base_files = baseline_search(base, q["question"], K)
                    for name, rank in (
                        ("hybrid_file", first_rank(files, q["path"])),
                        ("hybrid_symbol", sym_rank),
                        ("bm25_whole_file", first_rank(base_files, q["path"])),
                    ):
                        ranks[name].append(rank)
                        per_repo[repo][name].append(rank)
                    for label, weights in variants.items():
                        got = search(store, q["question"], k=20, weights=weights)
                        ablated[label].append(first_rank(list(dict.fromkeys(h.path for h in got))[:K], q["path"]))
                    if args.show_misses and first_rank(files, q["path"]) is None:
                        misses.append(f"{repo}: {q['question']!r} -> want {q['path']}; got {files[:3]}")
                base.close()
    if missing:
        print("answers not found in the index (fix the query set):", *missing, sep="\n  ")
        raise SystemExit(1)
    print(f"# bench_index_retrieval {time.strftime('%Y-%m-%d %H:%M')} {args.queries.name}: {len(queries)} questions, "
          + ", ".join(f"{r} {len(v)}" for r, v in sorted(by_repo.items())) + "\n")  # fmt: skip
    print("| system | recall@1 | recall@5 | MRR |\n|---|---|---|---|")
    labels = {
        "hybrid_file": "hybrid search, file level",
        "bm25_whole_file": "BM25 over whole files (baseline), file level",
        "hybrid_symbol": "hybrid search, symbol level (chunk overlaps the answer)",
    }
    for name, label in labels.items():
        s = score(ranks[name])
        print(f"| {label} | {s['recall@1']:.3f} | {s['recall@5']:.3f} | {s['mrr']:.3f} |")
    print("\n| repo | questions | hybrid R@5 (file) | baseline R@5 (file) | hybrid R@5 (symbol) |")
    print("|---|---|---|---|---|")
    for repo, r in sorted(per_repo.items()):
        cells = [score(r[name])["recall@5"] for name in ("hybrid_file", "bm25_whole_file", "hybrid_symbol")]
        print(f"| {repo} | {len(r['hybrid_file'])} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    if variants:
        print("\n| hybrid variant (file level) | recall@1 | recall@5 | MRR |\n|---|---|---|---|")
        for label in variants:
            v = score(ablated[label])
            print(f"| {label} | {v['recall@1']:.3f} | {v['recall@5']:.3f} | {v['mrr']:.3f} |")
    for line in misses:
        print("miss:", line)


def ablations() -> dict[str, object]:
    """The default weights, and the same with one signal or prior switched off."""
    import dataclasses

    from openjarvis.index.rank import WEIGHTS

    def without(*names: str) -> dict[str, float]:
        return {k: (0.0 if k in names else v) for k, v in WEIGHTS.signals.items()}

    return {
        "all signals (default)": WEIGHTS,
        "without text (chunk BM25)": dataclasses.replace(WEIGHTS, signals=without("text")),
        "without file (whole-file BM25)": dataclasses.replace(WEIGHTS, signals=without("file")),
        "without name (symbol-name BM25)": dataclasses.replace(WEIGHTS, signals=without("name")),
        "without exact and fuzzy names": dataclasses.replace(WEIGHTS, signals=without("exact", "fuzzy")),
        "without graph prior (PageRank)": dataclasses.replace(WEIGHTS, graph_prior=0.0),
        "without path prior (prose, tests)": dataclasses.replace(WEIGHTS, prose=1.0, tests=1.0),
    }


if __name__ == "__main__":
    main()
