// The skeleton of a persistent decode step on sm_90 (H200), driven by scripts/bench_chain.py.
//
// Why: every route to issue 7's one-token goals that is left runs through one persistent
// launch (docs/gpu-notes.md, sessions 4-5, 15 and 21), and the one we built
// (openjarvis/engine/torch/csrc/decode_step.cu) reached only 0.97x the Triton step. Its trace
// blamed two things at once: the hand-offs between phases (grid barriers, the attention) and
// its consumers' own work per unit (run 44: with no weight bytes at all it still took 0.79 ms
// for the 1.5B). This kernel keeps only what any such design must do, so that the question
// "can a layer's chain of hand-offs run under a weight stream at full rate?" gets an answer
// apart from how decode_step.cu happens to do its units:
//
//   - one block an SM; a producer warp streams the block's share of every phase's weights, in
//     step order, through decode_step.cu's own TMA ring (its PTX, spliced in by the host);
//   - PF > 0: a prefetch warp asks L2 (cp.async.bulk.prefetch.L2) for each stage once the
//     producer is fewer than PF stages behind it, so DRAM keeps streaming while the ring is
//     full and the consumers wait (the ring's 168 KB cover ~5 µs of an SM's share);
//   - NCW consumer warps per phase: wait for the phase's input and load it from L2 into shared
//     memory, walk `trips` more dependent L2 round trips (the attention's
//     rounds, in the phase that models it), multiply each stage's bf16 words by the input
//     (ARITH=1: 8 fused multiply-adds a 16-byte word, the input read from shared memory, as a
//     GEMV's consumer does), reduce, store the block's share of the phase's output, and add
//     themselves to the phase's counter with release semantics;
//   - TOK > 1 (a verify step's skeleton): every vector is TOK tokens', the input kept as bf16
//     in shared memory, and each stage multiplied through matrix instructions (ARITH=2:
//     ldmatrix and mma.sync m16n8k16, as a verify product's consumer would; ARITH=3, bare
//     streams only: 4-bit weights made bf16 in registers for those products);
//   - CL > 1: blocks in clusters of CL (the host launches them so) sum their split-K partials
//     in shared memory across the cluster before adding them with atomics, each block its
//     CL-th of the vector: CL times fewer atomics for an exchange through distributed shared
//     memory.
//
// Two hand-offs (HOPS):
//   1  a counter a hand-off: each block stores its outputs, meets its consumers at a block
//      barrier, and thread 0 adds 1 with release semantics (which waits for the block's stores
//      to be acknowledged); the next phase's thread 0 polls it with acquire until every block
//      has added, then the block loads its input. decode_step.cu's grid barrier.
//   2  flags in the data (NCCL's "LL" protocol): each output is one 8-byte store of the value
//      and the hand-off's tag, and a reader polls each element of its input until the tag is
//      the one it wants. No fence, no counter: an aligned 8-byte access is single-copy atomic,
//      so a reader that sees the tag sees the value stored with it. The tag is the launch's
//      base (a kernel argument the host advances) plus the hand-off's index, so no element of
//      an earlier launch or hand-off matches.
//
// Nothing here is a model: the arithmetic is not the product of any matrix. What it times is the
// stream, the hand-offs and the consumers' reads of shared memory, at the model's byte counts.
//
// The plan (u32, global memory, prepared by the host):
//   plan[0] layers, plan[1] phases a layer, then four words a phase
//   (stages of the whole grid, input floats, output floats a block or, with the top bit set,
//   the outputs every block adds a partial of, extra round trips), phases
//   of one layer first, then the one phase after the last layer (the output projection). A
//   phase's stages are dealt to the blocks in contiguous shares that differ by one at most.
// Stalls (STALLS 1): after the trace, four u64 a block: the SM cycles its producer's lane 0
// spent waiting for a free slot (the ring full: nothing more of this block's share can be asked
// of DRAM), the cycles its consumer thread 0 spent waiting for a stage to land (the consumers
// ahead of the stream), and the cycles and ns from the block's start to its consumers' end. A
// wait is timed only when the barrier is not already complete, with the SM's cycle counter, by
// every consumer thread alike (thread 0's count is kept). The first form timed thread 0 alone,
// with %globaltimer (run 260) and then the cycle counter (run 261): lane 0 of warp 0 then took
// another path than its 31 neighbours spinning on the barrier, and that divergence alone slowed
// the bare stream 0.71 -> 1.11 ms.
// Counters: ctr[h] for hand-off h = layer * phases + phase (the last phase too), zeroed by the
// host before a batch of launches; launch ``epoch`` (1, 2, ...) of the batch waits for each to
// reach epoch x blocks, so launches run back to back with no reset between them (HOPS 1).
// Activations: two vectors of XMAX float32 values (HOPS 2: of XMAX 8-byte elements, the value
// in the low word and the tag in the high). Trace (u64),
// three stamps for each block and hand-off (the batch's last launch): when the block had stored
// its outputs, when it had its next phase's input in shared memory and had walked the phase's
// extra round trips, and (HOPS 1) when its thread 0 saw every block's count (HOPS 0: all three
// the first; HOPS 2: the last the second).

