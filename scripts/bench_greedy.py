"""Greedy steps that never write their logits, against the logits steps they replace.

A greedy decision needs one integer a token; a logits step writes ``[T, 151936]`` float32 on
the GPU, and ``TorchEngine.eval`` then copies them to the host, where the speculator used to
take each row's argmax. ``Runner.argmax`` runs steps whose output projection keeps only each
program's largest logit and a tiny merge kernel picks the token (``kernels.ARGMAX``). Run on
the lent H200 (``device`` tool): ``python3 scripts/bench_greedy.py --out $OUT``. In one process,
per model (the default pair's shapes, random non-zero bf16 weights), at each position:

1. agreement: on a deterministic runner (no split-K atomics, so two steps of the same inputs
   give the same bits), the greedy step's tokens against the argmax of the logits step's rows;
2. the step alone, in its CUDA graph: logits step against greedy step, T = 1, 5, 9 (GPU time,
   ``bench_gpu.time_ms``), in alternating rounds;
3. one call as the engine and the speculator make it, wall time with the host's part (Python,
   the input copy, the result's copy and sync), in alternating rounds, median of each round's
   median, T = 1, 5, 9:
   - ``eval``: the logits step, its rows copied to the host as numpy (``TorchEngine.eval``),
     ``np.argmax`` a row (what the speculator and the model drafter did for every greedy step
     before session 14, and still do for sampled ones);
   - ``eval_pageable``: the same through pageable memory (before session 14; ``eval`` now
     takes logits through page-locked memory, ``Runner.host``);
   - ``greedy_plain``: the greedy step, its tokens copied to the host after it;
   - ``greedy_copy``: the same with ``Runner.graph_io``: the inputs and the tokens copied by
     the step's graph itself (copy nodes), one sync a call;
   - ``greedy``: the default (``eval_argmax`` now): as ``greedy_copy``, but the merge kernel
     writes the tokens into page-locked memory itself (``Runner.host_ids_direct``);
4. a greedy draft of k = 4 and 8 tokens as the model drafter makes it: k one-token greedy
   calls (``draft_calls``), against one call for the first token and ``Runner.draft`` for
   the k - 1 after it, one graph replay (``draft_chain``: ``TorchEngine.draft_greedy``);
5. greedy speculation composed from those wall times (``bench_gpu.compose``, per-token
   acceptance ``--accept``): both models on the GPU, the drafter's k tokens as k calls or as
   the chain.

Results go to ``--out``/greedy.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import TOKENIZER_COLS, compose, log, time_ms  # noqa: E402  # the benchmarks' timer and columns

from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer  # noqa: E402
from openjarvis.engine.torch.weights import random_weights  # noqa: E402

TS = (1, 5, 9)


def wall_ms(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of one call of ``fn`` (each ends on a host sync of its result)."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


HOWS = ("eval_pageable", "eval", "greedy_plain", "greedy_copy", "greedy")


def calls(r: Runner, r0: Runner, r1: Runner, toks: list[int], pos: int,
          vocab: int) -> dict[str, Callable[[], object]]:
    """The ways (``HOWS``) of one greedy call of ``len(toks)`` tokens at ``pos``, as
    ``TorchEngine.eval`` and ``eval_argmax`` make it: ``r`` with the defaults, ``r0`` without
    ``graph_io`` (the inputs and results copied around the graph, synchronously), ``r1``
    with it but the tokens copied out by a copy node (no ``host_ids_direct``)."""

    def eval_rows(runner: Runner, pinned: bool) -> list[int]:
        runner.pinned_io = pinned
        rows = runner.host(runner.logits(toks, pos)[:, :vocab].float()).numpy()
        return [int(np.argmax(row)) for row in rows]

    def greedy_plain() -> list[int]:
        return [int(x) for x in r0.host(r0.argmax(toks, pos)).tolist()]

    return {"eval_pageable": partial(eval_rows, r0, False), "eval": partial(eval_rows, r, True),
            "greedy_plain": greedy_plain, "greedy_copy": partial(r1.greedy_tokens, toks, pos),
            "greedy": partial(r.greedy_tokens, toks, pos)}


def agreement(a: ModelArgs, w: Any, pos: int) -> dict[str, Any]:
    """Deterministic steps: the greedy tokens against the logits' argmax, T = 1 and 9 over a
    few positions, with random tokens."""
    r = Runner(Transformer(a, w, n_pos=pos + 128), pos + 64, kernels="triton", graphs=True)
    r.make_deterministic()
    r.greedy_cols = TOKENIZER_COLS
    gen = torch.Generator().manual_seed(5)
    same = total = 0
    for t in (1, 9):
        for p in range(pos - 40, pos, 10):
            toks = torch.randint(0, TOKENIZER_COLS, (t,), generator=gen).tolist()
            ref = r.logits(toks, p)[:, :TOKENIZER_COLS].argmax(-1).tolist()
            got = r.argmax(toks, p).tolist()
            same += sum(x == y for x, y in zip(got, ref, strict=True))
            total += t
    return {"same": same, "rows": total}


def bench_model(name: str, a: ModelArgs, positions: list[int], rounds: int,
                reps: int) -> dict[str, Any]:
    w = random_weights(a, torch.bfloat16, "cuda", seed=0)
    res: dict[str, Any] = {"agreement": agreement(a, w, max(positions))}
    log(name, "agreement", res["agreement"])
    model = Transformer(a, w, n_pos=max(positions) + 128)
    r = Runner(model, max(positions) + 64, kernels="triton", graphs=True)
    r0 = Runner(model, max(positions) + 64, kernels="triton", graphs=True)
    r1 = Runner(model, max(positions) + 64, kernels="triton", graphs=True)
    r0.graph_io = False
    r1.host_ids_direct = False
    for x in (r, r0, r1):
        x.greedy_cols = TOKENIZER_COLS
    # (greedy steps pick through the output matrix's int8 screen where tuning.SCREEN_OUT
    # names the shape: the 1.5B's since session 33; its figures before then are the plain
    # pick's)
    res["screen_out"] = r.screen_out
    log(name, "greedy steps screened:", r.screen_out)
    toks = list(range(100, 100 + max(TS)))
    for pos in positions:
        graph: dict[str, list[float]] = {}
        wall: dict[str, list[float]] = {}
        for t in TS:  # capture the steps of each T first
            for x in (r, r0, r1):
                x.step(toks[:t], pos)
                x.step(toks[:t], pos, greedy=True)
        for rnd in range(rounds):
            for t in TS:
                graph.setdefault(f"logits_T{t}", []).append(time_ms(partial(r0.replay, t)))
                graph.setdefault(f"greedy_T{t}", []).append(
                    time_ms(partial(r0.replay, t, greedy=True)))
                graph.setdefault(f"greedy_io_T{t}", []).append(  # with the input's copy node
                    time_ms(partial(r.replay, t, greedy=True)))
                graph.setdefault(f"greedy_io_copy_T{t}", []).append(  # and the tokens' one
                    time_ms(partial(r1.replay, t, greedy=True)))
                for how, fn in calls(r, r0, r1, toks[:t], pos, TOKENIZER_COLS).items():
                    wall.setdefault(f"{how}_T{t}", []).append(wall_ms(fn, reps))
            log(name, pos, "round", rnd, {k: round(v[-1], 4) for k, v in wall.items()})
        drafts: dict[str, list[float]] = {}
        for k in (4, 8):
            r.draft(toks[0], pos, k - 1)  # capture the chain first

            def calls_k(k: int = k, p: int = pos) -> list[int]:
                out, tok = [], toks[0]
                for j in range(k):
                    tok = r.greedy_tokens([tok], p + j)[0]
                    out.append(tok)
                return out

            def chain_k(k: int = k, p: int = pos) -> list[int]:
                first = r.greedy_tokens([toks[0]], p)[0]
                return [first, *r.draft(first, p + 1, k - 1)]

            for _ in range(rounds):
                drafts.setdefault(f"draft_calls_k{k}", []).append(wall_ms(calls_k, reps // 4))
                drafts.setdefault(f"draft_chain_k{k}", []).append(wall_ms(chain_k, reps // 4))
            # (split-K atomics: the two may part at a near-tie; the GPU test checks equality on
            # deterministic steps)
            same = sum(a == b for a, b in zip(calls_k(), chain_k(), strict=True))
            drafts.setdefault("same_tokens", []).append(same)
        row: dict[str, Any] = {
            "draft_ms": {k: statistics.median(v) for k, v in drafts.items() if k != "same_tokens"},
            "draft_same_tokens": drafts["same_tokens"],  # of 4, of 8
            "draft_ratio": {f"k{k}": statistics.median(
                c / s for c, s in zip(drafts[f"draft_chain_k{k}"], drafts[f"draft_calls_k{k}"],
                                      strict=True)) for k in (4, 8)},
            "graph_ms": {k: statistics.median(v) for k, v in graph.items()},
            "wall_ms": {k: statistics.median(v) for k, v in wall.items()},
        }
        row["graph_ratio"] = {f"T{t}": statistics.median(
            g / lg for g, lg in zip(graph[f"greedy_T{t}"], graph[f"logits_T{t}"], strict=True))
            for t in TS}
        row["wall_ratio_to_eval_pageable"] = {f"{how}_T{t}": statistics.median(
            x / e for x, e in zip(wall[f"{how}_T{t}"], wall[f"eval_pageable_T{t}"], strict=True))
            for how in HOWS[1:] for t in TS}
        res[f"pos{pos}"] = row
        log(name, pos, row)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="1.5B,0.5B")
    ap.add_argument("--positions", default="512,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=100, help="calls a round of each wall time")
    ap.add_argument("--accept", type=float, default=0.933,
                    help="per-token greedy acceptance of the real pair (bench_gpu --acceptance)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_greedy needs a CUDA GPU", file=sys.stderr)
        return 2
    models = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}
    positions = [int(p) for p in args.positions.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "accept": args.accept}
    for name in args.models.split(","):
        res[name] = bench_model(name, models[name], positions, args.rounds, args.reps)
        (args.out / "greedy.json").write_text(json.dumps(res, indent=1))
        torch.cuda.empty_cache()
    if "1.5B" in res and "0.5B" in res:
        spec: dict[str, Any] = {}
        for pos in positions:
            v, d = res["1.5B"][f"pos{pos}"]["wall_ms"], res["0.5B"][f"pos{pos}"]["wall_ms"]
            spec[f"pos{pos}"] = {
                how: {"plain_tok_s": 1e3 / v[f"{how}_T1"],
                      "k4": compose(args.accept, 4, d[f"{how}_T1"], v[f"{how}_T5"]),
                      "k8": compose(args.accept, 8, d[f"{how}_T1"], v[f"{how}_T9"])}
                for how in HOWS}
            dd = res["0.5B"][f"pos{pos}"]["draft_ms"]
            spec[f"pos{pos}"]["greedy_chain"] = {  # the draft's k tokens: one call + the chain
                "k4": compose(args.accept, 4, dd["draft_chain_k4"] / 4, v["greedy_T5"]),
                "k8": compose(args.accept, 8, dd["draft_chain_k8"] / 8, v["greedy_T9"])}
        res["speculative"] = spec
        log("speculative", spec)
    (args.out / "greedy.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
