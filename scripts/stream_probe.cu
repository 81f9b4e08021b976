// Streaming microbenchmarks for sm_90 (H200), driven by scripts/bench_stream.py.
//
// Why: the persistent decode kernel (openjarvis/engine/torch/csrc/decode_step.cu) streams its
// weights with a TMA ring (cp.async.bulk into shared-memory stages, mbarrier handshakes) and
// reaches only ~77 % of the copy bandwidth when measured alone, while a Triton GEMV reaches
// ~4.2 TB/s; and its L2 round trips (grid barriers, activations written by other blocks) seem to
// cost ~1-1.3 us each while the stream runs. These kernels isolate the two effects:
//
//   tma_stream  the decode kernel's ring, PTX for PTX (same mbarrier parity protocol, same
//               evict-first bulk copies), with the ring depth, stage size, copy size and the
//               block-to-stage layout chosen by macros, and no arithmetic beyond a cheap fold;
//   ldg_stream  plain 16-byte loads, UNROLL in flight per lane, for comparison;
//   PROBE=1     in block 0, one more warp whose lane 0 chases pointers through a small array
//               in L2 (ld.global.cg) while the block streams: the L2 round trip another warp
//               sees under that stream. With nbytes == 0 it chases PROBE_HOPS hops unloaded.
//
// No includes, so NVRTC builds it as it builds decode_step.cu; the mbarrier and bulk-copy
// helpers are decode_step.cu's own, spliced in by bench_stream.py, so both run the same PTX.
//
// The probe array (u64), prepared by the host:
//   probe[0]  address of the first chain entry (each entry holds the address of the next, one
//             random cycle); probe[1] += ns spent chasing, probe[2] += hops, probe[3] = the last
//             address (keeps the chase live). The host zeroes [1] and [2] before timing.

typedef unsigned long long u64;
typedef unsigned int u32;

#ifndef NCW  // consumer warps of tma_stream (the producer is one more warp)
#define NCW 8
#endif
#ifndef NSTAGE  // ring depth
#define NSTAGE 4
#endif
#ifndef STAGE_BYTES  // bytes of one ring stage
#define STAGE_BYTES 24576
#endif
#ifndef COPY_BYTES  // bytes of one cp.async.bulk (STAGE_BYTES / COPY_BYTES copies per stage)
#define COPY_BYTES 3072
#endif
#ifndef READ  // 1: consumers read every stage from shared memory; 0: wait + arrive only
#define READ 1
#endif
#ifndef LAYOUT  // 0: one contiguous range per block; 1: interleaved (grid-stride)
#define LAYOUT 0
#endif
#ifndef PROBE  // 1: one more warp per block; block 0's chases pointers in L2
#define PROBE 0
#endif
#ifndef PROBE_HOPS  // most hops of one chase
#define PROBE_HOPS 4096
#endif
#ifndef NW  // warps of ldg_stream that load (the probe is one more)
#define NW 8
#endif
#ifndef UNROLL  // 16-byte loads in flight per lane in ldg_stream
#define UNROLL 4
#endif
#ifndef LDHINT  // ldg_stream's load: 0 ld.global.cs; 1 ld.global.nc, L1 no-allocate, L2 evict-first;
#define LDHINT 1  // 2 plain ld.global
#endif
#ifndef MINB  // blocks per SM the launch asks for (__launch_bounds__ register cap)
#define MINB 1
#endif
#ifndef WATCHDOG_NS  // an mbarrier wait longer than this traps instead of hanging the GPU
#define WATCHDOG_NS 2000000000ull
#endif

#define NCT (NCW * 32)
#define TMA_THREADS ((NCW + 1 + PROBE) * 32)
#define LDG_THREADS ((NW + PROBE) * 32)
#define NCOPY (STAGE_BYTES / COPY_BYTES)

static_assert(STAGE_BYTES % COPY_BYTES == 0, "a stage is a whole number of copies");
static_assert(COPY_BYTES % 16 == 0, "cp.async.bulk moves multiples of 16 bytes");
static_assert(STAGE_BYTES % (16 * NCW) == 0, "every consumer warp reads the same share");
static_assert(STAGE_BYTES < (1 << 20), "an mbarrier counts fewer than 2^20 transaction bytes");