typedef unsigned long long u64;
typedef unsigned int u32;

#ifndef NCW  // consumer warps (the producer is one more)
#define NCW 8
#endif
#ifndef NSTAGE  // ring depth
#define NSTAGE 7
#endif
#ifndef STAGE_BYTES
#define STAGE_BYTES 24576
#endif
#ifndef COPY_BYTES
#define COPY_BYTES 3072
#endif
#ifndef HOPS  // how a phase gets its input (below); 0: it never waits for it
#define HOPS 1
#endif
#ifndef BARE  // 1 (with HOPS 0): no input loads, round trips or outputs: the stream alone
#define BARE 0
#endif
#ifndef SINK  // 1 (with BARE): the arithmetic's sums kept live (ptxas removes what nothing reads,
#define SINK 0  // asm volatile or not: without it a bare stream does no arithmetic at all)
#endif
#ifndef INPUT  // 0 (with HOPS 0): no input loads or round trips (outputs still stored)
#define INPUT 1
#endif
#ifndef OUTPUT  // 0 (with HOPS 0): no outputs (inputs still loaded)
#define OUTPUT 1
#endif
#ifndef INLOAD  // 1: a thread's input loads all issued before any is stored; 0: load, store, load...;
#define INLOAD 1  // 2: as 1, 16 bytes a load (HOPS 0 and 1)
#endif
#ifndef PF  // > 0: one more warp asks L2 for the stages up to PF ahead of the producer's
#define PF 0
#endif
#ifndef ARITH  // 1: 8 FMAs a 16-byte word against the input in shared memory; 0: read only;
#define ARITH 1  // 2: TOK > 1, matrix instructions; 3: 4-bit weights made bf16 for them (below);
#endif           // 4: as 1 with each thread's 8 inputs held in registers, two accumulators
#ifndef TOK  // tokens a step: 1 decodes, k + 1 verifies k drafted tokens
#define TOK 1
#endif
#ifndef XMAX  // the longest input (all TOK tokens' vectors), floats
#define XMAX 8960
#endif
#ifndef CL  // > 1: clusters of CL blocks sum their split-K partials in shared memory first
#define CL 1
#endif
#ifndef PMAX  // CL > 1: the longest vector added (a 1.5B hidden state for each token), floats
#define PMAX (TOK * 1536)
#endif
#ifndef SPIN_NS  // > 0: at each phase after the first the consumers wait this long, doing nothing
#define SPIN_NS 0  // (a hand-off's time with none of its traffic: can the ring cover it?)
#endif
#ifndef STALLS  // 1: each block records where its producer and its consumers waited (below)
#define STALLS 0
#endif
#ifndef WATCHDOG_NS  // a wait longer than this traps instead of hanging the GPU
#define WATCHDOG_NS 2000000000ull
#endif

#define NCT (NCW * 32)
#define THREADS ((NCW + 1 + (PF > 0)) * 32)
#define NCOPY (STAGE_BYTES / COPY_BYTES)
#define PER_WARP (STAGE_BYTES / 16 / NCW)  // 16-byte words of one warp's share of a stage

static_assert(STAGE_BYTES % COPY_BYTES == 0, "a stage is a whole number of copies");
static_assert(STAGE_BYTES % (16 * NCW) == 0, "every consumer warp reads the same share");
static_assert(XMAX >= 1024 && XMAX % 4 == 0, "the arithmetic reads the first 1024 inputs");
static_assert(HOPS == 0 || (INPUT && OUTPUT && !BARE),
              "a hand-off needs every block's outputs and every reader's input");
