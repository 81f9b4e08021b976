"""Time to first token and total time of `jarvis ask`: a warm daemon against a cold one-shot run.

Cold: no daemon running; `jarvis ask` starts it, which loads the model pair, then answers.
Warm: the daemon is up with the models loaded (the previous question loaded them).
Both use the same repository index, verification stamps and measured cost models (built in a
warm-up run that is not counted), and the same questions in the same order, so the difference is
the daemon's warm state alone. Times are seen from the client: first byte of the answer on stdout,
and process exit.

``--prefix-cache`` measures the persistent prefix cache instead: every run is a cold one-shot
(the daemon stopped first, so nothing is left in memory) asking a question other than the
warm-up's, once with ``engine.prefix_cache`` on (the prompt's head, saved by the warm-up, is
loaded from disk) and once off (the head is prefilled), in alternating order. The answer's
statistics are read back from the history database to confirm what was loaded.

    python scripts/bench_ask.py --repo /path/to/repo --repeats 3
    python scripts/bench_ask.py --repo /path/to/repo --repeats 4 --prefix-cache

Isolated from the person's own setup: XDG folders live in a temporary directory; only the
installed model files are read from their usual place (`models.dir`).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTIONS = [
    "Where is the main entry point, and what does it do first?",
    "How are errors reported to the caller?",
    "Which function would I change to add a new configuration option?",
    "What does the test suite cover?",
    "How is data validated on input?",
    "Where are network requests made?",
]


def jarvis(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openjarvis", *args], env=env, cwd=cwd, text=True,
                          capture_output=True, check=True)  # fmt: skip


def isolated_env(home: Path, models_dir: Path, threads: int) -> dict[str, str]:
    """This process's environment with every XDG folder under ``home`` and no ``JARVIS_*``
    variable: a daemon of its own, nothing read from or written to the person's setup but the
    installed model files (``models.dir``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JARVIS_")}
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache"),
                     ("XDG_STATE_HOME", "state"), ("XDG_RUNTIME_DIR", "run")):  # fmt: skip
        (home / sub).mkdir()
        env[var] = str(home / sub)
    (home / "config" / "openjarvis").mkdir()
    (home / "config" / "openjarvis" / "config.toml").write_text(
        f'[models]\ndir = "{models_dir}"\n[engine]\nthreads = {threads}\n'
    )
    return env