// ---- helpers (decode_step.cu's own, spliced in by bench_stream.py) ---------------------------

// bench_stream.py puts decode_step.cu's <ptx-helpers> block (smem_u32, mbar_init,
// mbar_expect_tx, mbar_arrive, bulk_load, mbar_try_wait, the ring's smem, ring(),
// full_bar(), empty_bar(), ring_init()) in place of the next line.
// @PTX_HELPERS@

// <probe-helpers> (scripts/bench_chain.py builds chain_probe.cu with this block too: the
// timer, the watchdog wait and the evict-first policy, written once for both probes)
__device__ __forceinline__ u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// decode_step.cu's wait, plus a watchdog checked every 4096 failed polls: a protocol error
// traps (the launch fails) instead of spinning until the device run's time limit.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
  u32 polls = 0;
  u64 t0 = 0;
  bool done;
  do {
    done = mbar_try_wait(bar, parity);
    if (!done && (++polls & 4095u) == 0) {
      const u64 t = globaltimer();
      if (t0 == 0) t0 = t;
      else if (t - t0 > WATCHDOG_NS) asm volatile("trap;");
    }
  } while (!done);
}

__device__ __forceinline__ u64 evict_first_policy() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// </probe-helpers>

__device__ __forceinline__ void red_shared_add(u32* p, u32 v) {
  asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(smem_u32(p)), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_volatile_shared(const u32* p) {
  u32 v;
  asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(v) : "r"(smem_u32(p)) : "memory");
  return v;
}

// The units (stages, or 16-byte words) of block blockIdx.x out of n: unit i is first + i * step.
__device__ __forceinline__ void my_units(u64 n, u64* first, u64* count, u64* step) {
  const u64 b = blockIdx.x, g = gridDim.x;
#if LAYOUT == 0
  *first = b * n / g;
  *count = (b + 1) * n / g - *first;
  *step = 1;
#else
  *first = b;
  *count = n > b ? (n - b + g - 1) / g : 0;
  *step = g;
#endif
}

// ---- the probe -------------------------------------------------------------------------------

// Lane 0 of block 0's probe warp: dependent ld.global.cg hops through the host's random cycle
// until ``*done`` reaches ``ndone`` (the block's streaming warps have finished; only when
// ``stop_on_done``) or PROBE_HOPS hops. The loop's branch tests the loaded address, so when it
// exits the last hop has landed and the second timer read covers every hop.
__device__ void probe_chase(u64* probe, const u32* done, u32 ndone, bool stop_on_done) {
  u64 p;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(p) : "l"(probe) : "memory");
  if (p == 0) return;  // (a branch on the start address: the timer starts once it is here)
  u32 hops = 0;
  const u64 t0 = globaltimer();
  for (;;) {
    u64 nxt;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(nxt) : "l"(p) : "memory");
    ++hops;
    const bool stop = stop_on_done && ld_volatile_shared(done) >= ndone;
    p = nxt;
    if (nxt == 0 || hops >= PROBE_HOPS || stop) break;
  }
  const u64 t1 = globaltimer();
  probe[1] += t1 - t0;  // one thread, launches in stream order: no atomics needed
  probe[2] += hops;
  probe[3] = p;
}

// ---- the TMA ring ------------------------------------------------------------------------------

// Shared memory: ring [NSTAGE][STAGE_BYTES] | full mbarriers [NSTAGE] | empty [NSTAGE] | done
// (the host asks for NSTAGE * (STAGE_BYTES + 16) + 16 bytes); smem, ring(), full_bar() and
// empty_bar() come with decode_step.cu's helpers.
__device__ __forceinline__ u32* done_ctr() { return (u32*)(smem + RING_BYTES + 16 * NSTAGE); }

