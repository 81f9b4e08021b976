"""Would a drafter that chooses among only N token ids still be accepted? (CPU, the real pair.)

A greedy drafter's output projection reads every one of its 151,936 rows each step (14 % of the
0.5B's step on the GPU); ``Runner.greedy_cols`` = N would read only the first N. This measures
what that costs in acceptance, teacher-forced as ``bench_gpu.py --acceptance`` does: the 1.5B
(llama.cpp) writes 120 greedy tokens after each of several cuts of this repository's code and
docs, the 0.5B is fed the same tokens, and a position counts when the drafter's argmax over the
allowed ids equals the verifier's token. Two choices of ids: the first N (byte-level BPE order,
roughly merge frequency) and the N most frequent in ~8 MB of the Python standard library (held
out: not this repository). Reports, per N, the share of the verifier's tokens inside the set
("coverage") and the drafter's acceptance.

    python scripts/bench_draft_vocab.py [--models DIR]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjarvis.engine.llama import LlamaEngine  # noqa: E402
from openjarvis.paths import models_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["openjarvis/engine/base.py", "openjarvis/config.py", "openjarvis/errors.py",
           "openjarvis/index/search.py", "openjarvis/router/service.py", "openjarvis/tui/app.py",
           "openjarvis/engine/speculative.py", "openjarvis/cli/index_cmd.py", "README.md",
           "docs/speculative.md"]
NS = (8192, 16384, 32768, 49152, 65536)
N_GEN = 120


def stdlib_rank(engine: LlamaEngine, n_vocab: int, max_bytes: int = 8_000_000) -> np.ndarray:
    """Token ids by how often they occur in the Python standard library's sources."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    seen = 0
    files = [f for f in sorted(glob.glob(f"{sys.base_prefix}/lib/python3*/**/*.py", recursive=True))
             if "/test" not in f]
    for f in files:
        try:
            text = Path(f).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        np.add.at(counts, np.array(engine.tokenize(text, special=False), dtype=np.int64), 1)
        seen += len(text)
        if seen > max_bytes:
            break
    return np.argsort(-counts, kind="stable")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=models_dir())
    args = ap.parse_args(argv)
    ver = LlamaEngine(args.models / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", context=2048)
    dra = LlamaEngine(args.models / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", context=2048)
    t0 = time.perf_counter()
    n_vocab = ver.n_vocab
    sets = {"first": {n: np.arange(n) for n in NS},
            "stdlib": {n: np.sort(r[:n]) for r in [stdlib_rank(dra, n_vocab)] for n in NS}}
    cover = {k: dict.fromkeys(NS, 0) for k in sets}
    hit = {k: dict.fromkeys(NS, 0) for k in sets}
    full = total = 0
    for src in SOURCES:
        text = (ROOT / src).read_text(encoding="utf-8")
        prompt = ver.tokenize(text[: len(text) // 2])[:500]
        ver.rollback(0)
        dra.rollback(0)
        last = ver.eval(prompt, last_only=True)[-1]
        gen: list[int] = []
        for _ in range(N_GEN):
            gen.append(int(np.argmax(last)))
            last = ver.eval(gen[-1:])[-1]
        rows = dra.eval(prompt + gen)[len(prompt) - 1 : len(prompt) - 1 + N_GEN]  # row i: token i
        g = np.array(gen)
        full += int((rows.argmax(-1) == g).sum())
        for kind, by_n in sets.items():
            for n, ids in by_n.items():
                cover[kind][n] += int(np.isin(g, ids).sum())
                hit[kind][n] += int((ids[rows[:, ids].argmax(-1)] == g).sum())
        total += N_GEN
    print(json.dumps({
        "positions": total, "accept_full": full / total,
        "coverage": {k: {n: c / total for n, c in v.items()} for k, v in cover.items()},
        "accept": {k: {n: c / total for n, c in v.items()} for k, v in hit.items()},
        "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
    ver.close()
    dra.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
