"""How fast can one kernel stream a large buffer on an H200, and what does an L2 round trip cost
another warp meanwhile? (``scripts/stream_probe.cu``)

Why: the persistent CUDA decode step (``openjarvis/engine/torch/csrc/decode_step.cu``) streams
its weights through a TMA ring (a producer warp's ``cp.async.bulk`` copies into NSTAGE ~24 KB
shared-memory stages, mbarrier handshakes with 8 consumer warps). Measured alone that ring
streams 2.6 GB at only ~3.3 TB/s (~77 % of the ~4.23 TB/s copy bandwidth), while a Triton GEMV
reading a 467 MB matrix reaches ~4.2 TB/s; and its round trips to L2 (grid barriers, loads of
activations written by other blocks) seem to cost ~1-1.3 us each while the stream runs. This
benchmark answers (a) which streaming configuration (ring depth, copy size, block-to-stage
layout, blocks per SM, or plain loads with so many in flight) reaches the highest read
bandwidth, and (b) how the L2-hit latency that another warp sees (a pointer chase in block 0)
depends on that configuration; a probe-only launch gives the unloaded latency.

Run on the lent H200 (``device`` tool), about a minute:

    python3 scripts/bench_stream.py --out $OUT

Each variant is compiled with NVRTC (nvcc where NVRTC is not found) from the -D macros below,
launched through the driver API on PyTorch's stream; one warm-up launch, then ``--reps`` launches
timed one by one with CUDA events (the median). GB/s counts the bytes read once per launch; "%
copy" is that over the copy bandwidth of ``bench_gpu.copy_bandwidth()`` (read + written bytes
per second, the floor the decode benchmarks use). One line prints per variant as it finishes;
every number goes to ``--out``/stream.json. A variant that fails to build or launch is reported
and skipped (a kernel fault poisons the CUDA context, so the run then stops, with what it has).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import copy_bandwidth  # noqa: E402  # the same floor as the decode benchmarks

from openjarvis.engine.torch.cuda_step import (  # noqa: E402  # same build and launch path
    _check,
    _driver,
    compile_cached,
    load_function,
    with_ptx_helpers,
)

SOURCE = Path(__file__).with_name("stream_probe.cu")


@functools.cache
def probe_source() -> str:
    """stream_probe.cu with decode_step.cu's PTX helpers in place of its marker: the ring here
    runs the decode kernel's own mbarrier and bulk-copy code, not a copy of it."""
    return with_ptx_helpers(SOURCE.read_text())


STAGE = 24576  # bytes of one TMA stage (the decode kernel's are ~24-28 KB)
#: The probe array (int64): a 16-entry header (see the source), then PROBE_N chain entries,
#: one per 128-byte line (PROBE_STRIDE entries apart), so that hops spread over L2 slices.
PROBE_HEADER = 16
PROBE_N = 1024
PROBE_STRIDE = 16
#: Dynamic shared memory a block may ask for on sm_90, and an SM's total (227 / 228 KB).
SMEM_OPTIN = 232448
SMEM_PER_SM = 233472
RESERVED_PER_BLOCK = 1024  # shared memory the system keeps per resident block on sm_90

T0 = time.monotonic()
RES: dict[str, Any] = {}


def log(*a: object) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


@dataclass(frozen=True)
class Config:
    """One variant: the kernel, its macros, and blocks per SM (the grid is SMs x per_sm)."""

    name: str
    kernel: str  # "tma_stream" or "ldg_stream"
    macros: tuple[tuple[str, int], ...]
    per_sm: int = 1

    @property
    def m(self) -> dict[str, int]:
        return dict(self.macros)

    @property
    def threads(self) -> int:
        m = self.m
        if self.kernel == "tma_stream":
            return (m["NCW"] + 1 + m["PROBE"]) * 32
        return (m["NW"] + m["PROBE"]) * 32

    @property
    def smem(self) -> int:
        """Shared memory the kernel lays out (the ring, its barriers, the done counter)."""
        m = self.m
        return m["NSTAGE"] * (m["STAGE_BYTES"] + 16) + 16 if self.kernel == "tma_stream" else 0


def tma(nstage: int, copy: int, layout: int, per_sm: int = 1, read: int = 1) -> Config:
    """A TMA-ring variant (NCW = 8 consumers, 24 KB stages, probe on)."""
    name = f"tma ns{nstage} copy{copy} L{layout} {per_sm}/SM" + ("" if read else " noread")
    macros = dict(NCW=8, NSTAGE=nstage, STAGE_BYTES=STAGE, COPY_BYTES=copy, LAYOUT=layout,
                  READ=read, PROBE=1, MINB=per_sm)
    return Config(name, "tma_stream", tuple(sorted(macros.items())), per_sm)


