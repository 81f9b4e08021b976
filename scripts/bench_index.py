"""Speed of the codebase index on real code: full index, incremental freshness, query latency.

Usage::

    python scripts/bench_index.py --fetch            # download the sources (PyPI sdist, npm)
    python scripts/bench_index.py --repeat 3         # run; prints a Markdown table per part

The sources are fetched once into ``--cache`` (default ``~/.cache/openjarvis-bench``): Django's
sdist from PyPI (``pip download --no-binary :all:``) and two npm packages (``npm pack``). Nothing
here was written by us. Figures go in BENCHMARKS.md under ``## Index``.

Parts:

- full: a fresh index of Django's Python files (a tree of hard links to the sdist's ``*.py``)
  and of the whole sdist tree; wall time, files/s, lines/s, database size, peak RSS and CPU
  seconds of the whole process tree (writer, forkserver, parser pool), and the 1-minute load
  average when the run ended (the machine is shared: CPU seconds are the steadier figure);
- incremental: a watcher runs on the Python tree; 50 times, a random file gets a new function
  appended and the clock runs from the write until ``definition()`` on another connection finds
  it (p50/p95/max);
- query: ``search(k=10)`` over the retrieval query set and identifier queries, warm: wall and
  CPU milliseconds (p50/p95), CPU being the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DJANGO = "django==5.1.4"
NPM = ("express@4.21.2", "rxjs@7.8.1")
QUERIES = ROOT / "scripts" / "data" / "index_queries.jsonl"


def fetch(cache: Path) -> None:
    """Download and unpack the benchmark sources into ``cache`` (needs network once)."""
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", DJANGO,
         "-d", str(cache)], check=True,
    )  # fmt: skip
    subprocess.run(["npm", "pack", *NPM], cwd=cache, check=True)
    for archive in cache.glob("*.t*gz"):
        name = archive.name.split("-")[0].lower()
        dest = cache / name
        if not dest.exists():
            dest.mkdir()
            shutil.unpack_archive(archive, dest)


def repo_roots(cache: Path) -> dict[str, Path]:
    """The three repositories as workspaces: the Django sdist tree and the npm packages."""
    django = next((cache / "django").glob("Django-*"))
    return {"django": django, "express": cache / "express" / "package", "rxjs": cache / "rxjs" / "package"}


def python_tree(django: Path, dest: Path) -> Path:
    """Hard links to every ``*.py`` of the sdist, same relative paths (no copies, no symlinks)."""
    if dest.exists():
        shutil.rmtree(dest)
    for src in django.rglob("*.py"):
        target = dest / src.relative_to(django)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, target)
        except OSError:
            shutil.copy2(src, target)
    return dest


class TreeMeter:
    """Peak summed RSS and total CPU seconds of this process and all its descendants.

    The parser pool lives under a forkserver, so ``RUSAGE_CHILDREN`` would miss it; the tree is
    sampled every 20 ms instead (a worker's last few milliseconds of CPU may be missed).
    """

    def __init__(self) -> None:
        import threading

        import psutil

        self.peak = 0
        self._me = psutil.Process()
        self._cpu: dict[int, float] = {}
        self._start = self._cpu_of(self._me)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _cpu_of(proc: object) -> float:
        times = proc.cpu_times()  # type: ignore[attr-defined]
        return float(times.user + times.system)

    def _sample(self) -> None:
        import psutil

        total = 0
        for proc in [self._me, *self._me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
                self._cpu[proc.pid] = self._cpu_of(proc)
            except psutil.Error:
                pass
        self.peak = max(self.peak, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.02)

    @property
    def cpu_s(self) -> float:
        own = self._cpu_of(self._me) - self._start
        return own + sum(v for pid, v in self._cpu.items() if pid != self._me.pid)

    def __enter__(self) -> TreeMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def db_size(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def bench_full(root: Path, workers: int) -> dict[str, float]:
    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "index.db"
        with TreeMeter() as meter:
            started = time.perf_counter()
            with Store.open(db) as store:
                summary = index_workspace(store, root, IndexConfig(workers=workers))
            wall = time.perf_counter() - started
        size = db_size(db)
    return {
        "load_1m": os.getloadavg()[0],
        "files": summary.indexed, "lines": summary.lines, "wall_s": wall,
        "files_per_s": summary.indexed / wall, "lines_per_s": summary.lines / wall,
        "db_mb": size / 1e6, "peak_rss_mb": meter.peak / 1e6, "cpu_s": meter.cpu_s,
    }  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def bench_incremental(root: Path, edits: int, workers: int, seed: int) -> dict[str, float]:
    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.search import definition
    from openjarvis.index.store import Store
    from openjarvis.index.watch import Watcher

    rng = random.Random(seed)
    files = sorted(root.rglob("*.py"))
    chosen = rng.sample(files, edits)
    originals = {p: p.read_bytes() for p in chosen}
    latencies: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "index.db"
        config = IndexConfig(workers=workers)
        with Store.open(db) as store:
            index_workspace(store, root, config)
        try:
            with Watcher(root, config, db_path=db), Store.open(db) as reader:
                time.sleep(0.5)
                for i, path in enumerate(chosen):
                    name = f"bench_marker_{seed}_{i}"
                    # A fresh inode each time, as an editor's atomic save does on a hard link.
                    tmp_file = path.with_name(path.name + ".tmp~")
                    tmp_file.write_bytes(originals[path] + f"\n\ndef {name}():\n    pass\n".encode())
                    started = time.perf_counter()
                    os.replace(tmp_file, path)
                    deadline = started + 10
                    while not definition(reader, name):
                        if time.perf_counter() > deadline:
                            raise SystemExit(f"edit {i} not searchable after 10 s")
                        time.sleep(0.002)
                    latencies.append((time.perf_counter() - started) * 1000)
                    time.sleep(0.05)
        finally:
            for path, data in originals.items():
                tmp_file = path.with_name(path.name + ".tmp~")
                tmp_file.write_bytes(data)
                os.replace(tmp_file, path)
    return {
        "load_1m": os.getloadavg()[0],
        "edits": len(latencies), "p50_ms": statistics.median(latencies),
        "p95_ms": percentile(latencies, 95), "max_ms": max(latencies),
    }  # fmt: skip


def bench_queries(root: Path, workers: int) -> dict[str, float]:
    import json

    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.search import search
    from openjarvis.index.store import Store

    questions = [json.loads(line)["question"] for line in QUERIES.read_text().splitlines() if line]
    idents = ["QuerySet.get_or_create", "parse_http_date", "CsrfViewMiddleware", "slugify",
              "getHttpResponse", "make_password", "ForeignKey", "cached_property"]  # fmt: skip
    queries = questions + idents * 5
    times: list[float] = []
    cpu_times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "index.db"
        with Store.open(db) as store:
            index_workspace(store, root, IndexConfig(workers=workers))
            for q in queries[:10]:
                search(store, q, k=10)  # warm-up
            for q in queries:
                started, cpu = time.perf_counter(), time.process_time()
                search(store, q, k=10)
                times.append((time.perf_counter() - started) * 1000)
                cpu_times.append((time.process_time() - cpu) * 1000)
    return {
        "load_1m": os.getloadavg()[0],
        "queries": len(times), "p50_ms": statistics.median(times),
        "p95_ms": percentile(times, 95), "max_ms": max(times),
        "cpu_p50_ms": statistics.median(cpu_times), "cpu_p95_ms": percentile(cpu_times, 95),
    }  # fmt: skip


def table(title: str, rows: list[dict[str, float]]) -> str:
    keys = list(rows[0])
    out = [f"### {title}", "", "| run | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for i, row in enumerate(rows, 1):
        cells = [f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" for v in row.values()]
        out.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "openjarvis-bench")
    parser.add_argument("--fetch", action="store_true", help="download the sources and exit")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument("--parts", default="full,incremental,query")
    args = parser.parse_args()
    if args.fetch:
        fetch(args.cache)
        return
    roots = repo_roots(args.cache)
    py_root = python_tree(roots["django"], args.cache / "django-py")
    parts = set(args.parts.split(","))
    print(f"# bench_index {time.strftime('%Y-%m-%d %H:%M')} workers={args.workers} cpus={os.cpu_count()}\n")
    if "full" in parts:
        print(table("full index, Django *.py", [bench_full(py_root, args.workers) for _ in range(args.repeat)]))
        print(table("full index, whole Django sdist tree",
                    [bench_full(roots["django"], args.workers) for _ in range(args.repeat)]))  # fmt: skip
    if "incremental" in parts:
        rows = [bench_incremental(py_root, args.edits, args.workers, seed) for seed in range(args.repeat)]
        print(table(f"incremental: edit -> searchable, {args.edits} edits", rows))
    if "query" in parts:
        print(table("query latency, search(k=10)", [bench_queries(py_root, args.workers)
                                                    for _ in range(args.repeat)]))  # fmt: skip


if __name__ == "__main__":
    main()
