#!/usr/bin/env python3
"""What the loop stop costs a generated piece of text (``speculative._LoopCheck.push``).

The check runs once for every piece the speculator emits, so its cost is added to every token.
Timed on the answer's window as it grows (up to ``LOOP_WINDOW``, 8 KB), against the line check
alone (``repeats_itself``, the loop stop before the in-line one) in the same run:

- prose: an answer of ordinary sentences, 12-character pieces, no loop;
- zeros: one long line of ``0, 0, 0, ...`` outside code, the in-line check's worst case (every
  candidate length is periodic and has to be rejected);
- code: the same line inside a fenced block, where the in-line check holds it to the code
  rule (a sentence-like unit only, ``LOOP_CODE_FACTOR`` times as many copies) since session
  20; before, it skipped code.

Each figure is the median over rounds of the mean microseconds a piece::

    .venv/bin/python scripts/bench_loop_check.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjarvis.engine.speculative import LOOP_WINDOW, _loop_window, _LoopCheck, repeats_itself

PROSE = ("The daemon indexes the workspace with tree-sitter and keeps it fresh with a watcher. "
         "A question is routed by the policy, answered by the drafter and the verifier, and "
         "streamed back with its sources.\n")


def texts() -> dict[str, tuple[str, str]]:
    """(what came before, the text streamed) of each case; each fills the window."""
    words = [f"{w}{i % 97}" for i, w in enumerate(PROSE.split() * 60)]
    prose = "\n".join(" ".join(words[i : i + 14]) for i in range(0, len(words), 14))
    zeros = "[" + "0, " * (LOOP_WINDOW // 3)
    return {"prose": ("", prose[:LOOP_WINDOW]), "zeros": ("", zeros),
            "code": ("```python\n", zeros)}


def per_piece_us(fn: Callable[[str], object], text: str, piece: int) -> float:
    t = time.perf_counter()
    n = 0
    for i in range(0, len(text), piece):
        fn(text[i : i + piece])
        n += 1
    return (time.perf_counter() - t) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--piece", type=int, default=12, help="characters a piece (about 3 tokens)")
    args = ap.parse_args(argv)
    print("| text | line check alone (us a piece) | the loop stop (us a piece) | ratio |")
    print("|---|---|---|---|")
    for name, (before, text) in texts().items():
        ours, base = [], []
        for _ in range(args.rounds):
            check = _LoopCheck(4, before)
            ours.append(per_piece_us(check.push, text, args.piece))
            recent = [_loop_window(before)]

            def line_only(piece: str, recent: list[str] = recent) -> bool:
                recent[0] = _loop_window(recent[0] + piece)
                return "\n" in piece and repeats_itself(
                    recent[0][: recent[0].rfind("\n") + 1], 4)

            base.append(per_piece_us(line_only, text, args.piece))
        o, b = statistics.median(ours), statistics.median(base)
        print(f"| {name} | {b:.1f} | {o:.1f} | {o / b:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
