"""What one kernel boundary of the decode step costs, by how the next kernel waits.

A chain of small kernels in one CUDA graph, each reading what another program of the kernel
before it wrote (so every boundary is a whole-grid dependency, as between the step's kernels)
and writing its own output. Time per kernel, by how a kernel waits for the one before:

    plain     stream order (no PDL)
    pdl       launched early (``griddepcontrol.launch_dependents`` at its start), then
              ``griddepcontrol.wait``: the whole previous grid done and its writes flushed
    pdl_late  as ``pdl``, but the next kernel is let go only after this one's load
    flag      launched early too, then spinning on a counter that every program of the kernel
              before adds 1 to (release, after a block barrier) once its stores are issued;
              the poll is an acquire atomic, the data read past L1 (``.cg``)
    flag_vol  the same, polling with volatile loads, one acquire atomic once the count is there

Each is checked: after the chain every output element must equal the chain's length (a
kernel that read before its predecessor's write would leave a smaller count). Run on the lent
GPU: ``python3 scripts/bench_boundary.py --out DIR``; results in DIR/boundary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

MODES = {"plain": 0, "pdl": 1, "pdl_late": 2, "flag": 3, "flag_vol": 4}


@triton.jit
def _hop(src_ptr, dst_ptr, cnt_in, cnt_out, target, N, SHIFT, MODE: tl.constexpr,
         BLOCK: tl.constexpr):
    """dst[i] = src[j] + 1 over this program's BLOCK elements, where j is another program's
    element (``SHIFT`` programs on), so each program depends on a program it does not own."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if MODE == 1 or MODE == 3 or MODE == 4:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 1 or MODE == 2:
        tl.extra.cuda.gdc_wait()
    if MODE == 3:
        c = tl.atomic_add(cnt_in, 0, sem="acquire", scope="gpu")
        while c < target:
            c = tl.atomic_add(cnt_in, 0, sem="acquire", scope="gpu")
    if MODE == 4:
        c = tl.load(cnt_in, volatile=True)
        while c < target:
            c = tl.load(cnt_in, volatile=True)
        tl.atomic_add(cnt_in, 0, sem="acquire", scope="gpu")
    other = (pid + SHIFT) % nprog
    offs = tl.arange(0, BLOCK)
    x = tl.load(src_ptr + other * BLOCK + offs, cache_modifier=".cg")
    if MODE == 2:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(dst_ptr + pid * BLOCK + offs, x + 1)
    if MODE == 3 or MODE == 4:
        tl.debug_barrier()
        tl.atomic_add(cnt_out, 1, sem="release", scope="gpu")


def chain(mode: str, nprog: int, hops: int, block: int = 256, warps: int = 4,
          reps: int = 30) -> dict[str, float | bool]:
    m = MODES[mode]
    a = torch.zeros(nprog * block, device="cuda")
    b = torch.zeros_like(a)
    cnt = torch.zeros(hops + 1, dtype=torch.int32, device="cuda")
    pdl = {"launch_pdl": True} if m else {}

    def run() -> None:
        a.zero_()
        cnt.zero_()
        cnt[0:1].fill_(nprog)  # the first hop's input is ready
        bufs = (a, b)
        for i in range(hops):
            _hop[(nprog,)](bufs[i % 2], bufs[(i + 1) % 2], cnt[i:], cnt[i + 1:], nprog,
                           nprog * block, 7, MODE=m, BLOCK=block, num_warps=warps, **pdl)

    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1000 / hops)
    final = (a, b)[hops % 2]
    ok = bool((final == hops).all())
    return {"us_per_kernel": statistics.median(times), "min": min(times), "correct": ok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--hops", type=int, default=168)
    ap.add_argument("--programs", default="64,512,1024")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_boundary needs a CUDA GPU", file=sys.stderr)
        return 2
    res: dict[str, dict[str, object]] = {}
    for n in (int(x) for x in args.programs.split(",")):
        for mode in args.modes.split(","):
            try:
                r = chain(mode, n, args.hops)
            except Exception as e:  # noqa: BLE001
                r = {"error": str(e).splitlines()[0][:200]}
            res.setdefault(str(n), {})[mode] = r
            print(n, mode, r, flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "boundary.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
