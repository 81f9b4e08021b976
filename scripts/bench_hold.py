#!/usr/bin/env python3
"""What holding the next weights in shared memory through the chain would cost a one-token step.

The one-token step's chain of latency-bound kernels (qkv, attention, merge, o-projection: ~15
us a layer for the 1.5B, ~10 for the 0.5B) leaves DRAM mostly idle, and every way of using
that time from separate kernels (L2 prefetch from the kernels or a side stream, weight
prologues before a PDL wait) paid at most 1-2.5 % (docs/gpu-notes.md, sessions 3-17): lines in
L2 still cost gate/up a read each. Shared memory is different: 132 SMs x ~200 KB holds 16-26 MB,
a third to a half of the 1.5B's gate/up (55 MB) and all of the 0.5B's (17 MB), and rows held
there cost a product no DRAM time at all once its input is ready.

Before building the consumer (a side kernel that holds its rows until the o-projection is done,
then computes them, while gate/up streams the rest), this prices the holding alone: at each
layer's start, on the step's side stream (where ``Runner.l2_prefetch`` forks), one block an SM
bulk-copies its share of MiB of a buffer of the layer's own (as many bytes as held weights
would be) into its shared memory (the copy
engine, ``cp.async.bulk``, L2 evict-first) and keeps it for ``hold`` microseconds from its
start, then exits without computing anything. The step's own kernels are unchanged, so what
each variant adds to the step against ``off`` (no side stream) is the price: DRAM traffic
beside the chain, and SM shared memory taken from the chain's kernels while it is held.

``held`` variants build the consumer for the 0.5B (``HeldFFN``, through ``Runner.ffn_hook``):
each layer's gate/up computed by the held blocks from shared memory, handed to the down
projection through two flags and a signal kernel in gate/up's place; its ``TIMEMODE``s leave a
hand-off out (wrong results by design) to price it. Each held variant is first checked against
the default step's logits. Run on the GPU only::

    python3 scripts/bench_hold.py --out $OUT/h --models 1.5B,0.5B --positions 512,4096 \
        --carveout 100 --variants 8:0,16:12,16:12:6
    python3 scripts/bench_hold.py --out $OUT/h --models 0.5B --carveout 100 \
        --variants held:4,held:4:1:0,held:4:2:0

Session 19's answer (docs/gpu-notes.md): held bytes cost the chain about their own time at copy
bandwidth, and the held feed-forward lost 1.3 us a layer to today's gate/up.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import log, time_ms  # noqa: E402  # the same timer as the other step benchmarks

from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import Runner  # noqa: E402

MODELS = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}
#: Bytes a bulk copy moves at most here (a multiple of 16; the mbarrier counts the whole hold).
CHUNK = 32768
#: ... and when the copies are paced.
PACED_CHUNK = 4096
#: ``Hold.mib`` of the held feed-forward (``HeldFFN``): gate/up computed from shared memory.
HELD = -2.0
#: Threads of a held gate/up block.
HELD_THREADS = 256

HOLD_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
// @PTX_HELPERS@

// One block an SM: bulk-copy this block's share into shared memory, then keep it (the block
// stays resident) until hold_ns after the block started.
// spread_ns > 0: the copies paced over that long (chunk i issued at t0 + i * spread / n), so
// that the chain's memory round trips do not queue behind one burst.
extern "C" __global__ void __launch_bounds__(32) hold_kernel(const unsigned char* src,
                                                             u64 per_block, u64 hold_ns,
                                                             u32* sink, u64 spread_ns,
                                                             u64 chunk) {
  if (threadIdx.x != 0) return;
  u64 t0, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  u64* bar = (u64*)(smem + per_block);
  mbar_init(bar, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  mbar_expect_tx(bar, (u32)per_block);
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  const unsigned char* p = src + (u64)blockIdx.x * per_block;
  u64 n = (per_block + chunk - 1) / chunk, i = 0;
  for (u64 off = 0; off < per_block; off += chunk, ++i) {
    if (spread_ns) {
      do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - t0 >= i * spread_ns / n) break;
        __nanosleep(64);
      } while (true);
    }
    u64 left = per_block - off;
    bulk_load(smem + off, p + off, (u32)(left < chunk ? left : chunk), bar, policy);
  }
  while (!mbar_try_wait(bar, 0)) {
  }
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - t0 >= hold_ns) break;
    __nanosleep(128);
  } while (true);
  if (smem[per_block - 1] == 0x5a && smem[0] == 0x5a && blockIdx.x == 0x7fffffff) sink[0] = 1;
}
"""


