# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Does a buffer read ``evict_last``, with L2 set aside for persisting lines, stay in L2 while a
larger stream passes through? Measured by the latency of a pointer chase, on a GPU.

Why (session 35): an experiment, ``Runner.kv_l2`` (commit 901207a holds it; removed), kept
the K/V cache ``evict_last`` in a set-aside, to give back what an unhinted stream at a step's
end costs the 0.5B's next step (~20 µs @512, session 34 run 288). It gave back nothing (run
291). Either such lines do not survive the stream, or what the stream pushes out is not the
K/V. This probe answers the first part alone: a buffer of ``--buffer`` MB (the 0.5B's K/V
@512 is 6.3 MB) is read whole with a policy (``mark``: none, ``evict_last`` or
``evict_first``), a stream of ``--flush`` MB goes through L2 (none, ``evict_first`` loads or
unhinted ones), and then one warp chases pointers through the buffer's lines, each load
waiting on the one before: ns per load (a chase of 2 x ``--steps`` less one of ``--steps``,
so that the launch cancels) is L2's latency where the lines stayed, DRAM's where they did
not. Every combination of set-aside (0 or ``--aside`` MiB), mark and flush.
Run 300 (H200, the launch cancelled): L2 145.5 ns, DRAM 337.9; see docs/gpu-notes.md,
session 35.

    python3 scripts/bench_l2_keep.py --out $OUT/l2

``--restream MB[,MB...]`` asks the step-to-step question instead (session 36): how much of a
stream read ``evict_first`` is still in L2 when the same stream is read again, as a step's
weights are by the next step. Each size is read once and timed on a second read right after
(warm), against a read after a normal-priority ``--flush`` (cold, nothing left), for
weights read ``evict_first`` or unhinted, and again with ``--aside`` MiB of ``evict_last``
lines read between (the set-aside that session 36's ``Runner.l2_keep`` filled with the first
layers' weights; commit 59c5557 holds it: the 0.5B's step @512 lost 8-42 µs with it, run 303).
Run 305 (H200): a re-read of 200 MB or more saves nothing (under 1.3 µs) in any policy, so a
step's weights leave the next step nothing in L2; 12-30 MB re-read unhinted save 1.7-3.6 µs,
``evict_first`` 0.1-0.6; with 26.25 MiB of kept lines, a 30 MB unhinted set no longer hits.
Run 310: a pipelined loop's ``evict_first`` loads (``cp.async``, the hint dropped by Triton 3.6)
keep 20-30 MB in L2 as unhinted ones do (3.7-4.3 µs saved); a streaming access policy window
(``cuda_step.stream_window``) makes them stream (0.1-0.5), launched directly or from a graph.

    python3 scripts/bench_l2_keep.py --out $OUT/l2 --restream 6,12,20,30,50,200,1000
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjarvis.engine.torch import cuda_step  # noqa: E402

LINE = 32  # int32 elements in a 128-byte line


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EV: tl.constexpr):
    """Read ``BLOCK`` elements a program with policy ``EV`` (one stage: the hint is kept) and
    store their sum, so the loads are not dropped."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i, mask=i < n, other=0, eviction_policy=EV)
    tl.store(out_ptr + tl.program_id(0), tl.sum(v, 0))


@triton.jit
def _read_loop_kernel(x_ptr, out_ptr, n, per, BLOCK: tl.constexpr, EV: tl.constexpr,
                      STAGES: tl.constexpr):
    """Read ``per`` blocks of ``BLOCK`` a program in a loop that Triton pipelines through
    shared memory (``cp.async``, as the screen's and the attention's loads are) where
    ``STAGES`` > 1: Triton 3.6 drops ``EV`` from such loads (session 34)."""
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    base = tl.program_id(0) * per * BLOCK
    for j in tl.range(0, per, num_stages=STAGES):
        i = base + j * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + i, mask=i < n, other=0, eviction_policy=EV)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, 0))


def read_loop(x: torch.Tensor, out: torch.Tensor, ev: str, block: int = 1024, per: int = 16
              ) -> None:
    _read_loop_kernel[(triton.cdiv(x.numel(), block * per),)](
        x, out, x.numel(), per, BLOCK=block, EV=ev, STAGES=3, num_warps=4)


@triton.jit
def _chase_kernel(a_ptr, out_ptr, steps):
    """One lane follows ``steps`` pointers: each load's address is the value loaded before."""
    p = tl.load(a_ptr)
    for _ in range(steps):
        p = tl.load(a_ptr + p, cache_modifier=".cg")  # (past L1: one chase reads L2 or DRAM)
    tl.store(out_ptr, p)