def ldg(nw: int, unroll: int, per_sm: int, layout: int = 1, hint: int = 1) -> Config:
    """A plain-load variant (probe on); ``hint``: LDHINT in the source."""
    hints = {0: "ld.cs", 1: "ld.nc+evict_first", 2: "ld"}
    name = f"ldg nw{nw} unroll{unroll} L{layout} {per_sm}/SM {hints[hint]}"
    macros = dict(NW=nw, UNROLL=unroll, LAYOUT=layout, LDHINT=hint, PROBE=1, MINB=per_sm)
    return Config(name, "ldg_stream", tuple(sorted(macros.items())), per_sm)


def configs(quick: bool) -> list[Config]:
    """The sweep (about 30 builds); the best plain-load variant is re-run with the other layout
    and load hints afterwards (``followups``)."""
    if quick:
        return [tma(4, 3072, 0), tma(7, 3072, 0), tma(7, 3072, 1), tma(4, 3072, 1, per_sm=2),
                ldg(8, 8, 1), ldg(8, 8, 2)]
    out: list[Config] = []
    for layout in (0, 1):  # 1 block/SM: ring depth at 3 KB copies, copy size at depth 7
        out += [tma(ns, 3072, layout) for ns in (2, 4, 7, 9)]
        out += [tma(7, copy, layout) for copy in (1536, 24576)]
    for layout in (0, 1):  # 2 blocks/SM (4 x 24 KB stages each: 2 x 97 KB fit 228 KB)
        out += [tma(ns, 3072, layout, per_sm=2) for ns in (3, 4)]
    out += [tma(7, 3072, layout, read=0) for layout in (0, 1)]  # does reading smem matter?
    for nw in (8, 16):
        for unroll in (4, 8):
            for per_sm in (1, 2, 4):
                if (nw + 1) * per_sm <= 64:  # warps an SM holds (16+1 warps x 4 do not fit)
                    out.append(ldg(nw, unroll, per_sm))
    return out


def followups(best: Config) -> list[Config]:
    """The best plain-load variant with the contiguous layout, and with the other load hints."""
    m = best.m
    nw, unroll, per_sm = m["NW"], m["UNROLL"], best.per_sm
    return [ldg(nw, unroll, per_sm, layout=0), ldg(nw, unroll, per_sm, hint=0),
            ldg(nw, unroll, per_sm, hint=2)]


# -- building and launching -------------------------------------------------------------------


@dataclass
class Builder:
    """Compiles the source per macro set (``cuda_step.compile_cached``: NVRTC, else nvcc) and
    loads it; cached in memory."""

    arch: str
    lib: ctypes.CDLL = field(default_factory=_driver)
    modules: dict[tuple[tuple[str, int], ...], tuple[ctypes.c_void_p, str, float]] = field(
        default_factory=dict)

    def module(self, macros: tuple[tuple[str, int], ...]) -> tuple[ctypes.c_void_p, str, float]:
        """(module, compiler, build seconds) for ``macros``."""
        if macros in self.modules:
            return self.modules[macros]
        t = time.monotonic()
        cubin, how = compile_cached(probe_source(), dict(macros), self.arch, name="stream_probe")
        secs = time.monotonic() - t
        mod = ctypes.c_void_p()
        _check(self.lib, self.lib.cuModuleLoadData(ctypes.byref(mod), cubin), "loading the module")
        self.modules[macros] = (mod, how, secs)
        return self.modules[macros]

    def function(self, cfg: Config, smem: int) -> tuple[ctypes.c_void_p, dict[str, Any]]:
        """The kernel of ``cfg``, with ``smem`` bytes of dynamic shared memory allowed (all of
        it carved out for shared memory), and how it was built and how many blocks fit an SM."""
        mod, how, secs = self.module(cfg.macros)
        fn, occ = load_function(self.lib, mod, cfg.kernel, smem, cfg.threads, carveout=100)
        return fn, {"compiler": how, "build_s": round(secs, 3), "occupancy": occ}

    def launch(self, fn: ctypes.c_void_p, grid: int, threads: int, smem: int,
               args: list[int]) -> None:
        """One launch on PyTorch's current stream; ``args`` are the kernel's four 64-bit
        arguments (buffer, size, out, probe)."""
        vals = [ctypes.c_uint64(a) for a in args]
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(self.lib, self.lib.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, smem, stream,
                                                 argv, None), "launching")