HELD_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short bf16_t;
// @PTX_HELPERS@

__device__ __forceinline__ float bf_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ bf16_t f2bf(float f) {  // round to nearest even (no NaN inputs)
  u32 u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}
__device__ __forceinline__ u64 gtime() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A spin that gives up (and says so in err) rather than hang the GPU: 20 ms. SLEEP: ns a
// spinning thread sleeps between polls (0: none). TIMEMODE (pricing only, wrong results by
// design): 1, the held blocks do not wait for the o-projection; 2, nor does the signal kernel
// wait for the held blocks (no hand-off at all).
#define SPIN_NS 20000000ull
__device__ __forceinline__ void spin_pause() {
  if (SLEEP) __nanosleep(SLEEP);
}
#define NW (NT / 32)
#define HALF ((u64)PAIRS * KD * 2)

// One-token gate/up from weights held in shared memory: block b holds gate rows and up rows
// [b * PAIRS, +PAIRS) (copied by the copy engine, paced over spread_ns), waits until the
// signal kernel says the o-projection is done (flags[0]), then computes act = silu(g) * u for
// its rows from the o-projection's hand-off (x * g in xg, sums of squares in np slots of
// ssp), as the Triton SwiGLU consumer does, and counts itself done in flags[1].
extern "C" __global__ void __launch_bounds__(NT) held_w13(
    const unsigned char* w13, const float* xg, const float* ssp, u32 np, bf16_t* act,
    u32* flags, u64 spread_ns, u64 chunk, float eps, u32* err) {
  const u32 p0 = blockIdx.x * PAIRS;
  const u32 npairs = p0 >= NFF ? 0u : (NFF - p0 < PAIRS ? NFF - p0 : PAIRS);
  float* xs = (float*)(smem + 2 * HALF);
  float* red = xs + KD;
  u64* bar = (u64*)(red + 32);
  const u32 tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const u64 t0 = gtime();
  if (tid == 0) {
    mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const u64 bytes = (u64)npairs * KD * 2;
    mbar_expect_tx(bar, (u32)(2 * bytes));
    u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const unsigned char* g = w13 + (u64)p0 * KD * 2;
    const unsigned char* u = w13 + ((u64)NFF + p0) * KD * 2;
    const u64 n = 2 * ((bytes + chunk - 1) / chunk);
    u64 i = 0;
    for (u64 off = 0; off < bytes; off += chunk) {
      const u32 len = (u32)(bytes - off < chunk ? bytes - off : chunk);
      for (int half = 0; half < 2; ++half, ++i) {
        while (spread_ns && gtime() - t0 < i * spread_ns / n) __nanosleep(64);
        bulk_load(smem + half * HALF + off, (half ? u : g) + off, len, bar, policy);
      }
    }
    while (TIMEMODE == 0 && ld_acquire(flags) == 0) {
      if (gtime() - t0 > SPIN_NS) { atomicExch(err, 1u); break; }
      spin_pause();
    }
  }
  __syncthreads();
  for (u32 k = tid; k < KD; k += NT) xs[k] = __ldcg(xg + k);
  float ss = 0.f;
  for (u32 j = tid; j < np; j += NT) ss += __ldcg(ssp + j);
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) red[warp] = ss;
  while (!mbar_try_wait(bar, 0)) {
  }
  __syncthreads();
  float tot = 0.f;
  for (int w = 0; w < NW; ++w) tot += red[w];
  const float inv = rsqrtf(tot / KD + eps);
  for (u32 p = warp; p < npairs; p += NW) {
    const uint4* gr = (const uint4*)(smem + (u64)p * KD * 2);
    const uint4* ur = (const uint4*)(smem + HALF + (u64)p * KD * 2);
    float ga = 0.f, ua = 0.f;
    for (u32 c = lane; c < KD / 8; c += 32) {
      const uint4 gv = gr[c], uv = ur[c];
      const float* x = xs + c * 8;
      ga += bf_lo(gv.x) * x[0] + bf_hi(gv.x) * x[1] + bf_lo(gv.y) * x[2] + bf_hi(gv.y) * x[3] +
            bf_lo(gv.z) * x[4] + bf_hi(gv.z) * x[5] + bf_lo(gv.w) * x[6] + bf_hi(gv.w) * x[7];
      ua += bf_lo(uv.x) * x[0] + bf_hi(uv.x) * x[1] + bf_lo(uv.y) * x[2] + bf_hi(uv.y) * x[3] +
            bf_lo(uv.z) * x[4] + bf_hi(uv.z) * x[5] + bf_lo(uv.w) * x[6] + bf_hi(uv.w) * x[7];
    }
    for (int o = 16; o; o >>= 1) {
      ga += __shfl_xor_sync(0xffffffffu, ga, o);
      ua += __shfl_xor_sync(0xffffffffu, ua, o);
    }
    if (lane == 0) {
      const float gg = ga * inv, uu = ua * inv;
      act[p0 + p] = f2bf(gg / (1.f + __expf(-gg)) * uu);
    }
  }
  __syncthreads();
  if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(flags + 1) : "memory");
}