static_assert((TOK == 1 ? ARITH != 2 : ARITH == 2 || ARITH == 3) && TOK >= 1 && TOK <= 16,
              "bf16 matrix instructions serve 2-16 tokens, FMAs one");
// ARITH 3: the stages as super-tiles of 16 rows x 256 k of 4-bit weights, repacked from Q4_K
// blocks (bench_chain.py's Q4_SUPER): 2,048 bytes of nibbles (a tile of 16 x 16 weights in 128,
// a lane's u32 the 8 weights of its A fragment), then a bf16 (scale, offset) pair for each row
// and 32-k sub-block (512 bytes; the file's 6-bit scales and mins with d and dmin folded in at
// load: 0.625 bytes a weight against the file's 0.5625). Only the stream is priced (BARE).
#define Q4_SUPER 2560
static_assert(ARITH != 4 || (TOK == 1 && PER_WARP % 64 == 0), "ARITH 4: one token, word pairs");
static_assert(ARITH != 3 || (BARE && STAGE_BYTES % Q4_SUPER == 0),
              "4-bit super-tiles: whole ones a stage, the consumers' throughput alone");
static_assert(TOK == 1 || (HOPS != 2 && INLOAD == 2), "tokens load 16 bytes at a time, counted");
static_assert(CL == 1 || (HOPS != 2 && CL <= 8 && PMAX % 4 == 0), "clusters add with counters");

// The input as it sits in shared memory: one token's floats (TOK 1); for TOK > 1, bf16 in
// chunks of 8 along K, each chunk's TOK tokens together ([k / 8][TOK][8]), so that one
// ldmatrix row is one token's 16 bytes and the 8 rows of a matrix are contiguous.
#define XS_FLOATS (TOK == 1 ? XMAX : XMAX / 2)

// @PTX_HELPERS@

// bench_chain.py puts stream_probe.cu's <probe-helpers> block (globaltimer, mbar_wait with a
// watchdog, evict_first_policy) in place of the next line.
// @PROBE_HELPERS@

__device__ __forceinline__ void csync() { asm volatile("bar.sync 1, %0;" ::"n"(NCT) : "memory"); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float ld_cg(const u32* p) {
  u32 v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return __uint_as_float(v);
}

__device__ __forceinline__ u64 ld_relaxed(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_relaxed(u64* p, u64 v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void watchdog(u32* polls, u64* t0) {
  if ((++*polls & 1023u) == 0) {
    const u64 t = globaltimer();
    if (*t0 == 0) *t0 = t;
    else if (t - *t0 > WATCHDOG_NS) asm volatile("trap;");
  }
}

// Clusters (CL > 1): after the input and the reduction's floats, the block's partial of the
// vector it adds, then two mbarriers: every block's partial written (CL arrivals, one from
// each block of the cluster), and every block done reading them (CL arrivals). Not the
// cluster barrier: it waits for every thread that has not exited, the producer warp too,
// which runs ahead through the ring and would never arrive in time.
#if CL > 1
__device__ __forceinline__ float* part() {
  return (float*)(smem + RING_BYTES + 16 * NSTAGE + ((XS_FLOATS + NCW + 1 + 3) / 4) * 16);
}
__device__ __forceinline__ u64* cbar(int i) { return (u64*)(part() + PMAX) + i; }
__device__ __forceinline__ u32 cta_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of ``p`` (this block's shared memory) in block ``rank``.
__device__ __forceinline__ u32 peer(const void* p, u32 rank) {
  u32 a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_u32(p)), "r"(rank));
  return a;
}
__device__ __forceinline__ void arrive_everywhere(u64* bar) {  // one arrival on each block's
  for (u32 c = 0; c < CL; ++c)
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(peer(bar, c))
                 : "memory");
}
__device__ __forceinline__ void cluster_wait(u64* bar, u32 parity) {
  u32 polls = 0;
  u64 t0 = 0;
  for (;;) {
    u32 done;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    if (done) return;
    watchdog(&polls, &t0);
  }
}
#endif

// mbar_wait, adding the SM cycles it blocked to ``*cycles`` where STALLS asks (nothing when the
// barrier was already complete). The check is test_wait, which never suspends: try_wait may
// suspend the thread until the phase completes, so a wait it ends reads as no wait (run 262's
// first form: no consumer starved at all).
__device__ __forceinline__ bool mbar_test_wait(u64* bar, u32 parity) {  // never suspends
  u32 done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void timed_wait(u64* bar, u32 parity, u64* cycles) {
  if (!STALLS || mbar_test_wait(bar, parity)) {
    if (!STALLS) mbar_wait(bar, parity);
    return;
  }
  const u64 t0 = clock64();
  mbar_wait(bar, parity);
  *cycles += clock64() - t0;
}

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Shared memory after the ring and its barriers: the input vector, then one float a warp.
__device__ __forceinline__ float* xs() { return (float*)(smem + RING_BYTES + 16 * NSTAGE); }
__device__ __forceinline__ float* red() { return xs() + XS_FLOATS; }
__device__ __forceinline__ unsigned short* xs16() { return (unsigned short*)xs(); }  // TOK > 1

// ``acc`` plus the 8 bf16 weights of one 16-byte word times 8 inputs (a, then b): one FMA a
// weight, each bf16 made a float by its bits (the low half shifted up, the high half masked).
__device__ __forceinline__ float dot8(uint4 q, float4 a, float4 b, float acc) {
  acc = fmaf(__uint_as_float(q.x << 16), a.x, acc);
  acc = fmaf(__uint_as_float(q.x & 0xffff0000u), a.y, acc);
  acc = fmaf(__uint_as_float(q.y << 16), a.z, acc);
  acc = fmaf(__uint_as_float(q.y & 0xffff0000u), a.w, acc);
  acc = fmaf(__uint_as_float(q.z << 16), b.x, acc);
  acc = fmaf(__uint_as_float(q.z & 0xffff0000u), b.y, acc);
  acc = fmaf(__uint_as_float(q.w << 16), b.z, acc);
  return fmaf(__uint_as_float(q.w & 0xffff0000u), b.w, acc);
}

// Two floats' bits as one bf16x2 word, the first in the low half (round to nearest even).
__device__ __forceinline__ u32 bf16x2(u32 lo, u32 hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__uint_as_float(hi)), "f"(__uint_as_float(lo)));
  return r;
}
__device__ __forceinline__ u32* produced() { return (u32*)(red() + NCW); }  // stages issued

