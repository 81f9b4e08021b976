"""One-token products (GEMVs) fed by the tensor memory accelerator: a persistent Triton kernel
whose programs stream their weight tiles through a ring of shared-memory stages with TMA
(``tl.range(num_stages=...)`` over a tensor descriptor), against the step's own one-token
product (``kernels.linear``, the tuned tile) on the same shapes, alone, in one process.

Also the down projection's loads alone in its own grid and tiles (``_stream``: what its
access pattern allows without its arithmetic), and the down projection over its transposed
weights (``_gemv_t``: whole rows of W^T, long contiguous reads, partial sums added with float
atomics).

Why: run 110's trace has the 1.5B's gate/up streaming at ~80 % and its down projection at ~76 %
of copy bandwidth, where bench_stream's persistent CUDA ring read at 107 % (run 40). If a TMA
ring in Triton reads the weights much faster alone, it is worth putting into the step.

Each timing is a CUDA graph of ``--reps`` launches over different copies of the weights (more
bytes than L2 holds), median of 7; bandwidth = weight bytes read / time. Run on the lent GPU:
``python3 scripts/bench_gemv_tma.py --out DIR`` (DIR/gemv_tma.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import copy_bandwidth, time_ms  # noqa: E402

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.tuning import TUNED  # noqa: E402


@triton.jit
def _gemv_tma(w_desc, x_ptr, out_ptr, N, K_DIM, MODE: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr):
    """out[n] = sum_k W[n, k] x[k] (MODE 1: added into out, with float atomics where K is split
    SPLIT ways); MODE 2: W is [2N, K] (gate rows then up rows) and out[n] = silu(g) * u. Items
    are (row block, K split); one flat loop over (item, K tile) per program, so the TMA ring
    runs on across items."""
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    items = tl.cdiv(N, BN) * SPLIT
    k_tiles = tl.cdiv(tl.cdiv(K_DIM, BK), SPLIT)  # K tiles a split
    mine = tl.cdiv(items - pid, npg)
    acc = tl.zeros([BN], dtype=tl.float32)
    acc2 = tl.zeros([BN], dtype=tl.float32)
    rk = tl.arange(0, BK)
    rn = tl.arange(0, BN)
    for it in tl.range(0, mine * k_tiles, num_stages=STAGES):
        item = pid + (it // k_tiles) * npg
        nb = item // SPLIT
        ki = it % k_tiles
        k0 = ((item % SPLIT) * k_tiles + ki) * BK
        x = tl.load(x_ptr + k0 + rk, mask=k0 + rk < K_DIM, other=0.0).to(tl.float32)
        w = w_desc.load([nb * BN, k0])  # beyond K: zeros (the descriptor pads)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if MODE == 2:
            w2 = w_desc.load([N + nb * BN, k0])
            acc2 += tl.sum(w2.to(tl.float32) * x[None, :], axis=1)
        if ki == k_tiles - 1:
            rows = nb * BN + rn
            m = rows < N
            if MODE == 1:
                tl.atomic_add(out_ptr + rows, acc, mask=m, sem="relaxed")
            else:
                res = acc
                if MODE == 2:
                    res = acc * tl.sigmoid(acc) * acc2
                tl.store(out_ptr + rows, res.to(out_ptr.dtype.element_ty), mask=m)
            acc = tl.zeros([BN], dtype=tl.float32)
            acc2 = tl.zeros([BN], dtype=tl.float32)


@triton.jit
def _gemv_t(wt_ptr, x_ptr, out_ptr, N, K_DIM, KPP, BR: tl.constexpr, BNC: tl.constexpr):
    """MODE 1 over the transposed weights Wt [K, N]: a program takes KPP whole rows of Wt (each
    N * 2 contiguous bytes), BR at a time, sums x[k] * Wt[k, :] in registers (the rows of a
    thread's columns: no shuffles) and adds its [N] partial into out with float atomics."""
    pid = tl.program_id(0)
    k_lo = pid * KPP
    k_hi = tl.minimum(k_lo + KPP, K_DIM)
    rn = tl.arange(0, BNC)
    nm = rn < N
    acc = tl.zeros([BNC], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BR):
        rk = k0 + tl.arange(0, BR)
        km = rk < k_hi
        w = tl.load(wt_ptr + rk[:, None] * N + rn[None, :], mask=km[:, None] & nm[None, :],
                    other=0.0, eviction_policy="evict_first")
        xk = tl.load(x_ptr + rk, mask=km, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * xk[:, None], axis=0)
    tl.atomic_add(out_ptr + rn, acc, mask=nm, sem="relaxed")


def gemv_t(x: torch.Tensor, wt: torch.Tensor, out: torch.Tensor, br: int, programs: int,
           warps: int) -> None:
    k, n = wt.shape
    kpp = -(-k // programs)
    kpp = -(-kpp // br) * br
    _gemv_t[(triton.cdiv(k, kpp),)](wt, x, out, n, k, kpp, BR=br,
                                     BNC=triton.next_power_of_2(n), num_warps=warps)


@triton.jit
def _stream(w_ptr, out_ptr, N, K_DIM, BN: tl.constexpr, BK: tl.constexpr,
            SPLIT: tl.constexpr, SPLIT_MAJOR: tl.constexpr):
    """The down projection's loads alone: the same grid of (row block, K split) programs and
    [BN, BK] tiles as ``kernels.linear`` (evict-first), summed element-wise (no reduction a
    tile, no x) and one value a program stored: what its access pattern allows, without its
    arithmetic. SPLIT_MAJOR: the launch walks the splits first, so neighbouring programs read
    the same rows' two halves rather than neighbouring rows."""
    if SPLIT_MAJOR:
        nb = tl.program_id(0) // SPLIT
        sp = tl.program_id(0) % SPLIT
    else:
        nb = tl.program_id(0) % tl.cdiv(N, BN)
        sp = tl.program_id(0) // tl.cdiv(N, BN)
    k_per = tl.cdiv(K_DIM, SPLIT * BK) * BK
    k_lo = sp * k_per
    k_hi = tl.minimum(k_lo + k_per, K_DIM)
    rn = nb * BN + tl.arange(0, BN)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        m = (rn < N)[:, None] & (rk < k_hi)[None, :]
        acc += tl.load(w_ptr + rn[:, None] * K_DIM + rk[None, :], mask=m, other=0.0,
                       eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.sum(acc, axis=1), axis=0))


def stream(w: torch.Tensor, out: torch.Tensor, bn: int, bk: int, split: int,
           split_major: bool, warps: int) -> None:
    n, k = w.shape
    _stream[(triton.cdiv(n, bn) * split,)](w, out, n, k, BN=bn, BK=bk, SPLIT=split,
                                           SPLIT_MAJOR=split_major, num_warps=warps)


def gemv_tma(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, mode: int, bn: int, bk: int,
             split: int, stages: int, programs: int, warps: int) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    n = w.shape[0] // 2 if mode == 2 else w.shape[0]
    desc = TensorDescriptor.from_tensor(w, [bn, bk])
    grid = (min(programs, triton.cdiv(n, bn) * split),)
    _gemv_tma[grid](desc, x, out, n, w.shape[1], MODE=mode, BN=bn, BK=bk, SPLIT=split,
                    STAGES=stages, num_warps=warps)


def case(name: str, n: int, k: int, mode: int, x_dtype: torch.dtype, cfg: Any, reps: int,
         variants: list[tuple[int, ...]], sms: int,
         tvariants: list[tuple[int, int, int]] = (),
         svariants: list[tuple[int, int, int, bool, int]] = ()) -> dict[str, Any]:
    rows = 2 * n if mode == 2 else n
    nbytes = rows * k * 2
    copies = max(2, -(-(160 << 20) // nbytes))  # more bytes than L2 holds, round robin
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(rows, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
          for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", generator=gen).to(x_dtype)
    out_dtype = torch.float32 if mode == 1 else torch.bfloat16
    res: dict[str, Any] = {"bytes": nbytes}

    def timed(fn: Any) -> float:
        g = torch.cuda.CUDAGraph()
        fn(0)  # compile
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for i in range(reps):
                fn(i)
        return time_ms(g.replay) / reps

    out = torch.zeros(1, n, device="cuda", dtype=out_dtype)
    kmode = {0: K.STORE, 1: K.ADD, 2: K.SWIGLU}[mode]

    def base(i: int) -> None:
        K.linear(x, ws[i % copies], out, mode=kmode, cfg=cfg, evict="evict_first")

    out.zero_()
    base(0)
    ref = out.float().clone()
    ms = timed(base)
    res["linear"] = {"cfg": str(cfg), "us": ms * 1e3, "GBps": nbytes / ms / 1e6}
    print(name, "linear", res["linear"], flush=True)
    x1, o1 = x.reshape(-1), out.reshape(-1)

    def measure(key: str, run: Any) -> None:
        """Error against the step's kernel from a zeroed output, then the time; a variant that
        does not compile or launch is recorded with its error."""
        try:
            out.zero_()
            run(0)
            err = float((out.float() - ref).norm() / ref.norm())
            ms = timed(run)
            res[key] = {"us": ms * 1e3, "GBps": nbytes / ms / 1e6, "rel_err": err}
        except Exception as e:  # noqa: BLE001
            res[key] = {"error": str(e).splitlines()[0][:200] if str(e) else repr(e)[:200]}
        print(name, key, res[key], flush=True)

    for bn, bk, split, stages, per_sm, warps in variants:
        measure(f"tma_{bn}x{bk}_k{split}_s{stages}_p{per_sm}_w{warps}",
                lambda i, c=(bn, bk, split, stages, per_sm * sms, warps):
                gemv_tma(x1, ws[i % copies], o1, mode, *c))
    if mode == 1:  # the loads alone (_stream), in the launch order of the step and split-major
        scratch = torch.zeros(4 * n, device="cuda")  # a value a program: at most n x 4 splits
        for bn, bk, split, sm, warps in svariants:
            key = f"stream_{bn}x{bk}_k{split}{'_split_major' if sm else ''}_w{warps}"
            try:
                ms = timed(lambda i, c=(bn, bk, split, sm, warps):
                           stream(ws[i % copies], scratch, *c))
                res[key] = {"us": ms * 1e3, "GBps": nbytes / ms / 1e6}
            except Exception as e:  # noqa: BLE001
                res[key] = {"error": str(e).splitlines()[0][:200] if str(e) else repr(e)[:200]}
            print(name, key, res[key], flush=True)
    if mode == 1:  # the same product over the transposed weights (_gemv_t)
        wts = [w.t().contiguous() for w in ws]
        for br, per_sm, warps in tvariants:
            measure(f"transposed_br{br}_p{per_sm}_w{warps}",
                    lambda i, c=(br, per_sm * sms, warps): gemv_t(x1, wts[i % copies], o1, *c))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gemv_tma needs a CUDA GPU", file=sys.stderr)
        return 2

    def alloc(size: int, alignment: int, stream: Any) -> torch.Tensor:
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out: dict[str, Any] = {"bandwidth_GBps": copy_bandwidth() / 1e9, "sms": sms}
    print(out, flush=True)
    # (block_n, block_k, K splits, stages, programs an SM, warps); shared memory a stage:
    # block_n x block_k x 2 bytes (twice for gate/up)
    up = [(bn, 256, 1, st, p, 4) for bn in (8, 16) for st, p in ((4, 2), (6, 1), (10, 1))]
    up += [(8, 128, 1, 8, 2, 4), (16, 128, 1, 8, 1, 4), (4, 256, 1, 8, 2, 4)]
    down = [(bn, bk, sp, st, p, 4) for bn, bk in ((8, 256), (16, 256), (8, 512))
            for sp in (2, 4) for st, p in ((4, 2), (8, 1))]
    # transposed: (rows of Wt a load, programs an SM, warps)
    tv = [(br, p, w) for br in (2, 4, 8) for p in (1, 2, 4) for w in (4, 8)]
    # the loads alone: (block_n, block_k, K splits, split-major launch, warps); the first of
    # each model is its tuned tile's pattern
    sv15 = [(2, 1024, 2, False, 4), (2, 1024, 2, True, 4), (4, 1024, 2, False, 4),
            (2, 2048, 1, False, 4), (8, 256, 1, False, 4), (1, 1024, 4, False, 2)]
    sv05 = [(2, 1024, 4, False, 4), (2, 1024, 4, True, 4), (4, 1024, 2, False, 4),
            (8, 256, 1, False, 4)]
    t15, t05 = TUNED[(1536, 8960)], TUNED[(896, 4864)]
    for name, n, k, mode, xd, cfg, v, t, sv in (
        ("1.5B gate/up", 8960, 1536, 2, torch.float32, t15[("w13", 1)], up, [], []),
        ("1.5B down", 1536, 8960, 1, torch.bfloat16, t15[("w2", 1)], down, tv, sv15),
        ("0.5B down", 896, 4864, 1, torch.bfloat16, t05[("w2", 1)], [], tv, sv05),
    ):
        out[name] = case(name, n, k, mode, xd, cfg, args.reps, v, sms, t, sv)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gemv_tma.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