// On the main stream where gate/up was: launched with PDL, it lets the down projection's
// programs in at once, waits for the o-projection, tells the held blocks (flags[0]), waits
// for all of them (flags[1]) and resets both for the next step; the down projection's PDL
// wait then covers the held blocks' act. The held blocks were launched at the layer's start,
// so they are resident long before the down projection's programs arrive; were one not, and
// the down projection's waiting programs left it no room, the spin gives up after 20 ms and
// says so in err (the step's results are then wrong, and so may the next layer's flags be).
extern "C" __global__ void held_signal(u32* flags, u32 nblocks, u32* err) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags), "r"(1u) : "memory");
    const u64 t0 = gtime();
    while (TIMEMODE < 2 && ld_acquire(flags + 1) < nblocks) {
      if (gtime() - t0 > SPIN_NS) { atomicExch(err, 2u); break; }
      spin_pause();
    }
    if (TIMEMODE < 2) {
      flags[0] = 0;
      flags[1] = 0;
    }
  }
}
"""


def hold_source() -> str:
    """The hold kernel with decode_step.cu's PTX helpers (mbarriers, bulk copies) in place of
    its marker: the same copy code as the persistent CUDA step's ring."""
    from openjarvis.engine.torch.cuda_step import with_ptx_helpers

    return with_ptx_helpers(HOLD_SOURCE)


@dataclass(frozen=True)
class Hold:
    """A variant: ``mib`` MiB of each layer's gate/up held for ``hold_us`` from each block's
    start (0: exit once copied); ``mib`` 0 is ``off`` (no side stream), -1 the L2 prefetch the
    Runner does by default (``tuning.L2_PREFETCH``) for comparison."""

    mib: float
    hold_us: float = 0.0
    #: > 0: the copies paced over this long, in ``PACED_CHUNK`` pieces (else 32 KiB at once)
    spread_us: float = 0.0
    #: The held feed-forward only: its kernels' TIMEMODE (pricing: 1, no wait for the
    #: o-projection; 2, no hand-off at all) and SLEEP (ns between polls, 0: none).
    timemode: int = 0
    sleep_ns: int = 32

    @property
    def name(self) -> str:
        if self.mib == 0:
            return "off"
        if self.mib == HELD:
            return ("held" + (f"_over{self.spread_us:g}us" if self.spread_us else "")
                    + (f"_time{self.timemode}" if self.timemode else "")
                    + (f"_sleep{self.sleep_ns}" if self.sleep_ns != 32 else ""))
        if self.mib < 0:
            return "l2_default"
        paced = f"_over{self.spread_us:g}us" if self.spread_us else ""
        return f"hold_{self.mib:g}MB_{self.hold_us:g}us{paced}"