def smem_for(cfg: Config, smem_per_sm: int) -> int:
    """Dynamic shared memory to ask for: what the kernel lays out, padded so that no more than
    ``per_sm`` blocks fit an SM, so the block scheduler cannot put two "1 block/SM" blocks on
    one SM and leave another idle."""
    pad = int(smem_per_sm / (cfg.per_sm + 0.5)) - RESERVED_PER_BLOCK
    return min(max(cfg.smem, pad // 128 * 128), SMEM_OPTIN)


def make_probe() -> torch.Tensor:
    """The pointer-chase array: one random cycle over PROBE_N entries (addresses, so that each
    hop is a single dependent load), its start in entry 0 of the header."""
    n = PROBE_HEADER + PROBE_N * PROBE_STRIDE
    dev = torch.zeros(n, dtype=torch.int64, device="cuda")
    base = dev.data_ptr()
    perm = torch.randperm(PROBE_N, generator=torch.Generator().manual_seed(0))
    nxt = torch.roll(perm, -1)
    host = torch.zeros(n, dtype=torch.int64)
    host[PROBE_HEADER + PROBE_STRIDE * perm] = base + 8 * (PROBE_HEADER + PROBE_STRIDE * nxt)
    host[0] = base + 8 * (PROBE_HEADER + PROBE_STRIDE * int(perm[0]))
    dev.copy_(host)
    return dev


def time_launches(fn: Callable[[], object], reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` launches (events around each), after the caller's
    warm-up."""
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
           for _ in range(reps)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in evs]


@dataclass
class Bench:
    """The buffer, the probe and the output shared by every variant."""

    b: Builder
    buf: torch.Tensor
    probe: torch.Tensor
    out: torch.Tensor
    sms: int
    smem_per_sm: int
    copy_Bps: float
    reps: int

    def run(self, cfg: Config, nbytes: int | None = None, grid: int | None = None) -> dict[str, Any]:
        """Warm-up, zero the probe's sums, time ``reps`` launches; GB/s and the probe's ns/hop.
        ``nbytes=0, grid=1``: the probe alone (unloaded L2)."""
        nbytes = self.buf.numel() if nbytes is None else nbytes
        grid = grid or self.sms * cfg.per_sm
        smem = smem_for(cfg, self.smem_per_sm)
        fn, info = self.b.function(cfg, smem)
        if nbytes and info["occupancy"] < cfg.per_sm:
            return {**info, "skipped": f"only {info['occupancy']} blocks fit an SM"}
        size = nbytes if cfg.kernel == "tma_stream" else nbytes // 16
        used = nbytes // STAGE * STAGE if cfg.kernel == "tma_stream" else size * 16
        args = [self.buf.data_ptr(), size, self.out.data_ptr(), self.probe.data_ptr()]
        assert grid * cfg.threads <= self.out.numel()

        def go() -> None:
            self.b.launch(fn, grid, cfg.threads, smem, args)

        go()
        torch.cuda.synchronize()
        self.probe[1:3].zero_()
        ms = time_launches(go, self.reps)
        ns, hops = (int(x) for x in self.probe[1:3].tolist())
        med = statistics.median(ms)
        res: dict[str, Any] = {
            **info, "macros": cfg.m, "grid": grid, "threads": cfg.threads, "smem": smem,
            "bytes": used, "ms": med, "ms_all": ms,
            "probe_ns_per_hop": ns / hops if hops else None,
            "probe_hops_per_launch": hops / self.reps,
        }
        if used:
            res["GBps"] = used / (med * 1e-3) / 1e9
            res["pct_copy"] = 100 * used / (med * 1e-3) / self.copy_Bps
        return res


def line(name: str, r: dict[str, Any]) -> str:
    """One printed line per variant."""
    if "skipped" in r or "error" in r:
        why = r.get("skipped") or (r.get("error", "").strip().splitlines() or ["?"])[-1]
        return f"{name:42s} {why}"
    bw = f"{r['GBps']:7.0f} GB/s {r['pct_copy']:5.1f} % copy" if "GBps" in r else ""
    hop = r.get("probe_ns_per_hop")
    probe = f"probe {hop:6.0f} ns/hop ({r['probe_hops_per_launch']:.0f} hops)" if hop else ""
    return f"{name:42s} {r['ms']:8.4f} ms {bw}  {probe}  occ {r['occupancy']}"


def torch_baselines(buf: torch.Tensor, copy_Bps: float, reps: int) -> dict[str, Any]:
    """Read-only reductions in PyTorch that read the whole buffer once."""
    out: dict[str, Any] = {}
    n = buf.numel() // 4 * 4
    cases: dict[str, Callable[[], object]] = {
        "torch int32 sum": lambda: buf[:n].view(torch.int32).sum(),
        "torch bf16 sum (fp32 acc)": lambda: buf[:n].view(torch.bfloat16).sum(dtype=torch.float32),
    }
    for name, fn in cases.items():
        try:
            fn()
            torch.cuda.synchronize()
            ms = statistics.median(time_launches(fn, reps))
            r: dict[str, Any] = {"ms": ms, "bytes": n, "GBps": n / (ms * 1e-3) / 1e9,
                 "pct_copy": 100 * n / (ms * 1e-3) / copy_Bps}
            log(f"{name:42s} {ms:8.4f} ms {r['GBps']:7.0f} GB/s {r['pct_copy']:5.1f} % copy")
        except Exception:  # noqa: BLE001
            r = {"error": traceback.format_exc(limit=2)}
            log(name, "failed:", r["error"])
        out[name] = r
    return out


def context_ok() -> bool:
    """False once a kernel fault has poisoned the CUDA context (nothing more can run)."""
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--gib", type=float, default=2.5, help="buffer size in GiB")
    ap.add_argument("--reps", type=int, default=10, help="timed launches per variant")
    ap.add_argument("--quick", action="store_true", help="a few variants only")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "stream.json"

    def save() -> None:
        path.write_text(json.dumps(RES, indent=1, default=str))

    props = torch.cuda.get_device_properties(0)
    cap = torch.cuda.get_device_capability(0)
    smem_per_sm = int(getattr(props, "shared_memory_per_multiprocessor", SMEM_PER_SM))
    RES["device"] = {"name": props.name, "sms": props.multi_processor_count,
                     "smem_per_sm": smem_per_sm, "l2_bytes": getattr(props, "L2_cache_size", None)}
    RES["date"] = time.strftime("%Y-%m-%d %H:%M")
    copy_Bps = copy_bandwidth()
    RES["copy_GBps"] = copy_Bps / 1e9
    log(f"copy bandwidth {copy_Bps / 1e9:.0f} GB/s (read + written)")
    torch.cuda.empty_cache()

    nbytes = int(args.gib * 2**30) // STAGE * STAGE
    buf = torch.randint(1, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    torch.cuda.current_stream().synchronize()  # the primary context exists for the driver calls
    bench = Bench(Builder(f"sm_{cap[0]}{cap[1]}"), buf, make_probe(),
                  torch.empty(1 << 20, dtype=torch.float32, device="cuda"),
                  props.multi_processor_count, smem_per_sm, copy_Bps, args.reps)
    RES["nbytes"] = nbytes
    RES["torch"] = torch_baselines(buf, copy_Bps, args.reps)
    save()

    results: dict[str, Any] = {}
    RES["configs"] = results
    todo = configs(args.quick)
    probe_cfg = ldg(8, 4, 1)
    todo_probe = True
    i = 0
    broken = False
    while i < len(todo):
        cfg = todo[i]
        i += 1
        try:
            results[cfg.name] = bench.run(cfg)
        except Exception:  # noqa: BLE001
            results[cfg.name] = {"error": traceback.format_exc(limit=3)}
            broken = not context_ok()
        log(line(cfg.name, results[cfg.name]))
        save()
        if broken:
            log("the CUDA context is lost (a kernel fault): stopping here")
            break
        if i == len(todo) and todo_probe:  # the sweep is done: follow-ups, then the probe alone
            todo_probe = False
            ldgs = {k: v for k, v in results.items() if k.startswith("ldg") and "GBps" in v}
            if ldgs:
                top_ldg = max(ldgs, key=lambda k: ldgs[k]["GBps"])
                base = next(c for c in todo if c.name == top_ldg)
                todo += [c for c in followups(base) if c.name not in results]
    if not broken:  # the unloaded round trip: block 0's probe with nothing streaming
        for kind, cfg in (("ldg", probe_cfg), ("tma", tma(4, 3072, 0))):
            try:
                r = bench.run(cfg, nbytes=0, grid=1)
            except Exception:  # noqa: BLE001
                r = {"error": traceback.format_exc(limit=3)}
            RES[f"probe_only_{kind}"] = r
            log(line(f"probe only ({kind} kernel, 1 block)", r))
            save()
    timed = {k: v for k, v in results.items() if "GBps" in v}
    if timed:
        top = sorted(timed, key=lambda k: -timed[k]["GBps"])[:5]
        log("fastest:", "; ".join(f"{k}: {timed[k]['GBps']:.0f} GB/s" for k in top))
    log("done ->", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
