"""A prompt read on the GPU in wide steps (``Runner.wide``) against the fixed-size steps.

The torch engine reads a prompt as the speculator hands it over: runs (``prefix_cache.run_of``:
on the GPU 1,024 tokens, ``TorchEngine.prefill_run``), each a call asking only the last token's
logits (``TorchEngine.eval`` with ``last_only``, its row copied to the host). Before
``Runner.wide`` a run went through 32-token steps (``MAX_STEP``), whose kernels are tiled for a
verify step's few tokens and read every weight once a step. A wide step takes up to its width
in one step, its products through cuBLAS. Each way (``--ways``: a Runner's widest wide step
and the calls' run, ``0/128`` being the 32-token steps in runs of 128) is timed on a Runner of
its own over one model, in alternating rounds, CUDA-synchronised wall time from the first
run's call to the last row's copy; the medians, prompt tokens a second and each way's ratio to
the first; then each way's last logits row, its top token and the K it leaves against the
first way's.

No GGUF travels to the lent device, so the default pair's shapes with random bf16 weights
(the time of a product does not depend on its values)::

    python3 scripts/bench_wide.py --models 1.5B,0.5B --tokens 1024,4096 --rounds 5 \
        --ways 0/128,128/128,1024/1024
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="1.5B,0.5B", help="comma-separated: 1.5B, 0.5B")
    ap.add_argument("--tokens", default="1024,4096", help="prompt lengths, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each timing both ways")
    ap.add_argument("--ways", default="0/128,128/128,1024/1024",
                    help="ways to read the prompt, comma-separated, each W/R: the Runner's "
                         "wide step of W tokens (0: the 32-token steps) in calls of R tokens "
                         "(the speculator's runs); each is timed against the first")
    ap.add_argument("--sweep-attention", action="store_true",
                    help="also time the wide step's attention alone at the prompt's end over "
                         "query rows a tile (32, 64, 128) and splits (2 to 64), then keys a "
                         "block and pipeline stages; and its four products through cuBLAS "
                         "both ways round")
    ap.add_argument("--profile", action="store_true",
                    help="also print the wide step's kernels by device time (torch.profiler, "
                         "one step run eagerly at the prompt's end)")
    args = ap.parse_args()
    try:
        lengths = [int(x) for x in args.tokens.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--tokens takes whole numbers separated by commas; got {args.tokens!r}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        ways = [(int(w), int(r)) for w, r in (x.split("/") for x in args.ways.split(",") if x)]
    except ValueError:
        ap.error(f"--ways takes W/R pairs of whole numbers separated by commas (0/128,128/128); "
                 f"got {args.ways!r}")
    if not ways or any(w < 0 or r < 1 for w, r in ways):
        ap.error(f"--ways needs a wide step of 0 or more tokens and runs of 1 or more; got "
                 f"{args.ways!r}")
    if not lengths or min(lengths) < 2 or args.rounds < 1:
        ap.error("--tokens needs lengths of at least 2 and --rounds at least 1")
    if not models or any(m not in ("1.5B", "0.5B") for m in models):
        ap.error(f"--models takes 1.5B and 0.5B; got {args.models!r}")

    import torch

    from openjarvis.engine.torch.generate import WIDE_STEP

    if not torch.cuda.is_available():
        raise SystemExit("bench_wide needs a CUDA device (the wide step is the GPU's path)")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    for name in models:
        for n in lengths:
            _bench(name, n, args.rounds, args.profile, ways)
            if args.sweep_attention:
                for t in sorted({w for w, _ in ways if w} or {WIDE_STEP}):
                    _sweep_attention(name, n, t)
    return 0


def _bench(name: str, n: int, rounds: int, profile: bool, ways: list[tuple[int, int]]) -> None:
    """Each way (``wide`` W, calls of R tokens) on a Runner of its own over one model, in
    alternating rounds; medians, and each way's ratio and last row against the first way's."""
    import torch

    from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B
    from openjarvis.engine.torch.generate import WIDE_MAX, Runner
    from openjarvis.engine.torch.model import Transformer
    from openjarvis.engine.torch.weights import random_weights

    a = QWEN25_1_5B if name == "1.5B" else QWEN25_0_5B
    model = Transformer(a, random_weights(a, torch.bfloat16, "cuda", seed=0), n_pos=n + 256)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, a.n_vocab, (n,), generator=gen).tolist()
    runners = []
    for w, _run in ways:
        r = Runner(model, n + 128)
        assert r.wide == WIDE_MAX  # (the GPU's default)
        r.wide = w
        runners.append(r)

    def read(r: Runner, run: int) -> tuple[float, torch.Tensor]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        row = None
        for lo in range(0, n, run):  # as TorchEngine.eval: a call a run
            out = r.logits(prompt[lo : lo + run], lo, last_only=True)
            row = r.host(out[:, : a.n_vocab].float())
        torch.cuda.synchronize()
        assert row is not None
        return time.perf_counter() - t0, row

    for r, (_w, run) in zip(runners, ways, strict=True):  # compile and capture every step first
        read(r, run)
    got: list[list[float]] = [[] for _ in ways]
    rows: list[torch.Tensor] = [torch.empty(0)] * len(ways)
    for i in range(rounds):
        order = range(len(ways)) if i % 2 == 0 else range(len(ways) - 1, -1, -1)
        for j in order:
            s, rows[j] = read(runners[j], ways[j][1])
            got[j].append(s)
    med = [statistics.median(v) * 1e3 for v in got]
    base, kb = rows[0].double(), runners[0].cache.k[:, :, :n].double()
    for j, (w, run) in enumerate(ways):
        row, k = rows[j].double(), runners[j].cache.k[:, :, :n].double()
        way = f"wide {w}" if w else "32-token steps"
        line = (f"{name} {n} tokens, {way} in runs of {run}: {med[j]:.2f} ms "
                f"({n / med[j] * 1e3:,.0f} tokens/s; rounds "
                f"{', '.join(f'{x * 1e3:.2f}' for x in got[j])})")
        if j:
            line += (f"; {med[0] / med[j]:.2f}x the first way; last row against it "
                     f"{float((row - base).norm() / base.norm()):.2e}, same top token "
                     f"{int(row.argmax()) == int(base.argmax())}; K of every layer "
                     f"{float((k - kb).norm() / kb.norm()):.2e}")
        print(line, flush=True)
    if profile:  # the widest step this prompt holds, at its end
        way = max(range(len(ways)), key=lambda j: ways[j][0])
        fits = [w for w in runners[way].wide_widths if w <= n]
        if fits:
            _profile(runners[way], prompt[n - fits[0] :], n - fits[0])
        else:
            print(f"--profile: no wide step fits a prompt of {n} tokens", flush=True)
    del runners, model
    torch.cuda.empty_cache()


def _sweep_attention(name: str, n: int, t: int) -> None:
    """``kernels.attention_wide`` alone for the last run of an n-token prompt (its t queries
    over n keys), µs a call from a graph of 10 calls replayed: its tiles and splits."""
    import torch
    import triton

    from openjarvis.engine.torch import kernels as K
    from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B
    from openjarvis.engine.torch.generate import WIDE_BLOCK_S, wide_nsplit

    a = QWEN25_1_5B if name == "1.5B" else QWEN25_0_5B
    dev = "cuda"
    q = torch.randn(t, a.n_head, a.head_dim, device=dev)
    kc = torch.randn(a.n_head_kv, n + 128, a.head_dim, device=dev).to(torch.bfloat16)
    vc = torch.randn_like(kc)
    start = torch.tensor([n - t], device=dev)
    out = torch.empty(t, a.q_dim, dtype=torch.bfloat16, device=dev)
    line = []
    for rows in (32, 64, 128):
        for splits in (1, 2, 4, 8, 16, 32, 64):
            o = torch.empty(splits, t, a.n_head, a.head_dim, device=dev)
            ml = torch.empty(splits, t, a.n_head, 2, device=dev)

            def call(o: torch.Tensor = o, ml: torch.Tensor = ml, rows: int = rows) -> None:
                K.attention_wide(q, kc, vc, start, out, o, ml, block_s=WIDE_BLOCK_S, rows=rows)

            line.append(f"rows {rows} splits {splits}: {_graph_us(call):.1f}")
    print(f"{name} attention of the last {t} of {n} tokens, µs a call: " + "; ".join(line),
          flush=True)
    line = []
    ns = wide_nsplit(t)
    o = torch.empty(ns, t, a.n_head, a.head_dim, device=dev)
    ml = torch.empty(ns, t, a.n_head, 2, device=dev)
    for rows in (64, 128):
        for block_s in (32, 64, 128):
            for stages in (1, 2, 3, 4):
                def call(block_s: int = block_s, stages: int = stages, rows: int = rows) -> None:
                    K.attention_wide(q, kc, vc, start, out, o, ml, block_s=block_s,
                                     num_stages=stages, rows=rows)

                what = f"rows {rows} keys {block_s} stages {stages}"
                try:
                    line.append(f"{what}: {_graph_us(call):.1f}")
                except triton.runtime.errors.OutOfResources:
                    line.append(f"{what}: no room")
    print(f"{name} the same in {ns} splits, µs a call: " + "; ".join(line), flush=True)
    line = []
    xs = {"qkv": (a.n_embd, a.qkv_dim), "o": (a.q_dim, a.n_embd), "gate/up": (a.n_embd, 2 * a.n_ff),
          "down": (a.n_ff, a.n_embd)}
    for what, (k, nout) in xs.items():
        x = torch.randn(t, k, device=dev).to(torch.bfloat16)
        w = torch.randn(nout, k, device=dev).to(torch.bfloat16)
        y = torch.empty(t, nout, dtype=torch.bfloat16, device=dev)
        yt = torch.empty(nout, t, dtype=torch.bfloat16, device=dev)
        us = _graph_us(lambda x=x, w=w, y=y: torch.mm(x, w.t(), out=y))
        ust = _graph_us(lambda x=x, w=w, yt=yt: torch.mm(w, x.t(), out=yt))
        line.append(f"{what} x @ W^T {us:.1f}, W @ x^T {ust:.1f}")
    print(f"{name} products of {t} rows (cuBLAS), µs a call: " + "; ".join(line), flush=True)


def _graph_us(call: object) -> float:
    """µs a call of ``call`` (no arguments), from a graph of 10 calls replayed 20 times."""
    import torch

    call()  # type: ignore[operator]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            call()  # type: ignore[operator]
    graph.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        graph.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / 200 * 1e3


def _profile(r: object, tokens: list[int], start: int) -> None:
    """The wide step's kernels, run once eagerly (its graph's replays are the same launches),
    by total device time: which part of the step to work on next."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    ww = r._wide_ws(len(tokens))  # type: ignore[attr-defined]
    ww.inputs.copy_(torch.tensor([start, *tokens], dtype=torch.int64))
    r._wide_forward(ww)  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        r._wide_forward(ww)  # type: ignore[attr-defined]
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
