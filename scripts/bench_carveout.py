"""One shared-memory split for every kernel of a step, against the driver's choice per kernel.

Triton asks the driver for the largest shared-memory split (the L1 / shared-memory carveout)
only for kernels over 48 KB; every other kernel keeps the driver's own choice, and an SM
changes its split only once it is empty. Session 20's traces showed kernels launched early
(programmatic dependent launch) piling their programs onto a few SMs. This times the default
pair's steps (random weights of the real shapes) with each carveout in ``--carveouts``
(``default`` is the driver's choice; a number is the % of L1 every kernel prefers as shared
memory, ``kernels.set_carveout``), in alternating rounds in one process, each step captured
anew under its setting, and checks that the logits do not change.

    python3 scripts/bench_carveout.py --out DIR   # on the lent GPU; DIR/carveout.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import time_ms  # noqa: E402  # the benchmarks' one timer
from bench_verify import rel, runner_for  # noqa: E402

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B  # noqa: E402

MODELS = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}


def parse_carveout(s: str) -> int:
    return K.CARVEOUT_DEFAULT if s == "default" else int(s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="1.5B,0.5B")
    ap.add_argument("--positions", default="512,4096")
    ap.add_argument("--tokens", default="1,9", help="step sizes (T = k + 1 for k drafts)")
    ap.add_argument("--carveouts", default="default,100",
                    help="comma-separated: default (the driver's choice) or a percentage; "
                         "the first is the baseline of the ratios")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_carveout needs a CUDA GPU", file=sys.stderr)
        return 2
    settings = [parse_carveout(c) for c in args.carveouts.split(",")]
    names = args.carveouts.split(",")
    positions = [int(p) for p in args.positions.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    res: dict[str, Any] = {}
    for model in args.models.split(","):
        r, _ = runner_for(MODELS[model], max(positions) + 64)
        for pos in positions:
            for t in tokens:
                toks = list(range(100, 100 + t))
                logits: dict[str, torch.Tensor] = {}
                times: dict[str, list[float]] = {n: [] for n in names}
                for rnd in range(args.rounds):
                    order = list(zip(names, settings, strict=True))
                    if rnd % 2:
                        order.reverse()
                    for name, c in order:
                        r.step(toks, pos)  # compiled before the setting reaches it
                        K.set_carveout(c)
                        r.drop_steps(t)
                        out = r.step(toks, pos)  # captured under the setting
                        if rnd == 0:
                            logits[name] = out.float().clone()
                        times[name].append(time_ms(functools.partial(r.replay, t)))
                K.set_carveout(K.CARVEOUT_DEFAULT)
                base = names[0]
                row = {
                    "ms": {n: statistics.median(v) for n, v in times.items()},
                    "ratio": {n: statistics.median(a / b for a, b in zip(
                        times[n], times[base], strict=True)) for n in names},
                    "rel_vs_first": {n: rel(logits[n], logits[base]) for n in names},
                    "top1_same": {n: float((logits[n].argmax(-1) == logits[base].argmax(-1))
                                           .float().mean()) for n in names},
                }
                key = f"{model}@{pos}_T{t}"
                res[key] = row
                print(key, json.dumps(row), flush=True)
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "carveout.json").write_text(json.dumps(res, indent=1))
        del r
        torch.cuda.empty_cache()
    print()
    print("step            " + "  ".join(f"{n:>16s}" for n in names))
    for key, row in res.items():
        print(f"{key:15s} " + "  ".join(f"{row['ms'][n]:.4f} ({row['ratio'][n]:.4f})"
                                        for n in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