struct Phase {
  u32 stages, xlen, outb, trips;
};

// This block's share of ``n`` stages.
__device__ __forceinline__ u32 share(u32 n) {
  return (u32)(((u64)(blockIdx.x + 1) * n) / gridDim.x - ((u64)blockIdx.x * n) / gridDim.x);
}

__device__ __forceinline__ Phase phase_of(const u32* plan, u32 h, u32 nph, u32 layers) {
  const u32 p = h < layers * nph ? h % nph : nph;
  const u32* q = plan + 2 + 4 * p;
  return Phase{share(q[0]), q[1], q[2], q[3]};
}

// A phase's input: every block's share of the phase before, ping-ponged between two vectors.
__device__ __forceinline__ u64* act_vec(u64* act, u32 h) { return act + (h & 1u) * XMAX; }

// One tile of 16 x 16 weights (A, in registers) times 16 K of the TOK inputs: tokens 0-7, and
// 8-15 where there are more than 8 (token rows past TOK read again from the first). ``tile``
// picks the inputs' K chunk pair, wrapped by ``cmask`` (a power of two less two: even chunk
// indices, so that the address costs what a kernel walking K pays, a mask and a multiply-add,
// not a division; the first form divided twice a tile and walked 64-bit generic pointers, and
// could not keep up with the stream, run 258); ``boff`` is the lane's row of the ldmatrix
// (``b_offset``, a shared-memory address: 32-bit arithmetic, as every address of the
// consumers' loops).
__device__ __forceinline__ void mma_tokens(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 tile,
                                           u32 cmask, u32 boff) {
  u32 b0, b1, b2, b3;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
               : "r"(boff + ((tile * 2) & cmask) * (TOK * 16)));
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  if (TOK > 8)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b2), "r"(b3));
}

// A lane's row of the inputs' ldmatrix in the chunked layout, in bf16 from a chunk pair's start:
// matrices 0 and 2 (lanes 0-7, 16-23) the first chunk, 1 and 3 the second; 2 and 3 tokens 8-15.
__device__ __forceinline__ u32 b_offset(int lane) {
  return smem_u32(xs16()) + (((lane >> 3) & 1) * TOK + ((lane >> 4) * 8 + (lane & 7)) % TOK) * 16;
}