def parse_variants(spec: str) -> list[Hold]:
    """``off``, ``l2``, ``MIB:US[:SPREAD]`` or ``held[:SPREAD[:TIMEMODE[:SLEEP]]]`` items,
    comma-separated; ``off`` is always first (the baseline each round's ratios are taken
    against)."""
    out = [Hold(0)]
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item == "off":
            continue
        if item == "l2":
            out.append(Hold(-1))
            continue
        if item == "held" or item.startswith("held:"):
            try:
                over, *rest = (float(x) for x in (item[5:] or "0").split(":"))
                if len(rest) > 2:
                    raise ValueError
                mode = rest[0] if rest else 0.0
                sleep = rest[1] if len(rest) > 1 else 32.0
                if (mode not in (0, 1, 2) or sleep != int(sleep) or not 0 <= sleep <= 1000
                        or not 0 <= over <= 100):
                    raise ValueError
            except ValueError:
                raise SystemExit(f"bench_hold: variant {item!r}: use held or "
                                 "held:SPREAD[:TIMEMODE[:SLEEP]] (microseconds the copies are "
                                 "paced over; 0-2; ns between polls)") from None
            out.append(Hold(HELD, 0.0, over, int(mode), int(sleep)))
            continue
        try:
            mib, us, *spread = (float(x) for x in item.split(":"))
            if len(spread) > 1:
                raise ValueError
        except ValueError:
            raise SystemExit(f"bench_hold: variant {item!r}: use off, l2 or MIB:US[:SPREAD] "
                             "(e.g. 16:12 or 16:12:10)") from None
        if not (0 < mib <= 64 and 0 <= us <= 100 and 0 <= sum(spread) <= 100):
            raise SystemExit(f"bench_hold: variant {item!r}: MiB in (0, 64], hold and spread "
                             "in [0, 100] us")
        out.append(Hold(mib, us, sum(spread)))
    return out


class HoldKernel:
    """The compiled hold kernel, launched on PyTorch's current stream (graph-capturable)."""

    def __init__(self, device: torch.device, carveout: int | None = None) -> None:
        from openjarvis.engine.torch.cuda_step import _check, _driver, compile_cached

        # the runtime's context made current on this thread first: the driver calls use it
        self.sink = torch.zeros(1, dtype=torch.int32, device=device)
        torch.cuda.synchronize(device)
        self.lib = _driver()
        self.check = _check
        props = torch.cuda.get_device_properties(device)
        self.sms = props.multi_processor_count
        self.arch = arch = f"sm_{props.major}{props.minor}"
        macros = {"NSTAGE": 1, "STAGE_BYTES": 16, "NCW": 1}
        cubin, self.how = compile_cached(hold_source(), macros, arch, name="hold_probe")
        self.mod = ctypes.c_void_p()
        _check(self.lib, self.lib.cuModuleLoadData(ctypes.byref(self.mod), cubin),
               "loading the hold kernel")
        self.fn: ctypes.c_void_p | None = None
        self.occupancy, self.allowed = 0, 0
        self.carveout = carveout
        self.sources: dict[int, torch.Tensor] = {}

    def function(self, smem: int) -> tuple[ctypes.c_void_p, int]:
        """The kernel allowed ``smem`` bytes of dynamic shared memory, and its blocks an SM."""
        from openjarvis.engine.torch.cuda_step import load_function

        # The allowance is the function's, not a launch's: only ever raised, or a launch
        # asking more than the last (smaller) allowance is refused ("invalid argument").
        if smem > self.allowed:
            self.fn, self.occupancy = load_function(self.lib, self.mod, "hold_kernel", smem, 32,
                                                    carveout=self.carveout)
            self.allowed = smem
        assert self.fn is not None
        return self.fn, self.occupancy

    def source(self, w: torch.Tensor) -> torch.Tensor:
        """The bytes held at the layer of gate/up weights ``w``: a buffer of that layer's own
        (64 MiB, uninitialised), not ``w`` itself, so that no held line is also one that the
        step's gate/up then finds in L2, and so that more can be held than the 0.5B's 17 MB of
        gate/up."""
        if w.data_ptr() not in self.sources:
            self.sources[w.data_ptr()] = torch.empty(64 * 2**20, dtype=torch.uint8,
                                                     device=w.device)
        return self.sources[w.data_ptr()]

    def launch(self, w: torch.Tensor, mib: float, hold_us: float, spread_us: float = 0.0) -> None:
        """Hold ``mib`` MiB of the layer's bytes (one share a block, a block an SM)."""
        w = self.source(w)
        total = min(int(mib * 2**20), w.numel() * w.element_size())
        per_block = total // self.sms // 16 * 16
        if per_block < 16:
            raise SystemExit(f"bench_hold: {mib} MiB is less than 16 bytes an SM; hold more")
        smem = per_block + 16
        fn, occ = self.function(smem)
        if occ < 1:
            raise SystemExit(f"bench_hold: {per_block} bytes a block do not fit an SM's "
                             "shared memory")
        src = w.data_ptr() + w.numel() * w.element_size() - per_block * self.sms
        u64 = ctypes.c_uint64
        self.launch_fn(fn, self.sms, 32, smem, [
            u64(src), u64(per_block), u64(int(hold_us * 1000)), u64(self.sink.data_ptr()),
            u64(int(spread_us * 1000)), u64(PACED_CHUNK if spread_us else CHUNK)])

    def launch_fn(self, fn: ctypes.c_void_p, grid: int, threads: int, smem: int,
                  vals: list[Any], pdl: bool = False) -> None:
        """One launch of ``fn`` on PyTorch's current stream, with the arguments ``vals``
        (ctypes values; the driver copies them at the call, captured launches included);
        ``pdl``: as a programmatic dependent of the kernel before it on the stream."""
        from openjarvis.engine.torch.cuda_step import _LaunchAttr, _LaunchConfig

        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        attr = _LaunchAttr()
        attr.id, attr.value = 6, 1  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        cfg = _LaunchConfig(grid, 1, 1, threads, 1, 1, smem, stream,
                            ctypes.pointer(attr) if pdl else None, 1 if pdl else 0)
        self.check(self.lib, self.lib.cuLaunchKernelEx(ctypes.byref(cfg), fn, argv, None),
                   "launching a bench_hold kernel")