// Warps 0..NCW-1 consume, warp NCW produces, warp NCW+1 (PROBE=1) probes in block 0. The
// buffer is cut into nbytes / STAGE_BYTES stages (a tail shorter than a stage is not read).
extern "C" __global__ void __launch_bounds__(TMA_THREADS, MINB)
    tma_stream(const unsigned char* buf, u64 nbytes, float* out, u64* probe) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    ring_init();
    *done_ctr() = 0;
  }
  __syncthreads();
  u64 first, count, step;
  my_units(nbytes / STAGE_BYTES, &first, &count, &step);

  if (warp == NCW) {  // the producer: lane 0 arms the stage, lanes issue the copies in parallel
    const u64 policy = evict_first_policy();
    int slot = 0;
    u32 phase = 0;
    for (u64 i = 0; i < count; ++i) {
      u64* bar = full_bar(slot);
      if (lane == 0) {
        mbar_wait(empty_bar(slot), phase ^ 1u);
        mbar_expect_tx(bar, STAGE_BYTES);
      }
      __syncwarp();
      const unsigned char* src = buf + (first + i * step) * STAGE_BYTES;
      unsigned char* dst = ring(slot);
#pragma unroll
      for (int c = lane; c < NCOPY; c += 32)
        bulk_load(dst + c * COPY_BYTES, src + (u64)c * COPY_BYTES, COPY_BYTES, bar, policy);
      if (++slot == NSTAGE) {
        slot = 0;
        phase ^= 1u;
      }
    }
    return;
  }
  if (warp > NCW) {  // the probe warp (PROBE=1)
    if (blockIdx.x == 0 && lane == 0) probe_chase(probe, done_ctr(), NCW, nbytes != 0);
    return;
  }

  // consumers: wait full, fold the warp's share of the stage into a register, free the stage
  u32 acc = 0;
  int slot = 0;
  u32 phase = 0;
  for (u64 i = 0; i < count; ++i) {
    mbar_wait(full_bar(slot), phase);
#if READ
    constexpr int PER_WARP = STAGE_BYTES / 16 / NCW;  // 16-byte words of one warp's share
    const uint4* s = (const uint4*)ring(slot) + warp * PER_WARP;
#pragma unroll
    for (int k = lane; k < PER_WARP; k += 32) {
      const uint4 v = s[k];
      acc += v.x ^ v.y ^ v.z ^ v.w;
    }
#endif
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar(slot));  // NCW arrivals free the stage
    if (++slot == NSTAGE) {
      slot = 0;
      phase ^= 1u;
    }
  }
  if (lane == 0) red_shared_add(done_ctr(), 1);
  out[(u64)blockIdx.x * NCT + threadIdx.x] = __uint_as_float(acc);
}

// ---- plain loads -------------------------------------------------------------------------------

__device__ __forceinline__ uint4 ld_stream(const uint4* p, u64 policy) {
  uint4 v;
#if LDHINT == 0
  asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
#elif LDHINT == 1
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
#else
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
#endif
  return v;
}

__shared__ u32 ldg_done;

// Warps 0..NW-1 load, warp NW (PROBE=1) probes in block 0. Each lane issues UNROLL loads, then
// folds them: UNROLL x 16 bytes in flight per lane.
extern "C" __global__ void __launch_bounds__(LDG_THREADS, MINB)
    ldg_stream(const uint4* buf, u64 n16, float* out, u64* probe) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) ldg_done = 0;
  __syncthreads();
  if (warp >= NW) {
    if (blockIdx.x == 0 && lane == 0) probe_chase(probe, &ldg_done, NW, n16 != 0);
    return;
  }
  const u64 policy = evict_first_policy();
  constexpr u64 T = NW * 32;
#if LAYOUT == 0
  const u64 g = gridDim.x, b = blockIdx.x;
  u64 i = b * n16 / g + threadIdx.x;
  const u64 end = (b + 1) * n16 / g;
  const u64 stride = T;
#else
  u64 i = (u64)blockIdx.x * T + threadIdx.x;
  const u64 end = n16;
  const u64 stride = (u64)gridDim.x * T;
#endif
  u32 acc = 0;
  for (; i + (UNROLL - 1) * stride < end; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) v[k] = ld_stream(buf + i + k * stride, policy);
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) acc += v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < end; i += stride) {
    const uint4 v = ld_stream(buf + i, policy);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  __syncwarp();
  if (lane == 0) red_shared_add(&ldg_done, 1);
  out[(u64)blockIdx.x * T + threadIdx.x] = __uint_as_float(acc);
}