def ask(env: dict[str, str], repo: Path, question: str, max_tokens: int) -> tuple[float, float, str]:
    """(seconds to the first answer byte, seconds to exit, the footer line) of one `jarvis ask`."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "openjarvis", "ask", "-C", str(repo), "--max-tokens", str(max_tokens), question],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    ttft = time.perf_counter() - start
    rest = proc.stdout.read()
    _, err = proc.communicate()
    total = time.perf_counter() - start
    if proc.returncode != 0 or not first:
        raise SystemExit(f"jarvis ask failed ({proc.returncode}): {err.decode()[-500:]}")
    del rest
    return ttft, total, err.decode().strip().splitlines()[-1]


def last_stats(home: Path) -> dict[str, object]:
    """The statistics the daemon stored with the newest answer (history database, read-only)."""
    (db,) = (home / "data").glob("openjarvis/history*.db")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (meta,) = conn.execute("SELECT meta FROM messages WHERE role = 'assistant' ORDER BY id DESC LIMIT 1").fetchone()
    finally:
        conn.close()
    stats: dict[str, object] = json.loads(meta)["stats"]
    return stats


def prefix_cache_runs(env: dict[str, str], home: Path, repo: Path, repeats: int, max_tokens: int) -> None:
    """A different question right after a daemon restart, with and without the disk cache."""
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(repeats):
        question = QUESTIONS[i % len(QUESTIONS)]
        for cached in (True, False) if i % 2 == 0 else (False, True):
            jarvis(env, "daemon", "stop")
            run_env = {**env, "JARVIS_ENGINE_PREFIX_CACHE": "true" if cached else "false"}
            ttft, total, footer = ask(run_env, repo, question, max_tokens)
            s = last_stats(home)
            if cached and not s.get("prefix_loaded"):
                raise SystemExit(f"run {i + 1}: the head was not loaded from disk ({s})")
            runs[cached].append((ttft, total))
            print(f"{'cache on ' if cached else 'cache off'} {i + 1}: first token {ttft:.2f} s, total {total:.2f} s,"
                  f" prompt {s['prompt_tokens']} tokens, head loaded {s.get('prefix_loaded')}"
                  f" (drafter {s.get('drafter_prefix_loaded')})  [{footer}]", file=sys.stderr)  # fmt: skip
    jarvis(env, "daemon", "stop")
    print(f"repository: {repo}; max_tokens {max_tokens}; {repeats} runs each (median, min–max);"
          " each run: daemon stopped, then `jarvis ask` (starts it, loads the pair, answers)")  # fmt: skip
    print("| run | time to first token, s | total, s |\n|---|---|---|")
    print(row("prefix cache off: the head is prefilled", runs[False]))
    print(row("prefix cache on: the head is loaded from disk", runs[True]))
    off = statistics.median(x[0] for x in runs[False])
    on = statistics.median(x[0] for x in runs[True])
    print(f"time to first token, off / on: {off / on:.2f}x ({off - on:.2f} s saved)")
    saved = [a[0] - b[0] for a, b in zip(runs[False], runs[True], strict=True)]  # same question, paired
    print(f"saved per question (paired): {statistics.median(saved):.2f} s ({min(saved):.2f}–{max(saved):.2f})")


def row(name: str, xs: list[tuple[float, float]]) -> str:
    t = [x[0] for x in xs]
    s = [x[1] for x in xs]
    return (f"| {name} | {statistics.median(t):.2f} ({min(t):.2f}–{max(t):.2f}) | "
            f"{statistics.median(s):.2f} ({min(s):.2f}–{max(s):.2f}) |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, required=True, help="a real repository to ask about")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".local/share/openjarvis/models")
    ap.add_argument("--threads", type=int, default=0, help="engine.threads (0: physical cores)")
    ap.add_argument("--prefix-cache", action="store_true", help="measure the persistent prefix cache (see above)")
    args = ap.parse_args()
    repo = args.repo.resolve()
    with tempfile.TemporaryDirectory(prefix="jarvis-bench-ask-") as tmp:
        home = Path(tmp)
        env = isolated_env(home, args.models_dir, args.threads)
        print(f"warm-up: indexing {repo} and asking once (not counted)", file=sys.stderr)
        jarvis(env, "index", str(repo))
        ask(env, repo, "What is this repository?", args.max_tokens)
        if args.prefix_cache:
            prefix_cache_runs(env, home, repo, args.repeats, args.max_tokens)
            return
        cold: list[tuple[float, float]] = []
        warm: list[tuple[float, float]] = []
        questions = iter(QUESTIONS * args.repeats)
        for i in range(args.repeats):
            jarvis(env, "daemon", "stop")
            ttft, total, footer = ask(env, repo, next(questions), args.max_tokens)
            cold.append((ttft, total))
            print(f"cold {i + 1}: first token {ttft:.2f} s, total {total:.2f} s  [{footer}]", file=sys.stderr)
            ttft, total, footer = ask(env, repo, next(questions), args.max_tokens)
            warm.append((ttft, total))
            print(f"warm {i + 1}: first token {ttft:.2f} s, total {total:.2f} s  [{footer}]", file=sys.stderr)
        jarvis(env, "daemon", "stop")

    print(f"repository: {repo}; max_tokens {args.max_tokens}; {args.repeats} runs each (median, min–max)")
    print("| run | time to first token, s | total, s |\n|---|---|---|")
    print(row("cold one-shot (daemon started by the ask)", cold))
    print(row("warm daemon", warm))
    ratio = statistics.median(x[0] for x in cold) / statistics.median(x[0] for x in warm)
    print(f"time to first token, cold / warm: {ratio:.1f}x")


if __name__ == "__main__":
    main()