_ORIGINAL_PREFETCH = Runner._prefetch


def _prefetch_or_hold(self: Runner, w13: torch.Tensor, pf: tuple[float, int, int],
                      main: torch.cuda.Stream) -> torch.cuda.Stream:
    """``Runner._prefetch``, or where the Runner carries a ``hold`` (set by this script) the
    hold kernel on the same side stream, forked at the same point."""
    hold: tuple[HoldKernel, Hold] | None = getattr(self, "hold", None)
    if hold is None:
        return _ORIGINAL_PREFETCH(self, w13, pf, main)
    side = self.side_stream(main)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        hold[0].launch(w13, hold[1].mib, hold[1].hold_us, hold[1].spread_us)
    return side


class HeldFFN:
    """``Runner.ffn_hook``: each layer's gate/up computed by ``held_w13`` on the step's side
    stream from its weights held in shared memory (a block an SM, forked at the layer's
    start), ``held_signal`` on the main stream in gate/up's place."""

    def __init__(self, a: ModelArgs, kernel: HoldKernel, spread_us: float, timemode: int = 0,
                 sleep_ns: int = 32) -> None:
        from openjarvis.engine.torch.cuda_step import compile_cached, with_ptx_helpers

        self.a, self.k, self.spread_us = a, kernel, spread_us
        self.blocks = kernel.sms
        self.pairs = -(-a.n_ff // self.blocks)
        self.smem = self.smem_for(a, self.blocks)
        if not self.fits(a, self.blocks):
            raise SystemExit(f"bench_hold: the held gate/up of n_embd {a.n_embd}, n_ff {a.n_ff} "
                             f"needs {self.smem} bytes a block: more than an SM has (the 0.5B "
                             "fits; the 1.5B would need part of its rows held)")
        macros = {"NSTAGE": 1, "STAGE_BYTES": 16, "NCW": 1, "NFF": a.n_ff, "KD": a.n_embd,
                  "PAIRS": self.pairs, "NT": HELD_THREADS, "TIMEMODE": timemode,
                  "SLEEP": sleep_ns}
        cubin, _ = compile_cached(with_ptx_helpers(HELD_SOURCE), macros, kernel.arch,
                                  name="held_ffn")
        lib = kernel.lib
        self.mod = ctypes.c_void_p()
        kernel.check(lib, lib.cuModuleLoadData(ctypes.byref(self.mod), cubin), "loading held")
        from openjarvis.engine.torch.cuda_step import load_function

        self.fn_w13, occ = load_function(lib, self.mod, "held_w13", self.smem, HELD_THREADS,
                                         carveout=kernel.carveout)
        if occ < 1:
            raise SystemExit(f"bench_hold: held_w13 does not fit an SM ({self.smem} bytes)")
        self.fn_sig, _ = load_function(lib, self.mod, "held_signal", 0, 32)
        dev = torch.device("cuda")
        self.flags = torch.zeros(2, dtype=torch.int32, device=dev)
        self.err = torch.zeros(1, dtype=torch.int32, device=dev)

    @staticmethod
    def smem_for(a: ModelArgs, blocks: int) -> int:
        """Shared memory of a held block: its gate and up rows, x, the warps' sums, the
        mbarrier."""
        return 2 * -(-a.n_ff // blocks) * a.n_embd * 2 + a.n_embd * 4 + 32 * 4 + 16

    @staticmethod
    def fits(a: ModelArgs, blocks: int) -> bool:
        return a.n_embd % 8 == 0 and HeldFFN.smem_for(a, blocks) <= 227 * 1024

    def begin(self, ws: Any) -> None:
        """Nothing to launch: the signal kernel leaves the flags zero for the next step."""

    def fork(self, i: int, lw: Any, ws: Any) -> None:
        u64, f32 = ctypes.c_uint64, ctypes.c_float
        self.k.launch_fn(self.fn_w13, self.blocks, HELD_THREADS, self.smem, [
            u64(lw.w13.data_ptr()), u64(ws.xg.data_ptr()), u64(ws.ss_part.data_ptr()),
            ctypes.c_uint32(ws.ss_part.shape[1]), u64(ws.act.data_ptr()),
            u64(self.flags.data_ptr()), u64(int(self.spread_us * 1000)),
            u64(PACED_CHUNK if self.spread_us else CHUNK), f32(self.a.rms_eps),
            u64(self.err.data_ptr())], pdl=False)

    def gate_up(self, i: int, lw: Any, ws: Any, hand: Any) -> None:
        self.k.launch_fn(self.fn_sig, 1, 32, 0, [
            ctypes.c_uint64(self.flags.data_ptr()), ctypes.c_uint32(self.blocks),
            ctypes.c_uint64(self.err.data_ptr())], pdl=True)


def set_variant(r: Runner, v: Hold, kernel: HoldKernel, default_pf: Any,
                held: dict[str, HeldFFN] | None = None) -> None:
    r.hold = None  # type: ignore[attr-defined]
    r.ffn_hook = None
    if v.mib == HELD:
        assert held is not None
        if v.name not in held:
            held[v.name] = HeldFFN(r.args, kernel, v.spread_us, v.timemode, v.sleep_ns)
        r.ffn_hook = held[v.name]
        r.l2_prefetch = default_pf
    elif v.mib == 0:
        r.l2_prefetch = None
    elif v.mib < 0:
        r.l2_prefetch = default_pf  # the 0.5B has none: an A/A check
    else:
        r.l2_prefetch = (v.mib, kernel.sms, 0)
        r.hold = (kernel, v)  # type: ignore[attr-defined]
    r.drop_steps()


def one_token_kernels() -> list[str]:
    """Shared memory, registers and warps of each compiled Triton kernel (what a held block
    leaves room for), one line a distinct kind (``bench_verify.compiled_kernels``)."""
    from bench_verify import compiled_kernels

    seen: list[str] = []
    for k in compiled_kernels():
        line = f"{k['kernel']} warps={k['warps']} shared={k['shared']} regs={k['regs']}"
        if line not in seen:
            seen.append(line)
    return seen


def run(a: ModelArgs, positions: list[int], variants: list[Hold], rounds: int,
        kernel: HoldKernel) -> dict[str, Any]:
    from bench_verify import runner_for

    r, base = runner_for(a, max(positions) + 64)
    default_pf = base["l2_prefetch"]
    out: dict[str, Any] = {}
    held: dict[str, HeldFFN] = {}
    if not HeldFFN.fits(a, kernel.sms):
        skipped = [v.name for v in variants if v.mib == HELD]
        if skipped:
            log(f"n_embd {a.n_embd}: the held feed-forward does not fit an SM "
                f"({HeldFFN.smem_for(a, kernel.sms)} bytes a block); skipping {skipped}")
        variants = [v for v in variants if v.mib != HELD]
    for v in variants:  # the held feed-forward against the default step, same inputs
        if v.mib != HELD or v.timemode:
            continue
        check = {}
        for pos in positions:
            set_variant(r, Hold(-1), kernel, default_pf)
            want = r.step([100], pos).float().clone()
            set_variant(r, v, kernel, default_pf, held)
            got = r.step([100], pos).float().clone()
            for _ in range(3):  # replays too: the flags must come back to zero
                r.replay(1)
            again = r.step([100], pos).float().clone()
            torch.cuda.synchronize()
            check[str(pos)] = {
                "rel_err": float((got - want).norm() / want.norm()),
                "replays_rel_err": float((again - want).norm() / want.norm()),
                "err_flag": int(held[v.name].err.item()),
                "top1_same": bool(got.argmax() == want.argmax())}
        out[f"check_{v.name}"] = check
        log("check", v.name, json.dumps(check))
    for pos in positions:
        ratios: dict[str, list[float]] = {}
        best: dict[str, float] = {}
        for rnd in range(rounds):
            ms_off = 0.0
            for v in variants:
                set_variant(r, v, kernel, default_pf, held)
                r.step([100], pos)
                ms = time_ms(functools.partial(r.replay, 1))
                if v.mib == 0:
                    ms_off = ms
                best[v.name] = min(best.get(v.name, 1e9), ms)
                ratios.setdefault(v.name, []).append(ms / ms_off)
            log(f"round {rnd} @{pos}", {k: round(x, 4) for k, x in best.items()})
        per_layer = {k: (statistics.median(x) - 1) * best["off"] * 1000 / a.n_layer
                     for k, x in ratios.items()}
        out[str(pos)] = {"ms": best, "ratio_to_off": {k: statistics.median(x)
                                                      for k, x in ratios.items()},
                         "us_a_layer_over_off": per_layer}
        log("timing", a.n_embd, pos, json.dumps(out[str(pos)]))
    set_variant(r, Hold(0), kernel, default_pf)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench_hold_out"))
    p.add_argument("--models", default="1.5B,0.5B", help="comma-separated: 1.5B, 0.5B")
    p.add_argument("--positions", default="512,4096")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--variants", default="l2,8:0,16:0,24:0,8:12,16:12,24:12",
                   help="comma-separated: off, l2 (the default L2 prefetch), MIB:US[:SPREAD] "
                        "(MiB copied into shared memory at each layer's start and held US "
                        "microseconds, the copies paced over SPREAD), or "
                        "held[:SPREAD[:TIMEMODE[:SLEEP]]] (the held feed-forward)")
    p.add_argument("--carveout", type=int, default=None,
                   help="the hold kernel's preferred %% of L1 as shared memory (default: the "
                        "driver's choice, which sizes an SM's shared memory to the held bytes "
                        "and so can leave the chain's kernels no room beside them)")
    args = p.parse_args(argv)
    variants = parse_variants(args.variants)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise SystemExit(f"bench_hold: unknown models {bad}; known: {sorted(MODELS)}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_hold: needs a CUDA GPU (the hold kernel is CUDA)")
    Runner._prefetch = _prefetch_or_hold  # type: ignore[method-assign]
    kernel = HoldKernel(torch.device("cuda"), args.carveout)
    log("hold kernel:", kernel.how, "SMs", kernel.sms, "carveout", args.carveout)
    res: dict[str, Any] = {"variants": [v.name for v in variants]}
    for m in models:
        res[m] = run(MODELS[m], [int(x) for x in args.positions.split(",")], variants,
                     args.rounds, kernel)
    res["kernels"] = one_token_kernels()
    for line in res["kernels"]:
        log(line)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hold.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
