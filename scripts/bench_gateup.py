"""The one-token gate/up product against a kernel that only reads its bytes, in the same chain.

``bench_read_size.py`` (run 196) put a kernel that waits for the one before and then reads the
1.5B's 55 MB of gate/up at 14.2 µs, and our gate/up in the step at 16.6 µs (run 194's trace:
release, loop and tail); the 0.5B's 17.4 MB at 5.6 against 7.2 µs. This says how much of that
is the product's loop: each kernel below runs in a CUDA graph of L launches, every one over a
weight copy of its own (L x bytes well past L2), waiting for the one before as the step's
gate/up does (PDL: launched at the kernel before's start, ``gdc_wait`` first), or loading its
first weight tile before that wait (``pre``):

    read   bench_read_size's pure read of the same bytes, its best tile (the ceiling)
    ours   ``kernels.linear(mode=SWIGLU)`` with today's tuned tile (``tuning.TUNED``), x given
           as float32 (the step hands gate/up x * g the same way, plus the norm's sums)
    flat   a SwiGLU product that keeps a float32 accumulator per weight element of its tile
           ([rows, BK] for gate and for up) and reduces once after the K loop, so the loop is
           loads and multiply-adds only, as the pure read's; rows, BK and warps swept

Every product is checked against torch in float32 (outputs poisoned first) before it is timed.

What a chain of gate/ups alone cannot say (session 21, runs 197-200): ``flat`` beat ``ours``
here (0.5B 5.93 against 7.10 µs) and lost 1-15 % in the step in every tile and launch point
tried, because there the down projection's programs and gate/up's own occupancy decide how
many of its programs run at once (run 199's trace: the 8 x 256 tile's programs passed their
wait over 5.4 µs, against 0.8). A tile found here is a candidate for ``bench_verify.py``, not
a result.
Run on the lent GPU: ``python3 scripts/bench_gateup.py --out DIR`` (DIR/gateup.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import graph_us  # noqa: E402
from bench_read_size import CHAIN_BYTES, PRODUCTS, best, choices  # noqa: E402

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B  # noqa: E402
from openjarvis.engine.torch.tuning import tuned_configs  # noqa: E402

ARGS = {"0.5B": QWEN25_0_5B, "1.5B": QWEN25_1_5B}
FLAT_MODES = {"pdl": 1, "pre": 3}
#: flat tiles swept: (rows, BK, warps); kept where the two accumulators fit 64 floats a thread.
FLAT_TILES = [(r, bk, w) for r in (1, 2, 4, 8) for bk in (256, 512, 1024, 2048)
              for w in (4, 8, 16) if 2 * r * bk // (32 * w) <= 64 and r * bk >= 32 * w * 8]


@triton.jit
def _flat_swiglu(x_ptr, w_ptr, out_ptr, N, K, MODE: tl.constexpr, RB: tl.constexpr,
                 BK: tl.constexpr, GDC: tl.constexpr = 1):
    """out[r] = silu(W[r] . x) * (W[N + r] . x) for this program's RB rows, one float32
    accumulator per weight element, reduced after the loop. MODE 1: wait first; 3: the first
    tile's weights loaded before the wait. ``GDC`` 0 leaves the PDL calls out (Triton's
    interpreter has none), so the CPU tests run every mode's loads."""
    pid = tl.program_id(0)
    rows = pid * RB + tl.arange(0, RB)
    rmask = rows < N
    cols = tl.arange(0, BK)
    acc_g = tl.zeros([RB, BK], tl.float32)
    acc_u = tl.zeros([RB, BK], tl.float32)
    gp = w_ptr + rows[:, None].to(tl.int64) * K
    up = gp + N.to(tl.int64) * K
    k_start = 0
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 3:
        m = rmask[:, None] & (cols < K)[None, :]
        wg = tl.load(gp + cols[None, :], mask=m, other=0.0, eviction_policy="evict_first")
        wu = tl.load(up + cols[None, :], mask=m, other=0.0, eviction_policy="evict_first")
    if GDC and MODE != 0:
        tl.extra.cuda.gdc_wait()
    if MODE == 3:
        xv = tl.load(x_ptr + cols, mask=cols < K, other=0.0)
        acc_g += wg.to(tl.float32) * xv[None, :]
        acc_u += wu.to(tl.float32) * xv[None, :]
        k_start = BK
    for k0 in range(k_start, K, BK):
        c = k0 + cols
        cm = c < K
        m = rmask[:, None] & cm[None, :]
        wg = tl.load(gp + c[None, :], mask=m, other=0.0, eviction_policy="evict_first")
        wu = tl.load(up + c[None, :], mask=m, other=0.0, eviction_policy="evict_first")
        xv = tl.load(x_ptr + c, mask=cm, other=0.0)
        acc_g += wg.to(tl.float32) * xv[None, :]
        acc_u += wu.to(tl.float32) * xv[None, :]
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    tl.store(out_ptr + rows, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=rmask)