#define MAXE ((XMAX + NCT - 1) / NCT)  // input elements a consumer thread loads, at most
#define NV4 ((MAXE + 3) / 4)  // of them, 16-byte loads (INLOAD 2)
#define GROUP4 (NV4 < 20 ? NV4 : 20)  // 16-byte loads in flight a thread at once
#define REDUCE_BIT 0x80000000u  // a phase's output word: every block adds to all its outputs

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    chain_step(const unsigned char* buf, const u32* plan, u64* act, u32* ctr, u64* trace, u32 tag,
               u32 epoch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const u32 layers = plan[0], nph = plan[1], nhop = layers * nph + 1;
  [[maybe_unused]] u64* stall = trace + (u64)gridDim.x * nhop * 3 + 4 * blockIdx.x;
  [[maybe_unused]] u64 waited = 0;  // STALLS: this thread's cycles blocked on the ring
  [[maybe_unused]] const u64 c0 = STALLS ? clock64() : 0, g0 = STALLS ? globaltimer() : 0;
  u64 per_block = 0, before = 0;  // stages of this block over the step, and of those before it
  for (u32 p = 0; p <= nph; ++p) {
    const u64 n = plan[2 + 4 * p], times = p < nph ? layers : 1;
    per_block += share((u32)n) * times;
    before += ((u64)blockIdx.x * n) / gridDim.x * times;
  }
  if (threadIdx.x == 0) ring_init();
#if CL > 1
  if (threadIdx.x == 0) {
    mbar_init(cbar(0), CL);
    mbar_init(cbar(1), CL);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#endif
  for (int i = threadIdx.x; i < XS_FLOATS + NCW + 1; i += THREADS) xs()[i] = 0.f;
  __syncthreads();
#if CL > 1  // every block's barriers initialized before any block arrives on them
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
#endif

  if (warp == NCW) {  // the producer: stage i of the block's contiguous range, in step order
    const u64 policy = evict_first_policy();
    const unsigned char* base = buf + before * STAGE_BYTES;
    int slot = 0;
    u32 parity = 0;
    for (u64 i = 0; i < per_block; ++i) {
      u64* bar = full_bar(slot);
      if (lane == 0) {
        timed_wait(empty_bar(slot), parity ^ 1u, &waited);
        mbar_expect_tx(bar, STAGE_BYTES);
      }
      __syncwarp();
      const unsigned char* src = base + i * STAGE_BYTES;
#pragma unroll
      for (int c = lane; c < NCOPY; c += 32)
        bulk_load(ring(slot) + c * COPY_BYTES, src + (u64)c * COPY_BYTES, COPY_BYTES, bar, policy);
      if (PF && lane == 0)
        asm volatile("st.volatile.shared.u32 [%0], %1;" ::"r"(smem_u32(produced())), "r"((u32)(i + 1))
                     : "memory");
      if (++slot == NSTAGE) {
        slot = 0;
        parity ^= 1u;
      }
    }
    if (STALLS && lane == 0) stall[0] = waited;
    return;
  }
  if (warp > NCW) {  // the prefetch warp (PF > 0): lane 0 stays at most PF stages ahead
    const unsigned char* base = buf + before * STAGE_BYTES;
    if (lane == 0)
      for (u64 i = 0; i < per_block; ++i) {
        u32 done;
        do {
          asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(done) : "r"(smem_u32(produced()))
                       : "memory");
        } while (done + PF <= i);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + i * STAGE_BYTES),
                     "r"((u32)STAGE_BYTES)
                     : "memory");
      }
    return;
  }

  int slot = 0;
  u32 parity = 0;
  [[maybe_unused]] u32 nred = 0;  // reduce phases done (CL > 1: the parity of the cluster's mbarriers)
  u64* tr = trace + (u64)blockIdx.x * nhop * 3;
  for (u32 h = 0; h < nhop; ++h) {
    const Phase ph = phase_of(plan, h, nph, layers);
    if (SPIN_NS && h > 0) {
      if (threadIdx.x == 0) {
        const u64 t0 = globaltimer();
        while (globaltimer() - t0 < SPIN_NS) {
        }
      }
      csync();
    }
    // the input: every block's share of the phase before
    if (h > 0 && !BARE && INPUT) {
      const u64* in = act_vec(act, h - 1);
      const u32* in32 = (const u32*)in;  // HOPS 0 and 1: 4-byte values, packed
      // the input, and every element the phase before stored beyond it: with flags in the
      // data, a block whose outputs no one read could fall two hand-offs behind and find its
      // input overwritten by the next-but-one phase's (the vectors are ping-ponged)
#if HOPS == 2
      const u32 n = min((u32)XMAX, max(ph.xlen, gridDim.x * phase_of(plan, h - 1, nph, layers).outb));
#else
      const u32 n = ph.xlen;
#endif
#if HOPS == 1
      if (threadIdx.x == 0) {
        u32 polls = 0;
        u64 t0 = 0;
        while (ld_acquire(ctr + h - 1) < gridDim.x * epoch) watchdog(&polls, &t0);
        tr[3 * (h - 1) + 2] = globaltimer();
      }
      csync();
#endif
#if HOPS == 2
      const u32 want = tag + h - 1;
      u64 v[MAXE];
#pragma unroll
      for (int e = 0; e < MAXE; ++e) {  // every element's first load in flight at once
        const u32 i = threadIdx.x + e * NCT;
        if (i < n) v[e] = ld_relaxed(in + i);
      }
#pragma unroll
      for (int e = 0; e < MAXE; ++e) {
        const u32 i = threadIdx.x + e * NCT;
        if (i < n) {
          u32 polls = 0;
          u64 t0 = 0;
          while ((u32)(v[e] >> 32) != want) {
            watchdog(&polls, &t0);
            v[e] = ld_relaxed(in + i);
          }
          xs()[i] = __uint_as_float((u32)v[e]);
        }
      }
#elif INLOAD == 0
      for (u32 i = threadIdx.x; i < n; i += NCT) xs()[i] = ld_cg(in32 + i);
#elif INLOAD == 2
      // 16 bytes a load, all issued before any is stored (in groups of at most 20 a thread:
      // only a 6-hand-off verify step's 8,960 x 9 inputs take more than one)
      for (int g = 0; g < NV4; g += GROUP4) {
      uint4 v[GROUP4];
#pragma unroll
      for (int e = 0; e < GROUP4; ++e) {
        const u32 i = 4 * (threadIdx.x + (g + e) * NCT);
        if (i < n) v[e] = __ldcg((const uint4*)(in32 + i));
      }
#pragma unroll
      for (int e = 0; e < GROUP4; ++e) {
        const u32 i = 4 * (threadIdx.x + (g + e) * NCT);
#if TOK == 1
        if (i < n) *(uint4*)(xs() + i) = v[e];
#else
        if (i < n) {  // token t's k .. k + 3 as bf16, at their place in the chunked layout
          const u32 len = n / TOK, t = i / len, k = i % len;
          *(uint2*)(xs16() + ((k >> 3) * TOK + t) * 8 + (k & 7)) =
              make_uint2(bf16x2(v[e].x, v[e].y), bf16x2(v[e].z, v[e].w));
        }
#endif
      }
      }
#else
      u32 v[MAXE];  // every load issued before any is stored: one round trip, not MAXE
#pragma unroll
      for (int e = 0; e < MAXE; ++e) {
        const u32 i = threadIdx.x + e * NCT;
        if (i < n) v[e] = __ldcg(in32 + i);
      }
#pragma unroll
      for (int e = 0; e < MAXE; ++e) {
        const u32 i = threadIdx.x + e * NCT;
        if (i < n) xs()[i] = __uint_as_float(v[e]);
      }
#endif
      float x = 0.f;
      for (u32 t = 0; t < ph.trips; ++t)  // dependent round trips: each address from the last
        x = ld_cg(in32 + (HOPS == 2 ? 2u : 1u) *  // (HOPS 2: the value word of an element)
                             ((threadIdx.x + (u32)(x != 0.f) * 7u + t * 97u) % ph.xlen));
      if (ph.trips && x == 12345.f) xs()[0] = x;  // keeps the chain live
      csync();
      if (threadIdx.x == 0) {
        tr[3 * (h - 1) + 1] = HOPS ? globaltimer() : tr[3 * (h - 1)];
        if (HOPS != 1) tr[3 * (h - 1) + 2] = tr[3 * (h - 1) + 1];
      }
    }
    // the phase's stages against the input
    float acc = 0.f;
#if ARITH == 4
    // A one-token consumer that keeps its share of the input in registers (as a product whose
    // threads own a K slice across its rows does), not read from shared memory for every
    // weight word as ARITH 1 does (72 KB of shared-memory reads a 24 KB stage: its consumers
    // were not starved ~90 % of the stream, run 264), and two accumulators instead of one chain.
    float acc2 = 0.f;
    const float4 xa = *(const float4*)(xs() + ((threadIdx.x * 8) & 1023)),
                 xb = *(const float4*)(xs() + ((threadIdx.x * 8 + 4) & 1023));
#endif
#if ARITH == 2 || ARITH == 3
    float c[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    // 8-wide K chunks of one token's input (at least a pair), read below the largest power
    // of two among them
    const u32 chunks = max(2u, ph.xlen / TOK / 8);
    const u32 cmask = (1u << (31 - __clz(chunks))) - 2u;  // even chunk indices below it
    const u32 boff = b_offset(lane);
#endif
    for (u32 s = 0; s < ph.stages; ++s) {
      timed_wait(full_bar(slot), parity, &waited);  // every consumer thread the same path
#if ARITH == 2
      // The stage as tiles of [16 rows, 16 k] bf16 (512 bytes: four 8 x 8 matrices), the
      // warps taking every NCW-th; per tile one ldmatrix of the weights, one of 16 K of the
      // TOK inputs (token rows past TOK read again from the first), and m16n8k16 products
      // (tokens 0-7, and 8-15 where TOK > 8). As a verify product's consumer does, not a product
      // of any matrix.
      const u32 stage = smem_u32(ring(slot)) + lane * 16;
      for (int j = warp; j < STAGE_BYTES / 512; j += NCW) {
        u32 a0, a1, a2, a3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                     : "r"(stage + j * 512));
        mma_tokens(c, a0, a1, a2, a3, s * (STAGE_BYTES / 512) + j, cmask, boff);
      }
#elif ARITH == 3
      // Per super-tile and tile: the lane's 8 nibbles made bf16 by their bits (0x4300 | q is
      // the bf16 of 128 + q), scaled with one bf16x2 FMA a pair (the offset holds -128 x
      // scale less the min), then the products; each row's pair read once a sub-block.
      for (int j = warp; j < STAGE_BYTES / Q4_SUPER; j += NCW) {
        const u32 st = smem_u32(ring(slot)) + j * Q4_SUPER;
        u32 sg = 0, og = 0, s8 = 0, o8 = 0;
#pragma unroll 4
        for (int kt = 0; kt < 16; ++kt) {
          if ((kt & 1) == 0) {  // rows g and g + 8: (scale, offset) each
            uint2 so;
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(so.x), "=r"(so.y)
                         : "r"(st + 2048 + (kt >> 1) * 64 + (lane >> 2) * 8));
            asm("prmt.b32 %0, %1, %1, 0x1010;" : "=r"(sg) : "r"(so.x));
            asm("prmt.b32 %0, %1, %1, 0x3232;" : "=r"(og) : "r"(so.x));
            asm("prmt.b32 %0, %1, %1, 0x1010;" : "=r"(s8) : "r"(so.y));
            asm("prmt.b32 %0, %1, %1, 0x3232;" : "=r"(o8) : "r"(so.y));
          }
          u32 q;
          asm volatile("ld.shared.u32 %0, [%1];" : "=r"(q) : "r"(st + kt * 128 + lane * 4));
          const u32 x0 = (q & 0x000f000fu) | 0x43004300u, x1 = ((q >> 4) & 0x000f000fu) | 0x43004300u;
          const u32 x2 = ((q >> 8) & 0x000f000fu) | 0x43004300u, x3 = ((q >> 12) & 0x000f000fu) | 0x43004300u;
          u32 a0, a1, a2, a3;
          asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(a0) : "r"(x0), "r"(sg), "r"(og));
          asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(a1) : "r"(x1), "r"(s8), "r"(o8));
          asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(a2) : "r"(x2), "r"(sg), "r"(og));
          asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(a3) : "r"(x3), "r"(s8), "r"(o8));
          mma_tokens(c, a0, a1, a2, a3, (s * (STAGE_BYTES / Q4_SUPER) + j) * 16 + kt, cmask, boff);
        }
      }
