"""Time to first token after a long prompt, with the model drafter reading the prompt while the
verifier answers (``Speculator.read_ahead_s``, the default ``READ_AHEAD_S``) against reading
all of it before the first step (``math.inf``: the order before).

After the verifier has read a long prompt, the model drafter has the whole of it to read before
its first draft. Read first, that reading sits between the end of the prompt and the first token;
read a run a step (the first step reading none), the verifier's own steps answer meanwhile and
the drafter drafts once it has caught up. What it costs: the steps taken without a draft while
it reads.

The real default pair through llama.cpp, from cold caches each time (both engines emptied, no
prefix cache), greedy; by default with the model drafter asked for (``--drafter model``), since
the assistant's ``auto`` on a 2-core CPU picks the n-gram drafter or none for such a prompt, and
then both orders run the same steps. The prompt is a chat turn whose user message is
``--tokens`` of this repository's sources. Both engines' cost tables are measured (or loaded)
before the first round, so no round pays for that. Each round times both ways in
alternating order and reports time to first token (and the part of it after the prompt was
read), the whole answer's time, and whether the two answers are the same tokens: greedy,
they are up to the first near-tie that llama.cpp's batched and single-token kernels round
differently (docs/speculative.md), and the first steps here are single-token ones where before
they verified drafts, so a long answer can part ways.

    python scripts/bench_first_token.py --tokens 1300 --rounds 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_prefill_runs import code_prompt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1300,
                    help="tokens of source code in the prompt (default 1300)")
    ap.add_argument("--answer", type=int, default=1024,
                    help="max_tokens of each answer (default 1024, the assistant's: the planner "
                         "prices the drafter's reading spread over what is left to write, so with "
                         "a small bound it may not pick the model drafter at all)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each timing both ways (default 2)")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: physical cores)")
    ap.add_argument("--drafter", default="model", choices=["model", "auto"],
                    help="the request's drafter (default model: where the planner picks it; "
                         "auto is the assistant's, and where it never picks the model drafter "
                         "the two orders are the same)")
    args = ap.parse_args()
    if args.tokens < 1 or args.answer < 1 or args.rounds < 1:
        ap.error("--tokens, --answer and --rounds must be positive")

    from openjarvis.config import load_config
    from openjarvis.engine.drafters import ModelDrafter
    from openjarvis.engine.llama import LlamaEngine
    from openjarvis.engine.speculative import PREFILL_CHUNK, READ_AHEAD_S, Request, Speculator
    from openjarvis.models import Catalog

    d_path, v_path = Catalog.load(load_config()).pair_paths()
    with LlamaEngine(v_path, threads=args.threads) as verifier, \
            LlamaEngine(d_path, threads=args.threads) as drafter:
        code = verifier.detokenize(code_prompt(verifier, args.tokens)).decode("utf-8", "replace")
        text = ("<|im_start|>system\nYou are a coding assistant.<|im_end|>\n<|im_start|>user\n"
                f"{code}\n\nWhat does this code do?<|im_end|>\n<|im_start|>assistant\n")
        prompt = verifier.tokenize(text)
        verifier.cost_model()  # measured once per machine, then read from disk: not in a round
        drafter.cost_model()
        print(f"{v_path.name} + {d_path.name}: {len(prompt)}-token prompt, answers of at most "
              f"{args.answer} tokens, drafter {args.drafter}, {verifier.threads} threads, runs "
              f"of {PREFILL_CHUNK}", flush=True)
        got: dict[str, dict[str, list[float]]] = {"read while answering": {}, "read first": {}}
        answers: dict[str, list[list[int]]] = {name: [] for name in got}
        for r in range(args.rounds):
            names = list(got) if r % 2 == 0 else list(got)[::-1]
            for name in names:
                verifier.rollback(0)
                drafter.rollback(0)
                read_ahead = READ_AHEAD_S if name == "read while answering" else math.inf
                spec = Speculator(verifier, model_drafter=ModelDrafter(drafter, verifier=verifier),
                                  read_ahead_s=read_ahead)
                gen = spec.generate(Request(prompt, max_tokens=args.answer,
                                            drafter=args.drafter)).run()
                s = gen.stats
                assert s.ttft is not None, "no token came"
                row = {"ttft_s": s.ttft, "total_s": s.time_total, "prefill_s": s.time_prefill,
                       "after_prompt_s": s.ttft - s.time_prefill,
                       "tokens": float(len(gen.tokens)), "steps": float(s.steps)}
                for k, v in row.items():
                    got[name].setdefault(k, []).append(v)
                answers[name].append(gen.tokens)
                drafted = sum(d.drafted for d in s.per_drafter.values())
                print(f"round {r + 1} {name}: first token {s.ttft:.2f} s (prompt read in "
                      f"{s.time_prefill:.2f} s), answer {s.time_total:.2f} s, {len(gen.tokens)} "
                      f"tokens in {s.steps} steps, {drafted} drafted "
                      f"({', '.join(sorted(s.per_drafter)) or 'no drafter'})", flush=True)
    med = {name: {k: statistics.median(v) for k, v in rows.items()} for name, rows in got.items()}
    ours, before = med["read while answering"], med["read first"]
    same = all(a == b for a, b in zip(answers["read while answering"], answers["read first"],
                                       strict=True))
    print(f"first token: {ours['ttft_s']:.2f} s against {before['ttft_s']:.2f} s read first "
          f"({before['ttft_s'] / ours['ttft_s']:.2f}x sooner), of which after the prompt was read "
          f"{ours['after_prompt_s']:.2f} s against {before['after_prompt_s']:.2f} s; the whole "
          f"answer {ours['total_s']:.2f} s for {ours['tokens']:.0f} tokens in {ours['steps']:.0f} "
          f"steps against {before['total_s']:.2f} s for {before['tokens']:.0f} in "
          f"{before['steps']:.0f}; the same answers: {same}"
          + ("" if same else " (so the whole answers' times do not compare)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
