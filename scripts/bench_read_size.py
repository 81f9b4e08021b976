"""What it costs a kernel that waits for the one before to read N MB: the ceiling of a product.

The one-token step's products are separate kernels, each reading its weights (2-55 MB) after
the kernel before has finished. Run 194's trace put the 0.5B's four products' loops at 11.5 µs
a layer, above the 11.0 µs its 70 % goal leaves a layer for everything. Whether that is our
products' fault or the size's is what this measures: a kernel that does nothing but read its
N MB (loads of up to 16 bytes, ``evict_first``, a float32 sum a program), at the best of a sweep
of tiles and grids, in a CUDA graph of L such kernels, each over a buffer of its own (L x N ≥
200 MB, well past the 50 MB L2, so every launch reads DRAM), by how each waits for the one before:

    plain  stream order
    pdl    launched early (``gdc_launch_dependents`` at its start), then ``gdc_wait``: as the
           step's gate/up waits before it reads
    pre    launched early, its first tile loaded before ``gdc_wait`` and the rest after: as the
           step's qkv, o-projection and down projection load theirs (the best a product whose
           input comes from the kernel before can do, one tile held over the boundary)
    free   launched early and never waiting: reads overlap across launches, no dependency
           (what the bytes cost with no boundary at all; not a possible product)

then the four reads of each model chained as the step's layers (qkv, o-projection, gate/up,
down, each in its best tile, the model's layer count), and, for scale, one kernel reading
1 GiB and the copy bandwidth of ``bench_gpu`` (the floor's denominator). Per size: µs a launch
(the graph's time over L), GB/s of bytes read, and the tile that gave it. The sizes are the
default pair's four products of each model; the sums of their best times are printed against
what each model's goal leaves a layer (docs/gpu-notes.md, session 21).

Run on the lent GPU: ``python3 scripts/bench_read_size.py --out DIR`` (DIR/read_size.json).
Every configuration's sums are checked against torch's before it is timed (outputs poisoned
first): a kernel that skipped bytes would be fast and wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import copy_bandwidth, graph_us, time_ms  # noqa: E402  # the benchmarks' timers

MODES = {"plain": 0, "pdl": 1, "free": 2, "pre": 3}
MB = 1e6
#: The default pair's one-token products in bytes (bf16): qkv, o-projection, gate/up, down.
PRODUCTS = {
    "0.5B": {"qkv": (896 + 2 * 128) * 896 * 2, "wo": 896 * 896 * 2,
             "w13": 2 * 4864 * 896 * 2, "w2": 896 * 4864 * 2},
    "1.5B": {"qkv": (1536 + 2 * 256) * 1536 * 2, "wo": 1536 * 1536 * 2,
             "w13": 2 * 8960 * 1536 * 2, "w2": 1536 * 8960 * 2},
}
#: What each model's goal leaves a one-token layer, µs (run 194: goal step less the output
#: projection's loop, over the layers).
BUDGET_US = {"0.5B": 11.0, "1.5B": 28.6}
LAYERS = {"0.5B": 24, "1.5B": 28}
#: Tiles swept: (elements a program reads an iteration, warps, programs an SM).
TILES = [(b, w, p) for b in (1024, 2048, 4096, 8192) for w in (4, 8, 16)
         for p in (1, 2, 3, 4, 6, 8, 12, 16)]
CHAIN_BYTES = 256 * 2**20  # each chain reads this much (at most 128 launches: 206 MB for 1.6 MB)


@triton.jit
def _read(w_ptr, out_ptr, per_prog, MODE: tl.constexpr, BLOCK: tl.constexpr,
          GDC: tl.constexpr = 1):
    """out[pid] = the sum of this program's ``per_prog`` elements (a multiple of 16, so the
    masked loads stay up to 16 bytes wide). MODE 3 reads the first tile before its wait and the
    loop the rest. ``GDC`` 0 leaves the PDL calls out (Triton's interpreter has none), so the
    CPU tests run every mode's loads."""
    pid = tl.program_id(0)
    base = w_ptr + pid.to(tl.int64) * per_prog
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    start = 0
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 3:
        acc += tl.load(base + offs, mask=offs < per_prog, other=0.0,
                       eviction_policy="evict_first").to(tl.float32)
        start = BLOCK
    if (MODE == 1 or MODE == 3) and GDC:
        tl.extra.cuda.gdc_wait()
    for i in range(start, per_prog, BLOCK):
        acc += tl.load(base + i + offs, mask=i + offs < per_prog, other=0.0,
                       eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def layout(nbytes: int, programs: int) -> int:
    """Elements each program reads: ``nbytes`` of bf16 over ``programs``, rounded up to 16
    (a launch reads at most 32 bytes a program more than asked)."""
    return math.ceil(nbytes / 2 / programs / 16) * 16


def launch(w: torch.Tensor, out: torch.Tensor, per: int, mode: str, block: int,
           warps: int) -> None:
    extra = {"launch_pdl": True} if mode != "plain" else {}
    _read[(out.numel(),)](w, out, per, MODE=MODES[mode], BLOCK=block, num_warps=warps,
                          **extra)


def chain(nbytes: int, mode: str, block: int, warps: int, per_sm: int,
          sms: int) -> dict[str, Any]:
    """Time a graph of L reads of ``nbytes`` each, every one over its own buffer; µs a read."""
    programs = sms * per_sm
    per = layout(nbytes, programs)
    n_launch = max(8, min(128, math.ceil(CHAIN_BYTES / nbytes)))
    bufs = [torch.randn(programs * per, device="cuda", dtype=torch.bfloat16)
            for _ in range(n_launch)]
    outs = [torch.full((programs,), float("nan"), device="cuda") for _ in range(n_launch)]
    launch(bufs[0], outs[0], per, mode, block, warps)  # compile, and check one
    torch.cuda.synchronize()
    want = bufs[0].float().view(programs, per).sum(1)
    if not torch.allclose(outs[0], want, rtol=1e-3, atol=1e-2):
        raise SystemExit(f"bench_read_size: wrong sums for {nbytes} B, {mode}, tile "
                         f"{(block, warps, per_sm)}: max error "
                         f"{(outs[0] - want).abs().max().item():.3g}")

    def run() -> None:
        for b, o in zip(bufs, outs, strict=True):
            launch(b, o, per, mode, block, warps)

    us = graph_us(run, n_launch)
    read = programs * per * 2
    return {"us": round(us, 3), "GBs": round(read / us / 1e3, 1), "bytes_read": read,
            "tile": [block, warps, per_sm], "launches": n_launch}


def layer_chain(model: str, mode: str, tiles: dict[str, list[int]], sms: int) -> float:
    """µs a layer of a graph of the model's layers, each its four reads in the step's order
    (qkv, o-projection, gate/up, down), each with its own best tile for ``mode``: the
    products' reads as the step chains them, mixed sizes and all."""
    n_layer = LAYERS[model]
    plan = []
    for _ in range(n_layer):
        for kind, nbytes in PRODUCTS[model].items():
            block, warps, per_sm = tiles[kind]
            programs = sms * per_sm
            per = layout(nbytes, programs)
            plan.append((torch.randn(programs * per, device="cuda", dtype=torch.bfloat16),
                         torch.empty(programs, device="cuda"), per, block, warps))

    def run() -> None:
        for w, o, per, block, warps in plan:
            launch(w, o, per, mode, block, warps)

    return round(graph_us(run, n_layer), 3)


def best(nbytes: int, mode: str, sms: int, log: list[str]) -> dict[str, Any]:
    runs = [chain(nbytes, mode, b, w, p, sms) for b, w, p in TILES]
    top = min(runs, key=lambda r: r["us"])
    log.append(f"{nbytes / MB:7.2f} MB {mode:5s} {top['us']:7.2f} us {top['GBs']:7.0f} GB/s "
               f"tile {top['tile']} (worst {max(r['us'] for r in runs):.2f} us)")
    print(log[-1], flush=True)
    return {**top, "all": runs}


def big_read(sms: int) -> dict[str, Any]:
    """One kernel over 1 GiB, the best tile: the read bandwidth with no size effects."""
    nbytes = 2**30
    out = []
    for b, w, p in TILES:
        programs = sms * p
        per = layout(nbytes, programs)
        buf = torch.randn(programs * per, device="cuda", dtype=torch.bfloat16)
        o = torch.empty(programs, device="cuda")
        ms = time_ms(lambda buf=buf, o=o, per=per, b=b, w=w: launch(buf, o, per, "plain", b, w),
                     iters=10, reps=5)
        out.append({"GBs": round(programs * per * 2 / ms / 1e6, 1), "tile": [b, w, p]})
        del buf
    return max(out, key=lambda r: r["GBs"])


def choices(ap: argparse.ArgumentParser, text: str, known: Iterable[str], what: str) -> list[str]:
    """The comma-separated names of ``text``, each one of ``known`` (else argparse's error)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in known:
            ap.error(f"unknown {what} {n!r}: choose from {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("read_size_out"))
    ap.add_argument("--models", default="0.5B,1.5B",
                    help="whose four products to read, comma-separated (0.5B, 1.5B)")
    ap.add_argument("--modes", default="plain,pdl,pre,free",
                    help="how each read waits for the one before: plain, pdl, pre, free")
    args = ap.parse_args(argv)
    models = choices(ap, args.models, PRODUCTS, "model")
    modes = choices(ap, args.modes, MODES, "mode")
    if not torch.cuda.is_available():
        print("bench_read_size needs a CUDA GPU", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log: list[str] = []
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "sms": sms,
                           "copy_GBs": round(copy_bandwidth() / 1e9, 1)}
    res["read_1GiB"] = big_read(sms)
    print(f"copy {res['copy_GBs']} GB/s; one 1 GiB read {res['read_1GiB']}", flush=True)
    for model in models:
        res[model] = {}
        for kind, nbytes in PRODUCTS[model].items():
            res[model][kind] = {mode: best(nbytes, mode, sms, log) for mode in modes}
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "read_size.json").write_text(json.dumps(res, indent=1))
    print()
    for model in models:
        for mode in modes:
            total = sum(res[model][k][mode]["us"] for k in PRODUCTS[model])
            floor = sum(PRODUCTS[model].values()) / (res["copy_GBs"] * 1e3)
            print(f"{model} {mode:5s}: the four products' reads {total:6.2f} us a layer "
                  f"(their bytes at copy bandwidth {floor:5.2f}; the goal leaves a layer "
                  f"{BUDGET_US[model]:.1f} for everything)")
        for mode in modes:
            if mode == "free":
                continue
            tiles = {k: res[model][k][mode]["tile"] for k in PRODUCTS[model]}
            us = layer_chain(model, mode, tiles, sms)
            res.setdefault("layer_chain_us", {})[f"{model}:{mode}"] = us
            print(f"{model} {mode:5s}: the four reads chained as the step's layers "
                  f"{us:6.2f} us a layer")
        if {"pdl", "pre"} <= set(modes):
            total = sum(min(res[model][k]["pdl"]["us"], res[model][k]["pre"]["us"])
                        for k in PRODUCTS[model])
            print(f"{model} the better of pdl and pre a product: {total:6.2f} us a layer")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "read_size.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
