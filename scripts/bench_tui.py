"""Benchmark the TUI as a person meets it, in a real terminal (tmux, 80x24).

1. Start-up: time from running bare `jarvis` to the first painted screen (the footer) and to an
   interactive one (connected to the daemon: the status bar shows the index state), with the
   daemon already running (the everyday case), then with it stopped (the TUI starts it).
2. Keystroke-to-paint: time from a key sent to tmux until the typed character is on the screen,
   while idle (the floor, including tmux's own capture cost) and while an answer streams.

Everything runs in a private home with its own daemon; the real default pair is used when its
files are found (``--models-dir``, default: the test cache), else the tiny generated models.
Timing is by polling ``tmux capture-pane`` (a few ms per poll), so figures carry that resolution.

    python scripts/bench_tui.py --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = Path.home() / ".cache" / "openjarvis-tests" / "models"
REAL_FILES = ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
KEYS = "abcdefghijklmnopqrstuvwxyz"


class Tmux:
    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.server = f"jarvis-bench-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.started = time.perf_counter()
        self.run("new-session", "-d", "-x", "80", "-y", "24", "-c", str(cwd), command)

    def run(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.server, "-f", "/dev/null", *args], capture_output=True, text=True, env=self.env
        )
        return out.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "0")

    def wait(self, predicate: Any, timeout: float = 120.0) -> tuple[float, str]:
        """Seconds until ``predicate(screen)`` holds, measured from now, and that screen."""
        t0 = time.perf_counter()
        while True:
            s = self.screen()
            if predicate(s):
                return time.perf_counter() - t0, s
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"screen never matched in {timeout}s:\n{s}")
            time.sleep(0.002)

    def close(self) -> None:
        self.run("kill-server")


def interactive(s: str) -> bool:
    return "index:" in s and "^p" in s


def setup(home: Path, models_dir: Path, tiny: bool) -> tuple[dict[str, str], Path, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JARVIS_", "TMUX", "XDG_"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home / "run"), TERM="xterm-256color")
    jarvis = [sys.executable, "-m", "openjarvis"]
    cfg = home / ".config" / "openjarvis"
    cfg.mkdir(parents=True)
    if tiny:
        sys.path.insert(0, str(ROOT / "scripts"))
        from make_tiny_gguf import make_tiny_gguf

        for role, seed in (("drafter", 1), ("verifier", 0)):
            path = make_tiny_gguf(home / f"{role}.gguf", role=role, seed=seed)
            subprocess.run([*jarvis, "models", "add", str(path), "--id", f"tiny-{role[0]}"], env=env, check=True,
                           capture_output=True)  # fmt: skip
        (cfg / "models" / "pairs.toml").write_text('[[pairs]]\nid = "tiny"\ndrafter = "tiny-d"\nverifier = "tiny-v"\n')
        (cfg / "config.toml").write_text(
            '[models]\npair = "tiny"\n[engine]\ncontext = 4096\nthreads = 1\n[generation]\nmax_tokens = 1500\n'
        )
        label = "tiny generated pair"
    else:
        (cfg / "config.toml").write_text(
            f'[models]\ndir = "{models_dir}"\n[generation]\nmax_tokens = 160\nprompt_budget = 512\n'
        )
        label = "Qwen2.5-Coder 0.5B + 1.5B Q4_K_M"
    ws = home / "repo"
    shutil.copytree(ROOT / "openjarvis" / "tui", ws / "tui")
    (ws / ".git").mkdir()
    subprocess.run([*jarvis, "daemon", "start"], env=env, check=True, capture_output=True)
    subprocess.run([*jarvis, "index"], env=env, cwd=ws, check=True, capture_output=True)
    return env, ws, label


def startup(env: dict[str, str], ws: Path) -> tuple[float, float]:
    """Seconds from launching bare `jarvis` to the first paint and to the interactive screen."""
    term = Tmux(f"{sys.executable} -m openjarvis", ws, env)
    try:
        term.wait(lambda s: "^p" in s)
        paint = time.perf_counter() - term.started
        term.wait(interactive)
        return paint, time.perf_counter() - term.started
    finally:
        term.run("send-keys", "-t", "0", "C-q")
        term.close()


def answer_started(screen: str, question: str) -> bool:
    """Some answer text is painted below the question in the conversation column."""
    lines = screen.splitlines()
    at = next((i for i, line in enumerate(lines) if question[:30] in line), None)
    if at is None:
        return False
    for line in lines[at + 1 :]:
        if line.startswith("╭"):
            return False
        if line[:50].strip():
            return True
    return False


def keystrokes(term: Tmux, n: int, *, while_streaming: bool) -> list[float]:
    """Latency of ``n`` keys; while streaming, only keys sent and painted during the answer count."""
    out: list[float] = []
    typed = ""
    for i in range(n):
        ch = KEYS[i % len(KEYS)]
        typed += ch
        t0 = time.perf_counter()
        term.run("send-keys", "-t", "0", "-l", ch)
        _, screen = term.wait(lambda s, want=typed: any(line.strip("│ ").endswith(want) for line in s.splitlines()))
        if while_streaming and "answering" not in screen:
            break
        out.append(time.perf_counter() - t0)
        time.sleep(0.05)
    term.run("send-keys", "-t", "0", *(["BSpace"] * len(typed)))
    return out


def summarize(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    xs = sorted(xs)
    return {
        "n": len(xs),
        "median_ms": round(1000 * statistics.median(xs), 1),
        "p90_ms": round(1000 * xs[min(len(xs) - 1, int(0.9 * len(xs)))], 1),
        "max_ms": round(1000 * xs[-1], 1),
        "min_ms": round(1000 * xs[0], 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="repetitions of each measurement")
    ap.add_argument("--keys", type=int, default=20, help="keystrokes per run")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS)
    ap.add_argument("--tiny", action="store_true", help="use the tiny generated models even if the real pair exists")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("error: tmux is not installed (apt-get install -y tmux)", file=sys.stderr)
        return 2
    tiny = args.tiny or not all((args.models_dir / f).is_file() for f in REAL_FILES)
    home = Path(tempfile.mkdtemp(prefix="jarvis-bench-tui-"))
    env, ws, label = setup(home, args.models_dir, tiny)
    report: dict[str, Any] = {"models": label, "cores": os.cpu_count(), "runs": args.runs}
    try:
        paints, readies = [], []
        for _ in range(args.runs):
            paint, ready = startup(env, ws)
            paints.append(paint)
            readies.append(ready)
        report["startup_first_paint"] = summarize(paints)
        report["startup_interactive"] = summarize(readies)
        cold = []
        for _ in range(args.runs):  # no daemon running: the TUI starts it (models load on first question)
            subprocess.run([sys.executable, "-m", "openjarvis", "daemon", "stop"], env=env, capture_output=True)
            cold.append(startup(env, ws)[1])
        report["startup_interactive_daemon_stopped"] = summarize(cold)
        idle: list[float] = []
        streaming: list[float] = []
        rates: list[float] = []
        for r in range(args.runs):
            term = Tmux(f"{sys.executable} -m openjarvis", ws, env)
            try:
                term.wait(interactive)
                idle += keystrokes(term, args.keys, while_streaming=False)
                question = f"Explain how the diff review works, in detail ({r})."
                term.run("send-keys", "-t", "0", "-l", question)
                term.run("send-keys", "-t", "0", "Enter")
                term.wait(lambda s: "answering" in s)
                term.wait(lambda s, q=question: answer_started(s, q) or "answering" not in s, timeout=300)
                streaming += keystrokes(term, args.keys, while_streaming=True)
                _, s = term.wait(lambda s: "tok/s" in s, timeout=600)
                line = next((x for x in s.splitlines() if "tok/s" in x), "")
                rates.append(float(line.split(" tok/s")[0].split()[-1]))
            finally:
                term.close()
        report["keystroke_idle"] = summarize(idle)
        report["keystroke_streaming"] = summarize(streaming)
        report["stream_tokens_per_s"] = [round(r, 1) for r in rates]
    finally:
        subprocess.run([sys.executable, "-m", "openjarvis", "daemon", "stop"], env=env, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