#elif ARITH == 4
      const uint4* w = (const uint4*)ring(slot) + warp * PER_WARP;
      for (int k = lane; k < PER_WARP; k += 64) {
        acc = dot8(w[k], xa, xb, acc);  // two independent chains, not one
        acc2 = dot8(w[k + 32], xa, xb, acc2);
      }
#else
      const uint4* w = (const uint4*)ring(slot) + warp * PER_WARP;
#pragma unroll 2
      for (int k = lane; k < PER_WARP; k += 32) {
        const uint4 q = w[k];
#if ARITH
        const float4* x = (const float4*)(xs() + ((warp * PER_WARP + k) * 8 & 1023));
        acc = dot8(q, x[0], x[1], acc);
#else
        acc += __uint_as_float((q.x ^ q.y ^ q.z ^ q.w) & 0x3f7fffffu);
#endif
      }
#endif
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_bar(slot));
      if (++slot == NSTAGE) {
        slot = 0;
        parity ^= 1u;
      }
    }
#if ARITH == 2 || ARITH == 3
    acc = c[0] + c[1] + c[2] + c[3] + c[4] + c[5] + c[6] + c[7];
#elif ARITH == 4
    acc += acc2;
#endif
    // the block's share of the output, then the hand-off
    if (BARE) {
      if (SINK && acc == 1.2345e-30f) xs()[warp] = acc;  // never true in practice
      continue;
    }
    if (!OUTPUT) {
      csync();  // every warp done with the input before the next phase's loads overwrite it
      continue;
    }
    acc = warp_sum(acc);
    if (lane == 0) red()[warp] = acc;
    csync();
    u64* out = act_vec(act, h);