def flat(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, mode: str, rows: int, bk: int,
         warps: int) -> None:
    n, k = w.shape[0] // 2, w.shape[1]
    _flat_swiglu[(triton.cdiv(n, rows),)](x, w, out, n, k, MODE=FLAT_MODES[mode], RB=rows,
                                          BK=bk, num_warps=warps, launch_pdl=True)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n = w.shape[0] // 2
    y = w.float() @ x.float().reshape(-1)
    return torch.nn.functional.silu(y[:n]) * y[n:]


def chain_us(launch: Callable[[torch.Tensor, torch.Tensor], None], ws: list[torch.Tensor],
             outs: list[torch.Tensor]) -> float:
    """µs a launch of a graph of ``launch(w, out)`` over every weight copy in turn."""

    def run() -> None:
        for w, o in zip(ws, outs, strict=True):
            launch(w, o)

    return round(graph_us(run, len(ws)), 3)


def checked(launch: Callable[[torch.Tensor, torch.Tensor], None], x: torch.Tensor,
            w: torch.Tensor, out: torch.Tensor, what: str) -> None:
    out.fill_(float("nan"))
    launch(w, out)
    torch.cuda.synchronize()
    want = reference(x, w)
    err = ((out.float().reshape(-1) - want).norm() / want.norm()).item()
    if not err < 2e-2:  # (NaN fails too: an element never written)
        raise SystemExit(f"bench_gateup: {what} is wrong: relative error {err:.3g}")


def run_model(model: str, sms: int, log: list[str]) -> dict[str, Any]:
    a = ARGS[model]
    n, k = a.n_ff, a.n_embd
    nbytes = 2 * n * k * 2
    n_copy = max(8, -(-CHAIN_BYTES // nbytes))
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(2 * n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
          for _ in range(n_copy)]
    x = torch.randn(1, k, device="cuda", dtype=torch.float32, generator=g)
    outs = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(n_copy)]
    res: dict[str, Any] = {"bytes": nbytes, "launches": n_copy}

    def say(line: str) -> None:
        log.append(f"{model} {line}")
        print(log[-1], flush=True)

    for mode in ("pdl", "pre"):
        top = best(nbytes, mode, sms, [])
        res[f"read_{mode}"] = {"us": top["us"], "tile": top["tile"]}
        say(f"read {mode}: {top['us']:.2f} us, tile {top['tile']}")
    cfg = tuned_configs(a, 1)[("w13", 1)]
    assert isinstance(cfg, K.LinearConfig)  # (qkv's entry is a tuple; gate/up's a tile)
    for pdl in (1, 2):  # 1: wait first (the step's); 2: the first tile before the wait

        def ours(w: torch.Tensor, o: torch.Tensor, pdl: int = pdl) -> None:
            K.linear(x, w, o, mode=K.SWIGLU, cfg=cfg, pdl=pdl, evict="evict_first")

        checked(ours, x, ws[0], outs[0], f"ours pdl {pdl}")
        us = chain_us(ours, ws, outs)
        res[f"ours_pdl{pdl}"] = us
        say(f"ours pdl {pdl} ({cfg}): {us:.2f} us")
    for mode in FLAT_MODES:
        runs: list[dict[str, Any]] = []
        for rows, bk, warps in FLAT_TILES:

            def fl(w: torch.Tensor, o: torch.Tensor, rows: int = rows, bk: int = bk,
                   warps: int = warps, mode: str = mode) -> None:
                flat(x, w, o, mode, rows, bk, warps)

            checked(fl, x, ws[0], outs[0], f"flat {mode} {(rows, bk, warps)}")
            runs.append({"us": chain_us(fl, ws, outs), "tile": [rows, bk, warps]})
        runs.sort(key=lambda r: r["us"])
        res[f"flat_{mode}"] = runs
        say(f"flat {mode}: best {runs[0]['us']:.2f} us tile {runs[0]['tile']}; next "
            + ", ".join(f"{r['us']:.2f} {r['tile']}" for r in runs[1:4]))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gateup_out"))
    ap.add_argument("--models", default="0.5B,1.5B", help="comma-separated: 0.5B, 1.5B")
    args = ap.parse_args(argv)
    models = choices(ap, args.models, PRODUCTS, "model")
    if not torch.cuda.is_available():
        print("bench_gateup needs a CUDA GPU", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log: list[str] = []
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0)}
    for m in models:
        res[m] = run_model(m, sms, log)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gateup.json").write_text(json.dumps(res, indent=1))
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
