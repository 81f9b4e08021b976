"""Do the local pair's answers about a repository say what they should? A small, honest check.

Each question of ``scripts/data/answer_questions.jsonl`` (about this repository) names terms
that a right answer uses (``expect``) and how many of them it must (``need``). An answer fails
when it uses fewer, when it is a bare citation (under ``MIN_WORDS`` words once its ``path:line``
citations are taken out: the default 1.5B sometimes answers with a file name alone), or when it
was stopped for repeating itself. Terms are a crude judge: they catch an answer that missed the
point or copied the wrong chunk, not one that is subtly wrong; read the answers (``--out``).

Each run is a `jarvis ask --json` through a daemon of its own (isolated XDG folders, only the
installed model files shared, as ``bench_ask.py``), greedy, so a run is repeatable on one machine.
To compare two versions of the code on the same questions and the same repository, run it twice,
``--code`` naming the older checkout (a ``git worktree``) the second time:

    .venv/bin/python scripts/eval_answers.py --out /tmp/now.json
    git worktree add /tmp/jarvis-old REV
    .venv/bin/python scripts/eval_answers.py --code /tmp/jarvis-old --out /tmp/old.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ask import isolated_env, jarvis  # noqa: E402  # the same isolated daemon

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ROOT / "scripts" / "data" / "answer_questions.jsonl"
#: Fewer words than this, once citations are taken out, and the answer is a bare citation.
MIN_WORDS = 8
_CITATION = re.compile(r"`?[\w./-]+\.\w+(?::\d+(?:-\d+)?)?`?")


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    found: tuple[str, ...]
    why: str


def judge(answer: str, finish_reason: str, expect: list[str], need: int) -> Verdict:
    """Whether ``answer`` uses ``need`` of the ``expect`` terms (case-insensitive), says more than
    a citation, and was not stopped for repeating itself; ``why`` names the first failure."""
    low = answer.lower()
    found = tuple(t for t in expect if t.lower() in low)
    words = len(_CITATION.sub(" ", answer).split())
    if finish_reason == "repetition":
        return Verdict(False, found, "stopped: it began repeating itself")
    if words < MIN_WORDS:
        return Verdict(False, found, f"a bare citation ({words} words besides citations)")
    if len(found) < need:
        return Verdict(False, found, f"uses {len(found)} of the terms, needs {need}")
    return Verdict(True, found, "")


def judged(question: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (an answer, with its ``finish_reason``) with ``question``'s terms and verdict."""
    v = judge(record["answer"], str(record.get("finish_reason") or ""), question["expect"], question["need"])
    return {**record, **question, "passed": v.passed, "found": list(v.found), "why": v.why}


def load_questions(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not (isinstance(row.get("question"), str) and isinstance(row.get("expect"), list)
                and isinstance(row.get("need"), int) and 0 < row["need"] <= len(row["expect"])):
            raise SystemExit(f"{path}:{n}: each line needs question, expect (terms) and need "
                             f"(1 to len(expect))")
        rows.append(row)
    if not rows:
        raise SystemExit(f"{path}: no questions")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=ROOT, help="the repository asked about (default: this one)")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="the checkout whose openjarvis answers (default: this one)")
    ap.add_argument("--questions", type=Path, default=QUESTIONS)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".local/share/openjarvis/models")
    ap.add_argument("--threads", type=int, default=0, help="engine.threads (0: physical cores)")
    ap.add_argument("--out", type=Path, help="write every answer and verdict here (JSON)")
    ap.add_argument("--rejudge", type=Path, metavar="JSON",
                    help="judge the answers an earlier --out saved against today's question file "
                         "(terms revised), asking nothing")
    args = ap.parse_args(argv)
    questions = load_questions(args.questions)
    if args.rejudge:
        saved = {r["question"]: r for r in json.loads(args.rejudge.read_text())["answers"]}
        missing = [q["question"] for q in questions if q["question"] not in saved]
        if missing:
            raise SystemExit(f"{args.rejudge}: no answer to {missing[0]!r}")
        report([judged(q, saved[q["question"]]) for q in questions])
        return 0
    code = args.code.resolve()
    if not (code / "openjarvis" / "__init__.py").is_file():
        raise SystemExit(f"--code {code}: not a checkout of this project (no openjarvis/ package)")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jarvis-eval-answers-") as tmp:
        env = {**isolated_env(Path(tmp), args.models_dir, args.threads), "PYTHONPATH": str(code)}
        print(f"indexing {args.repo} (code: {code})", file=sys.stderr)
        jarvis(env, "index", str(args.repo), cwd=code)  # cwd: python -m imports from it first
        try:
            for i, q in enumerate(questions, 1):
                t0 = time.perf_counter()
                out = subprocess.run(
                    [sys.executable, "-m", "openjarvis", "ask", "--json", "--local", "-C", str(args.repo),
                     "--max-tokens", str(args.max_tokens), q["question"]],
                    env=env, cwd=code, text=True, capture_output=True, check=False,
                )  # fmt: skip
                if out.returncode != 0:
                    raise SystemExit(f"jarvis ask failed ({out.returncode}): {out.stderr[-500:]}")
                res = json.loads(out.stdout)
                stats = res.get("stats", {})
                row = judged(q, {"answer": res["answer"], "tokens": stats.get("tokens"),
                                 "finish_reason": stats.get("finish_reason"),
                                 "sources": [f"{s['path']}:{s['start_line']}-{s['end_line']}" for s in res["sources"]],
                                 "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
                rows.append(row)
                print(f"[{i}/{len(questions)}] {'pass' if row['passed'] else 'FAIL'} {q['question']}"
                      f"{'' if row['passed'] else ' (' + row['why'] + ')'}", file=sys.stderr)
        finally:
            jarvis(env, "daemon", "stop", cwd=code)
    if args.out:
        args.out.write_text(json.dumps({"code": str(code), "repo": str(args.repo), "answers": rows}, indent=1))
    report(rows)
    return 0


def report(rows: list[dict[str, Any]]) -> None:
    print("| question | tokens | finish | terms found | verdict |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['question']} | {r['tokens']} | {r['finish_reason']} | {len(r['found'])} of "
              f"{len(r['expect'])} (needs {r['need']}) | {'pass' if r['passed'] else r['why']} |")
    passed = sum(r["passed"] for r in rows)
    print(f"\n{passed} of {len(rows)} answers pass")


if __name__ == "__main__":
    raise SystemExit(main())