#if HOPS != 2
    if (ph.outb & REDUCE_BIT) {  // a partial of every output, added (the split-K form)
      const u32 n = ph.outb & ~REDUCE_BIT;
      const float r = red()[threadIdx.x % NCW] * 1e-30f;
#if CL > 1
      // the cluster's partials summed through distributed shared memory, each block adding
      // its slice of the sum: CL times fewer atomics
      if (nred) cluster_wait(cbar(1), (nred - 1) & 1u);  // every block done with my last one
      for (u32 i = 4 * threadIdx.x; i + 3 < n; i += 4 * NCT)
        *(float4*)(part() + i) = make_float4(r, r, r, r);
      csync();
      if (threadIdx.x == 0) arrive_everywhere(cbar(0));
      cluster_wait(cbar(0), nred & 1u);
      const u32 slice = ((n + CL - 1) / CL + 3) & ~3u, lo = cta_rank() * slice, hi = min(n, lo + slice);
      for (u32 i = lo + 4 * threadIdx.x; i + 3 < hi; i += 4 * NCT) {
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (u32 c = 0; c < CL; ++c) {
          float4 v;
          asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                       : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                       : "r"(peer(part() + i, c))
                       : "memory");
          sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
                         (float*)out + i), "f"(sum.x), "f"(sum.y), "f"(sum.z), "f"(sum.w)
                     : "memory");
      }
      csync();
      if (threadIdx.x == 0) arrive_everywhere(cbar(1));
      ++nred;
