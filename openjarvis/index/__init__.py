"""The codebase index: tree-sitter symbols and chunks in SQLite, kept fresh, with hybrid retrieval.

Modules, one concept each:

- ``tags``: per-file extraction, ``(path, bytes, language) -> Extraction``, pure.
- ``files``: which files of a workspace are indexed, and why the others are skipped.
- ``schema``: numbered migrations of the per-workspace SQLite database.
- ``store``: the database: transactional writes per batch of files, FTS5 reads.
- ``indexer``: a full or incremental run, parsing in a process pool with one writer.
- ``rank``: the reference graph, personalised PageRank, fusion of signals, token budgets; pure.
- ``search``: hybrid ``search``, ``repo_map``, ``definition`` and ``usages`` over a store.
- ``watch``: a watchdog observer that feeds changed paths back to the indexer.

Heavy imports (tree-sitter grammars, watchdog) happen inside the functions that need them.
"""
