"""How many rows an exact greedy screen of the output matrix leaves to rescore, on a real model.

``kernels.OutScreen`` reads the output matrix as int8 and bounds every logit; only rows whose
upper bound reaches the largest lower bound are read again exactly. Its speed rests on that
set being small for real hidden states, which random weights cannot show. This runs the real
GGUF on the CPU (float32, the reference path) over ``--chunks`` x ``--tokens`` positions of
this repository's own Python source, takes the final norm's output at each, and counts the
rows each screen would rescore: the product's (``screen_weights``: int8 with one scale a row,
its Cauchy-Schwarz bound and float32 allowance), and for the record the designs it was chosen
over (int8 with a scale per 32 weights, int4 per 32, fp8 e4m3). It checks that every true
argmax is inside its set.

    python3 scripts/screen_candidates.py ~/.local/share/openjarvis/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openjarvis.engine.torch.model as M  # noqa: E402
from openjarvis.engine.torch.cache import KVCache  # noqa: E402
from openjarvis.engine.torch.engine import Vocab  # noqa: E402
from openjarvis.engine.torch.kernels import screen_weights  # noqa: E402
from openjarvis.engine.torch.weights import load_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def hidden_states(path: Path, chunks: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The output projection's input (RMSNorm(h) * g, float32) at every position of
    ``chunks`` runs of ``tokens`` tokens each, the bfloat16-rounded output matrix, and the
    tokenizer's vocabulary size."""
    args, w, _ = load_gguf(path, torch.float32, torch.device("cpu"))
    vocab = Vocab(path)
    text = "".join(p.read_text() for p in sorted((ROOT / "openjarvis").rglob("*.py")))
    toks = vocab.tokenize(text, False)
    if len(toks) < chunks * tokens:
        raise SystemExit(f"screen_candidates: only {len(toks)} tokens of source; ask for fewer")
    model = M.Transformer(args, w, n_pos=tokens + 64)
    seen: list[torch.Tensor] = []
    linear = M.F.linear

    def spy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
            ) -> torch.Tensor:
        if weight is w.out:
            seen.append(x.detach().clone())
        return linear(x, weight, bias)

    M.F.linear = spy
    try:
        for c in range(chunks):
            part = toks[c * tokens : (c + 1) * tokens]
            t0 = time.monotonic()
            with torch.no_grad():
                model.forward(torch.tensor(part), torch.arange(len(part)),
                              KVCache(args, tokens + 64, torch.float32, "cpu"), kv_len=len(part))
            print(f"chunk {c}: {len(part)} tokens in {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        M.F.linear = linear
    n = vocab.n_vocab
    vocab.close()
    return torch.cat(seen), w.out[:n].bfloat16().float(), n


def count(x: torch.Tensor, q: torch.Tensor, bound: torch.Tensor, top: torch.Tensor
          ) -> dict[str, Any]:
    """Rows whose upper bound reaches the largest lower bound, per position."""
    s = x @ q.T
    cand = (s + bound) >= (s - bound).max(1, keepdim=True).values
    n = cand.sum(1).float()
    qs = torch.quantile(n, torch.tensor([0.5, 0.9, 0.99, 1.0])).tolist()
    return {"median": qs[0], "p90": qs[1], "p99": qs[2], "max": qs[3],
            "argmax_inside": bool(cand.gather(1, top[:, None]).all())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="a Qwen2 GGUF file")
    ap.add_argument("--chunks", type=int, default=4, help="runs from position 0 (default 4)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens a run (default 256)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here too")
    args = ap.parse_args(argv)
    if not args.model.is_file():
        print(f"screen_candidates: no model file at {args.model}", file=sys.stderr)
        return 2
    x, w, n = hidden_states(args.model, args.chunks, args.tokens)
    v, k = w.shape
    exact = x @ w.T
    top = exact.argmax(1)
    top2 = exact.topk(2, dim=1).values
    xn = x.norm(dim=1, keepdim=True)
    res: dict[str, Any] = {"model": args.model.name, "positions": x.shape[0], "rows": n,
                           "top2_gap_median": float((top2[:, 0] - top2[:, 1]).median())}
    scr = screen_weights(w)
    res["int8 a row (the product)"] = count(x, scr.q.float() * scr.scale[:, None],
                                            xn * scr.err[None], top)
    blocks = w.view(v, k // 32, 32)
    d8 = blocks.abs().amax(2, keepdim=True).clamp_min(1e-30) / 127
    q8 = ((blocks / d8).round().clamp(-127, 127) * d8).view(v, k)
    res["int8 a 32 weights"] = count(x, q8, xn * (w - q8).norm(dim=1)[None], top)
    lo, hi = blocks.amin(2, keepdim=True), blocks.amax(2, keepdim=True)
    s4 = (hi - lo).clamp_min(1e-30) / 15
    q4 = (((blocks - lo) / s4).round().clamp(0, 15) * s4 + lo).view(v, k)
    res["int4 a 32 weights"] = count(x, q4, xn * (w - q4).norm(dim=1)[None], top)
    sf = w.abs().amax(1, keepdim=True) / 448
    qf = (w / sf).to(torch.float8_e4m3fn).float() * sf
    res["fp8 e4m3 a row"] = count(x, qf, xn * (w - qf).norm(dim=1)[None], top)
    print(json.dumps(res, indent=1))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