#else
      for (u32 i = 4 * threadIdx.x; i + 3 < n; i += 4 * NCT)
        asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
                         (float*)out + i), "f"(r), "f"(r), "f"(r), "f"(r)
                     : "memory");
#endif
    } else
#endif
    for (u32 i = threadIdx.x; i < ph.outb; i += NCT) {
      const u32 j = blockIdx.x * ph.outb + i;
      const u64 val = __float_as_uint(red()[i % NCW] * 1e-30f + 1.f);
#if HOPS == 2
      if (j < XMAX) st_relaxed(out + j, ((u64)(tag + h) << 32) | val);
#else
      if (j < XMAX) ((u32*)out)[j] = (u32)val;
#endif
    }
#if HOPS == 1
    csync();  // the block's stores before thread 0's release
    if (threadIdx.x == 0) {
      tr[3 * h] = globaltimer();
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ctr + h) : "memory");
    }
#else
    if (threadIdx.x == 0) tr[3 * h] = globaltimer();
    csync();  // red[] is read before the next phase's warps overwrite it
#endif
  }
#if CL > 1
  if (nred) cluster_wait(cbar(1), (nred - 1) & 1u);  // my partial stays until every block read it
#endif
  if (STALLS && threadIdx.x == 0) {
    stall[1] = waited;
    stall[2] = clock64() - c0;
    stall[3] = globaltimer() - g0;
  }
}
