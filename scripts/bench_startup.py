"""What loading the torch engine on the GPU spends before the first request: the captures.

``TorchEngine.from_gguf`` captures a CUDA graph for every step a request can take (logits
and greedy steps of 1-32 tokens, since session 24), and a torch model
drafter captures its draft chains (``TorchEngine.warm_drafts``: 15 chains of 1-15 one-token
steps), so that no request pays Triton compilation or a capture. This prices each part on a
``Runner`` of the default pair's shapes (random bf16 weights; reading a GGUF is not timed
here), as the engine calls them, in the engine's order:

- ``steps``: ``warmup(WARM_STEPS)``;
- ``greedy``: ``warmup(WARM_GREEDY, greedy=True)``;
- ``wide``: ``warm_wide()`` (a prompt's wide steps, 1,024 to 128 tokens that fit the window,
  since session 38);
- ``chains``: ``warm_chains(range(1, MAX_CHAIN), 0)``.

Each part's GPU memory is recorded beside its seconds (``*_mib``), and a third load has every
step hold scratch of its own (``own_scratch_load``: ``Runner.shared_scratch`` off, as before
session 25). Each model is otherwise loaded twice in the process: the first pays Triton's compilation of every kernel
variant unless its on-disk cache (``TRITON_CACHE_DIR``) already holds them, the second finds
them compiled in memory and pays the captures (with their warm-up runs) alone. Run it twice
with the same fresh ``TRITON_CACHE_DIR`` to see a first start (empty cache) and a restart
(cache on disk): ``export TRITON_CACHE_DIR=$(mktemp -d)``, then ``python3
scripts/bench_startup.py --out $OUT --label first_start`` and the same with ``--label
restart``. Results go to ``--out``/startup.json (appended per run, side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import TOKENIZER_COLS  # noqa: E402  # the greedy steps' partials size

from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.engine import WARM_GREEDY, WARM_STEPS  # noqa: E402
from openjarvis.engine.torch.generate import MAX_CHAIN, Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer  # noqa: E402
from openjarvis.engine.torch.weights import random_weights  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    """Seconds of ``fn``, the GPU drained before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def load(a: ModelArgs, w: Any, n_ctx: int, shared_scratch: bool = True) -> dict[str, float]:
    """One engine load's captures, in the engine's order, seconds each; and the GPU memory
    each part takes (MiB allocated after it, less before it; the KV cache is ``runner``)."""
    mib = 2.0**20
    m0 = torch.cuda.memory_allocated()
    r = Runner(Transformer(a, w, n_pos=n_ctx + 64), n_ctx, kernels="triton", graphs=True)
    r.greedy_cols = TOKENIZER_COLS
    r.shared_scratch = shared_scratch
    out = {"runner_mib": (torch.cuda.memory_allocated() - m0) / mib}
    for part, fn in (("steps", lambda: r.warmup(WARM_STEPS)),
                     ("greedy", lambda: r.warmup(WARM_GREEDY, greedy=True)),
                     ("wide", r.warm_wide),
                     ("chains", lambda: r.warm_chains(range(1, MAX_CHAIN), 0))):
        m = torch.cuda.memory_allocated()
        out[part] = timed(fn)
        out[part + "_mib"] = (torch.cuda.memory_allocated() - m) / mib
    out["total"] = out["steps"] + out["greedy"] + out["wide"] + out["chains"]
    out["wide_steps"] = float(len(r._wides))
    out["total_mib"] = (torch.cuda.memory_allocated() - m0) / mib
    out["chains_captured"] = float(len(r._chains))
    r.drop_steps()  # its graphs go before the next load's
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="1.5B,0.5B")
    ap.add_argument("--context", type=int, default=8192, help="the engine's default context")
    ap.add_argument("--label", default="", help="a name for this run in startup.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_startup needs a CUDA GPU", file=sys.stderr)
        return 2
    models = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}
    run: dict[str, Any] = {"triton_cache": os.environ.get("TRITON_CACHE_DIR", "(default)")}
    for name in args.models.split(","):
        a = models[name]
        w = random_weights(a, torch.bfloat16, "cuda", seed=0)
        run[name] = {"first_load": load(a, w, args.context)}
        torch.cuda.empty_cache()
        run[name]["second_load"] = load(a, w, args.context)
        torch.cuda.empty_cache()
        # each step's scratch its own, as before session 25 (``Runner.shared_scratch``)
        run[name]["own_scratch_load"] = load(a, w, args.context, shared_scratch=False)
        print(name, json.dumps(run[name]), flush=True)
        del w
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "startup.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    res[args.label or f"run{len(res) + 1}"] = run
    path.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