def read(x: torch.Tensor, out: torch.Tensor, ev: str, block: int = 4096) -> None:
    _read_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block, EV=ev,
                                                   num_warps=8, num_stages=1)


def chase_buffer(nbytes: int, device: str = "cuda", seed: int = 35) -> torch.Tensor:
    """int32 elements whose lines form one random cycle: the first element of each line holds
    the index of the next line's first element."""
    lines = nbytes // (LINE * 4)
    order = torch.randperm(lines, generator=torch.Generator().manual_seed(seed))
    a = torch.zeros(lines * LINE, dtype=torch.int32)
    nxt = torch.roll(order, -1)
    a[order * LINE] = (nxt * LINE).to(torch.int32)
    return a.to(device)


def restream_sizes(spec: str) -> list[float] | None:
    """``--restream``'s sizes in MB, or None where one is not a finite number > 0."""
    try:
        sizes = [float(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        return None
    return sizes if sizes and all(math.isfinite(v) and v > 0 for v in sizes) else None


def check(args: argparse.Namespace) -> str:
    """What is wrong with these arguments, or ""."""
    if not all(math.isfinite(v) for v in (args.buffer, args.flush, args.aside)):
        return "--buffer, --flush and --aside must be finite numbers"
    if args.buffer <= 0 or args.flush < 0 or args.aside < 0 or args.steps <= 0 or args.reps < 1:
        return "--buffer must be > 0, --flush and --aside >= 0, --steps and --reps > 0"
    sizes = restream_sizes(args.restream) if args.restream else []
    if sizes is None:
        return f"--restream takes sizes in MB > 0, comma-separated, not {args.restream!r}"
    for name, mb in (("--buffer", args.buffer), ("--flush", args.flush),
                     *(("--restream", v) for v in sizes)):
        if int(mb * 1e6) // 4 >= 2**31:
            return f"{name} {mb:g} MB is past what int32 indices reach (8.6 GB): give less"
    lines = int(args.buffer * 1e6) // (LINE * 4)
    if lines <= 2 * args.steps and not sizes:
        # (the chase's first load reads a line too: 2 x steps + 1 lines, each met once)
        return (f"--buffer {args.buffer:g} MB holds {lines} lines; a chase of 2 x --steps "
                f"({2 * args.steps}) and its first load must meet each line once: give a larger "
                f"--buffer or fewer --steps")
    return ""


def chase_ns(a: torch.Tensor, sink: torch.Tensor, steps: int, before: Callable[[], None]
             ) -> tuple[float, float]:
    """ns a dependent load: a chase of ``2 * steps`` less one of ``steps``, each right after
    ``before()`` (so the launch and the time to the first load cancel); and the short chase's
    own ns a load, launch counted, which reads only the lines a stream met first (run 300's
    ``evict_first`` survival rose where the launch left the figure, so both are kept)."""
    ms = []
    for n in (steps, 2 * steps):
        before()
        b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        e = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        b.record()
        _chase_kernel[(1,)](a, sink, n, num_warps=1, num_stages=1)
        e.record()
        e.synchronize()
        ms.append(b.elapsed_time(e))
    return float(ms[1] - ms[0]) * 1e6 / steps, float(ms[0]) * 1e6 / steps


def timed_read(reader: Callable[[], None], before: Callable[[], None]) -> float:
    """µs of one ``reader()``, right after ``before()``. The GPU first
    sleeps ~0.5 ms, so that ``before()``'s kernels, the event and the read are all queued
    before the event is reached: otherwise a short ``before()`` ends first and the read's
    launch is timed too (run 304's 20 and 50 MB warm reads, 2-3x the cold ones)."""
    torch.cuda._sleep(1_000_000)  # (clock cycles: ~0.5 ms at the H200's 1.98 GHz)
    before()
    b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    e = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    b.record()
    reader()
    e.record()
    e.synchronize()
    return float(b.elapsed_time(e)) * 1e3


#: ``--restream``'s policies: the loads' own hint (``evict_first``, or none), or none with the
#: stream's access policy window marking the stream's bytes streaming (``cuda_step.
#: stream_window``), launched directly (``window``) or replayed from a CUDA graph captured with
#: the window set (``window_graph``): does a captured kernel keep its stream's window? And
#: the same through a pipelined loop (``loop_*``, ``cp.async`` copies): does the window reach
#: loads that lost their own hint?
RESTREAM_POLICIES = ("evict_first", "", "window", "window_graph", "loop_evict_first",
                     "loop_", "loop_window", "loop_window_graph")


def reader_for(x: torch.Tensor, sink: torch.Tensor, policy: str) -> Callable[[], None]:
    """A read of ``x`` under ``policy`` (``RESTREAM_POLICIES``)."""
    rd = read_loop if policy.startswith("loop_") else read
    policy = policy.removeprefix("loop_")
    if policy in ("evict_first", ""):
        return lambda: rd(x, sink, policy)

    def windowed() -> None:
        stream = torch.cuda.current_stream().cuda_stream
        cuda_step.stream_window(stream, x.data_ptr(), x.numel() * x.element_size())
        rd(x, sink, "")
        cuda_step.stream_window(stream, 0, 0)

    if policy == "window":
        return windowed
    windowed()  # (compiled before the capture)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        windowed()
    return g.replay


def restream(args: argparse.Namespace, sizes: list[float]) -> dict[str, dict[str, float]]:
    """``--restream``: per size, policy and set-aside, µs of a cold and of a warm read and
    what the warm one saves (and that saving as MB at the cold read's rate)."""
    f = torch.ones(int(args.flush * 1e6) // 4, dtype=torch.int32, device="cuda")
    k = torch.ones(int(args.aside * 2**20) // 4, dtype=torch.int32, device="cuda")
    most = max(int(max(sizes) * 1e6) // 4, f.numel(), k.numel())
    sink = torch.zeros(triton.cdiv(most, 4096), dtype=torch.int32, device="cuda")
    table: dict[str, dict[str, float]] = {}
    for mb in sizes:  # (one size's buffers freed before the next is made)
        table.update(restream_one(args, mb, f, k, sink))
    cuda_step.set_persisting_l2(0)
    return table


def restream_one(args: argparse.Namespace, mb: float, f: torch.Tensor, k: torch.Tensor,
                 sink: torch.Tensor) -> dict[str, dict[str, float]]:
    """``restream`` for one size: every set-aside and policy."""
    x = torch.ones(int(mb * 1e6) // 4, dtype=torch.int32, device="cuda")
    table: dict[str, dict[str, float]] = {}
    for aside, ev in itertools.product(sorted({0.0, args.aside}), RESTREAM_POLICIES):
        granted = cuda_step.set_persisting_l2(int(aside * 2**20))

        def keep(aside: float = aside) -> None:
            if aside:
                read(k, sink, "evict_last")

        def cold(keep: Callable[[], None] = keep) -> None:
            read(f, sink, "")
            keep()

        reader = reader_for(x, sink, ev)

        def warm(reader: Callable[[], None] = reader, keep: Callable[[], None] = keep
                 ) -> None:
            reader()
            keep()

        timed_read(reader, cold)  # (untimed: compiles the kernels on first use)
        c = statistics.median(timed_read(reader, cold) for _ in range(args.reps))
        w = statistics.median(timed_read(reader, warm) for _ in range(args.reps))
        key = (f"{mb:g} MB read {ev or 'normal'}, "
               f"{granted / 2**20:.2f} MiB set aside{' and kept' if aside else ''}")
        table[key] = {"cold_us": c, "warm_us": w, "saved_us": c - w,
                      "saved_mb": (c - w) * mb / c}
        print(f"{key:<60} cold {c:8.2f} µs, warm {w:8.2f}: saves {c - w:6.2f} µs "
              f"({table[key]['saved_mb']:.1f} MB)", flush=True)
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for l2_keep.json")
    ap.add_argument("--buffer", type=float, default=6.0, help="MB chased (default 6)")
    ap.add_argument("--flush", type=float, default=400.0, help="MB streamed (default 400)")
    ap.add_argument("--aside", type=float, default=24.0, help="MiB set aside (default 24)")
    ap.add_argument("--steps", type=int, default=4096,
                    help="dependent loads timed a chase (default 4096; the buffer must hold "
                         "twice as many lines)")
    ap.add_argument("--reps", type=int, default=7, help="chases a combination (median)")
    ap.add_argument("--restream", default="",
                    help="MB sizes, comma-separated: time a stream read again right after "
                         "itself against after a flush, instead of the chase")
    args = ap.parse_args(argv)
    if err := check(args):
        print(f"bench_l2_keep: {err}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_l2_keep: needs a CUDA GPU (run it through the device tool)", file=sys.stderr)
        return 2
    if int(args.aside * 2**20) > (most := cuda_step.max_persisting_l2()):
        print(f"bench_l2_keep: --aside {args.aside:g} MiB is more than this GPU sets aside "
              f"({most / 2**20:g} MiB): give less", file=sys.stderr)
        return 2
    sizes = restream_sizes(args.restream) if args.restream else []
    if sizes:
        out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
               "flush_mb": args.flush, "aside_mib": args.aside, "reps": args.reps,
               "restream": restream(args, sizes)}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "l2_restream.json").write_text(json.dumps(out, indent=1))
        return 0
    a = chase_buffer(int(args.buffer * 1e6))
    f = torch.ones(int(args.flush * 1e6) // 4, dtype=torch.int32, device="cuda")
    sink = torch.zeros(max(1, triton.cdiv(max(a.numel(), f.numel()), 4096)), dtype=torch.int32,
                       device="cuda")
    res: dict[str, object] = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
                              "buffer_mb": args.buffer, "flush_mb": args.flush,
                              "aside_mib": args.aside, "steps": args.steps, "reps": args.reps}
    table: dict[str, float] = {}
    short: dict[str, float] = {}
    for aside, mark, flush in itertools.product(sorted({0.0, args.aside}),
                                                ("", "evict_last", "evict_first"),
                                                ("none", "evict_first", "normal")):
        granted = cuda_step.set_persisting_l2(int(aside * 2**20))

        def before(mark: str = mark, flush: str = flush) -> None:
            read(a, sink, mark)
            if flush != "none":
                read(f, sink, "" if flush == "normal" else "evict_first")

        ts = [chase_ns(a, sink, args.steps, before) for _ in range(args.reps + 1)]
        key = f"aside {granted / 2**20:.2f} MiB, mark {mark or 'normal'}, flush {flush}"
        table[key] = statistics.median(t[0] for t in ts[1:])
        short[key] = statistics.median(t[1] for t in ts[1:])
        print(f"{key:<55} {table[key]:7.1f} ns a load (first {args.steps}, launch counted: "
              f"{short[key]:.1f})", flush=True)
    cuda_step.set_persisting_l2(0)
    res["ns_per_load"] = table
    res["short_chase_ns_per_load"] = short
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "l2_keep.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
