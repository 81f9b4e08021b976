// The one-token decode step of a Qwen2 model as one persistent CUDA kernel (sm_90).
//
// Why CUDA and not Triton: at batch size one every weight is read once per token, so the step
// is bound by DRAM; the per-kernel Triton step pays a fixed 2.5-3 µs on each of its ~170
// launches, and the Triton single-launch step (megakernel.py) streams too slowly per program
// because its loads, reductions and stores form one dependent chain (docs/gpu-notes.md, runs
// 7-11). Here each block (one per SM) splits into
//
//   - a producer warp that streams the block's share of every weight matrix, in step order,
//     into a ring of shared-memory stages with the copy engine (cp.async.bulk, completion
//     counted on an mbarrier, L2 evict-first). Weights never depend on activations, so it runs
//     ahead across phases and layers, limited only by free stages;
//   - NCW consumer warps that wait for a phase's input, put the input vector in shared memory,
//     and reduce each stage's rows against it (each warp owns whole rows, or a K slice of one),
//     then free the stage.
//
// Phases per layer, separated by grid barriers (counters in global memory, zeroed before each
// launch):
//   qkv   RMSNorm(h) . Wqkv + bias, NeoX RoPE on q and k, k and v stored in the cache; each
//         unit counts itself for its kv head, and that head's attention starts on the count
//         (no grid barrier between qkv and attention)
//   attn  (kv head, split) items: partial softmax . V; the last split of a head to finish
//         merges that head's splits (a counter per layer and kv head)
//   wo    h += attn . Wo (the layer-0 residual is the token's embedding row)
//   w13   RMSNorm(h) . [gate; up] -> act = SiLU(gate) * up
//   w2    h += act . W2
// then RMSNorm(h) . Wout -> logits. Activations stay float32 end to end.
//
// Every output element is computed by one block in a fixed order, with no atomics in the
// arithmetic: replays are bit-identical. Compiled per model shape (the -D macros below) with
// no headers, so nvcc or NVRTC can build it. The TIME_* macros remove parts for timing
// experiments only (scripts/bench_cuda_step.py); their results are wrong by design.

typedef unsigned short bf16_t;
typedef unsigned long long u64;
typedef unsigned int u32;

#ifndef DM
#error "compile with -DDM=... (see cuda_step.py)"
#endif
// DM: model width; FF: feed-forward width; NH / NKV: query / kv heads; HD: head dim; NL: layers;
// NV: vocabulary; NCW: consumer warps; NSTAGE, STAGE_BYTES: the ring; SPLITS: most attention
// splits per kv head; RPW_*: rows per warp per unit, WPR_*: warps per row, NKC_*: K chunks
// (stages) per unit (see Kind).
#define QD (NH * HD)
#define KVD (NKV * HD)
#define QKVD (QD + 2 * KVD)
#define GRP (NH / NKV)
#define NCT (NCW * 32)
#define XMAX (FF > DM ? (FF > QD ? FF : QD) : (DM > QD ? DM : QD))
#ifndef ATILE
#define ATILE 128  // positions per attention tile: NCT / ATILE threads score each
#endif
#define NBAR_LAYER 5
#ifndef KV_PREFETCH
#define KV_PREFETCH 1
#endif
#ifndef TIME_NO_ATTN
#define TIME_NO_ATTN 0
#endif
// TRACE=1: each block's consumer thread 0 and producer lane 0 write %globaltimer at phase
// boundaries (points below), and the time consumer warp 0 waited for stages in each phase, to
// Params.trace; for scripts/bench_cuda_step.py --trace. Off, the macros compile to nothing.
#ifndef TRACE
#define TRACE 0
#endif
// Trace points of a layer (the head is layer NL: 0 start, 1 input ready, 2 done, 16 loaded):
//  0 start  1 qkv input  2 qkv done  3 attention ready seen  4 item done  5 merge done
//  6 barrier 1  7 wo input  8 wo done  9 barrier 2  10 w13 input  11 w13 done  12 barrier 3
//  13 w2 input  14 w2 done  15 barrier 4  16-19 producer issued qkv / wo / w13 / w2
//  20-23 the block's first attention item: scores in smem, softmax done, values summed,
//  partials stored (first / last tile)
//  24-27 ns consumer warp 0 waited for stages in qkv / wo / w13 / w2 (durations, not times)
#define NTP 28

struct Params {
  u64 wtab;      // const u64* [NL][7]: wqkv, bqkv, wo, w13, w2, attn_norm, ffn_norm
  u64 emb;       // bf16 [NV, DM]
  u64 out_w;     // bf16 [NV, DM]
  u64 out_norm;  // bf16 [DM]
  u64 inputs;    // int64 [2]: position, token
  u64 rope;      // float [npos, HD/2, 2]
  u64 kc;        // bf16 [NL, NKV, S, HD]
  u64 vc;
  u64 h;         // float [DM]
  u64 q;         // float [QD]
  u64 attn;      // float [QD]
  u64 act;       // float [FF]
  u64 part;      // float [NKV * SPLITS][GRP * HD + 2 * GRP]
  u64 logits;    // float [NV]
  u64 counters;  // u32 [NL * NBAR_LAYER + NL * NKV], zero at launch
  u64 trace;     // u64 [NL + 1][NTP][grid] timestamps (TRACE builds only; else 0)
  long long cache_s;  // S: positions per (layer, kv head) in the cache
  float eps;
  float scale;
};

enum { K_QKV = 0, K_WO = 1, K_13 = 2, K_2 = 3, K_OUT = 4 };

// ---- small helpers ------------------------------------------------------------------------

__device__ __forceinline__ float bf_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf2f(bf16_t b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {  // round to nearest even (no NaN inputs)
  u32 u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}

// <ptx-helpers> (scripts/bench_stream.py builds its kernels with this block too: the
// mbarrier and bulk-copy PTX, and the ring's layout in shared memory)
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 a;
  asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}"
      : "=r"(a)
      : "l"(p));
  return a;
}

__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Bulk copy global -> shared, completion counted on ``bar``; the weights are read once per
// step, so they are marked evict-first in L2.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar,
                                          u64 policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// The ring: NSTAGE stages of STAGE_BYTES at the start of the one extern shared array, then
// its full and empty mbarriers.
extern __shared__ __align__(128) unsigned char smem[];
#define RING_BYTES ((size_t)NSTAGE * STAGE_BYTES)
__device__ __forceinline__ unsigned char* ring(int slot) { return smem + (size_t)slot * STAGE_BYTES; }
__device__ __forceinline__ u64* full_bar(int slot) { return (u64*)(smem + RING_BYTES) + slot; }
__device__ __forceinline__ u64* empty_bar(int slot) {
  return (u64*)(smem + RING_BYTES) + NSTAGE + slot;
}

// The ring's barriers, by one thread before the block's first barrier: a stage is full when
// its one arming arrival and its bytes have landed, empty when the NCW consumer warps arrived.
__device__ __forceinline__ void ring_init() {
  for (int i = 0; i < NSTAGE; ++i) {
    mbar_init(full_bar(i), 1);
    mbar_init(empty_bar(i), NCW);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One poll: has the phase of ``bar`` with this parity completed?
__device__ __forceinline__ bool mbar_try_wait(u64* bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// </ptx-helpers>

__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// The consumer warps' own barrier (the producer warp never joins it).
__device__ __forceinline__ void csync() { asm volatile("bar.sync 1, %0;" ::"n"(NCT) : "memory"); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Grid-wide barrier over the consumers of every block. Activations written before it are read
// after it with ld.global.cg (L2), never from a possibly stale L1 line.
__device__ __forceinline__ void grid_sync(u32* ctr) {
#ifdef TIME_NO_SYNC  // timing experiments only: wrong results, the streaming alone
  return;
#endif
  csync();
  if (threadIdx.x == 0) {  // bar.sync then a release: the block's writes go with it
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
    u32 v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
    } while (v < gridDim.x);
  }
  csync();
}

// Attention splits per kv head at ``n`` positions: at least MIN_SPLIT positions a split
// (fewer splits are cheaper to merge), at most SPLITS (more blocks share a long context).
#ifndef MIN_SPLIT
#define MIN_SPLIT 32
#endif
__device__ __forceinline__ int active_splits(int n) {
  return min(SPLITS, max(1, (n + MIN_SPLIT - 1) / MIN_SPLIT));
}

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u64 gtime() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#if TRACE
#define TRACE_AT(P, THR, L, K, V)                                                        \
  do {                                                                                   \
    if (threadIdx.x == (THR))                                                            \
      ((u64*)(P).trace)[((size_t)(L) * NTP + (K)) * gridDim.x + blockIdx.x] = (V);       \
  } while (0)
#else
#define TRACE_AT(P, THR, L, K, V) \
  do {                            \
  } while (0)
#endif
#define TR(P, L, K) TRACE_AT(P, 0, L, K, gtime())

// ---- the schedule, shared by producer and consumers ----------------------------------------
//
// A matrix is cut into units of NCW / WPR * RPW rows; warp w of a block owns rows
// (j, w / WPR), j < RPW, of each of its units start to finish (slice w % WPR of K). Pair kinds (qkv: NeoX pairs (i, i + HD/2) of a head;
// gate/up: gate row j and up row j) have RPW = 2, the pair's two rows in the same warp(s), so
// the epilogue (RoPE, SiLU * up) finds both sums in one place. Where a unit's rows do not fit
// one stage, K is cut into NKC chunks, one stage each; a warp accumulates its rows across the
// chunks in registers (the plan prefers 2 warps a pair, each half of K, to chunks: whole rows
// make long contiguous copies). No block-wide barrier per stage: each warp frees the stage.

template <int KIND> struct Kind;
// WPR warps share a row (each a slice of K; their sums meet in smem), so a unit has
// NR = NCW / WPR rows per j: small units balance the blocks where rows are few (run 30).
template <> struct Kind<K_QKV> { enum { K = DM, RPW = 2, NKC = NKC_QKV, WPR = WPR_QKV }; };
template <> struct Kind<K_WO> { enum { K = QD, RPW = RPW_WO, NKC = NKC_WO, WPR = WPR_WO }; };
template <> struct Kind<K_13> { enum { K = DM, RPW = 2, NKC = NKC_13, WPR = WPR_13 }; };
template <> struct Kind<K_2> { enum { K = FF, RPW = RPW_2, NKC = NKC_2, WPR = WPR_2 }; };
template <> struct Kind<K_OUT> { enum { K = DM, RPW = RPW_OUT, NKC = NKC_OUT, WPR = 1 }; };

template <int KIND>
__device__ __forceinline__ int n_units() {
  constexpr int rows = NCW / Kind<KIND>::WPR * Kind<KIND>::RPW;
  return KIND == K_QKV ? QKVD / rows : KIND == K_WO ? DM / rows : KIND == K_13 ? 2 * FF / rows
         : KIND == K_2 ? DM / rows : NV / rows;
}

// Units [u0, u1) of this block: one contiguous range (dealing units round-robin measured the
// same, runs 29-31). The block order is rotated by layer so that the blocks that get one unit
// more are not the same in every layer.
template <int KIND>
__device__ __forceinline__ void my_units(int l, int* u0, int* u1) {
  const int n = n_units<KIND>();
  const int b = (blockIdx.x + l * 37) % gridDim.x;
  *u0 = (int)((u32)(n * b) / gridDim.x);  // 32-bit: n * grid stays far below 2^31
  *u1 = (int)((u32)(n * (b + 1)) / gridDim.x);
}

// Matrix row of row (j, w) of unit u (w < NCW / WPR: the row's slot in the unit).
template <int KIND>
__device__ __forceinline__ int row_of(int u, int j, int w) {
  constexpr int NR = NCW / Kind<KIND>::WPR;
  if (KIND == K_QKV) {
    constexpr int per_head = HD / 2 / NR;
    const int head = u / per_head, i = (u % per_head) * NR + w;
    return head * HD + i + j * (HD / 2);
  }
  if (KIND == K_13) return u * NR + w + j * FF;
  return (u * Kind<KIND>::RPW + j) * NR + w;
}

// ---- producer ------------------------------------------------------------------------------

// Shared memory, laid out at fixed offsets from the one extern array, so that every access
// compiles to a shared-memory instruction (a struct of pointers passed to the non-inlined
// attention made the compiler fall back to generic loads everywhere: run 32):
//   ring [NSTAGE][STAGE_BYTES] | full mbarriers [NSTAGE] | empty [NSTAGE] | xs [XMAX] | misc
// (misc's size: cuda_step._misc_floats). The ring and its barriers are declared with the PTX
// helpers above.
// the phase's input vector; the attention's q and scores alias it
__device__ __forceinline__ float* xs() { return (float*)(smem + RING_BYTES + 16 * NSTAGE); }
// Where float4 k of an N-float input vector sits in xs. XSPLIT: the first halves of every
// 8-float chunk, then the second halves, so a warp reading the 8 floats against its uint4 of
// weights reads two runs of consecutive 16-byte words (one wavefront per 8 lanes) rather than
// two 32-byte-strided ones (a 2-way bank conflict on every input read).
#ifndef XSPLIT
#define XSPLIT 1
#endif
template <int N>
__device__ __forceinline__ int xslot(int k) {
  return XSPLIT ? (k & 1) * (N / 8) + (k >> 1) : k;
}
// block reductions (0), softmax state (0-47), the merge flag (48), cross-warp sums (64)
__device__ __forceinline__ float* misc() { return xs() + XMAX; }

// The producer warp streams the block's stages: lane 0 waits for a free stage and arms its
// mbarrier, then one lane per contiguous run of bytes issues its copy (address arithmetic in
// parallel; one thread walking the schedule with run-time shapes was measurably the
// bottleneck, run 27). Asking L2 for weights further ahead, from a second warp, was slower at
// every distance (run 28), as it was from the Triton kernels in session 3.
struct Prod {
  int slot;
  u32 phase;
  u64 policy;
  int tslot;  // INFLIGHT: the stage issued INFLIGHT stages before this one, and its parity
  u32 tphase;
  u32 n;      // stages issued so far
};

// INFLIGHT > 0: at most INFLIGHT stages of a block are in flight (issued, not landed), however
// deep the ring (the plan sets 2). Every SM's outstanding bytes queue in L2 and DRAM, and every
// dependent round trip of the step (barriers, activations, attention) waits behind that queue:
// an L2 hit measured 0.3 µs with 2 x 24 KB in flight per SM and 1.4 µs with 7
// (bench_stream.py), for 98 % and 107 % of copy bandwidth. The ring beyond INFLIGHT still
// holds landed stages ahead of the consumers. 2 measured -4.5 % a step (1.5B @512), 1 worse
// for the 1.5B, 3 between (runs 46-47).
#ifndef INFLIGHT
#define INFLIGHT 0
#endif

template <int KIND>
__device__ void load_matrix(const bf16_t* w, int l, Prod& st) {
  constexpr int K = Kind<KIND>::K, RPW = Kind<KIND>::RPW, NKC = Kind<KIND>::NKC;
  constexpr int NR = NCW / Kind<KIND>::WPR;
  constexpr int KC = K / NKC;
  constexpr u32 SEG = KC * 2u;  // bytes of one row's chunk
  constexpr u32 BYTES = SEG * RPW * NR;
  const int lane = threadIdx.x % 32;
  int u0, u1;
  my_units<KIND>(l, &u0, &u1);
  for (int u = u0; u < u1; ++u) {
    for (int kc = 0; kc < NKC; ++kc) {
      u64* bar = full_bar(st.slot);
      if (lane == 0) {
        mbar_wait(empty_bar(st.slot), st.phase ^ 1u);
#if INFLIGHT > 0
        if (st.n >= INFLIGHT) {  // the slot INFLIGHT back cannot be re-armed before this
          mbar_wait(full_bar(st.tslot), st.tphase);
          if (++st.tslot == NSTAGE) {
            st.tslot = 0;
            st.tphase ^= 1u;
          }
        }
        ++st.n;
#endif
#ifdef TIME_NO_LOAD  // timing experiments only: stages "land" at once, with whatever they hold
        mbar_arrive(bar);
#else
        mbar_expect_tx(bar, BYTES);
#endif
      }
      __syncwarp();
      unsigned char* dst = ring(st.slot);
#ifndef TIME_NO_LOAD
      if (NKC == 1) {  // the NR rows of (j, *) are contiguous in the matrix
        if (lane < RPW)
          bulk_load(dst + lane * NR * SEG, w + (size_t)row_of<KIND>(u, lane, 0) * K, SEG * NR,
                    bar, st.policy);
      } else if (lane < RPW * NR) {
        const int j = lane / NR, ww = lane % NR;
        bulk_load(dst + lane * SEG, w + (size_t)row_of<KIND>(u, j, ww) * K + (size_t)kc * KC,
                  SEG, bar, st.policy);
      }
#endif
      if (++st.slot == NSTAGE) {
        st.slot = 0;
        st.phase ^= 1u;
      }
    }
  }
}

__device__ void produce(const Params& p, Prod& st) {
  const u64* wtab = (const u64*)p.wtab;
  for (int l = 0; l < NL; ++l) {
    const u64* lw = wtab + l * 7;
    load_matrix<K_QKV>((const bf16_t*)lw[0], l, st);
    TRACE_AT(p, NCT, l, 16, gtime());
    load_matrix<K_WO>((const bf16_t*)lw[2], l, st);
    TRACE_AT(p, NCT, l, 17, gtime());
    load_matrix<K_13>((const bf16_t*)lw[3], l, st);
    TRACE_AT(p, NCT, l, 18, gtime());
    load_matrix<K_2>((const bf16_t*)lw[4], l, st);
    TRACE_AT(p, NCT, l, 19, gtime());
  }
  load_matrix<K_OUT>((const bf16_t*)p.out_w, NL, st);
  TRACE_AT(p, NCT, NL, 16, gtime());
}

// ---- consumers -----------------------------------------------------------------------------


// xs = h * rsqrt(mean(h^2) + eps) * norm; ``h`` is the residual (or, for layer 0's qkv, the
// embedding row in bf16). Every load is issued before any is used: one L2 round trip (a loop
// of dependent load-store pairs cost ~2 µs a phase, run 29).
__device__ void load_normed(const float* h, const bf16_t* emb_row,
                            const bf16_t* norm, float eps) {
#ifdef TIME_NO_PREP  // timing experiments only
  return;
#endif
  constexpr int N4 = DM / 4, PER = (N4 + NCT - 1) / NCT;
  float4 v[PER];
  uint2 g[PER];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int k = threadIdx.x + i * NCT;
    v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    g[i] = make_uint2(0u, 0u);
    if (k < N4) {
      if (emb_row) {
        const uint2 e = *((const uint2*)emb_row + k);
        v[i] = make_float4(bf_lo(e.x), bf_hi(e.x), bf_lo(e.y), bf_hi(e.y));
      } else {
        v[i] = __ldcg((const float4*)h + k);
      }
      g[i] = *((const uint2*)norm + k);
    }
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  ss = warp_sum(ss);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) misc()[warp] = ss;
  csync();
  float tot = 0.f;
#pragma unroll
  for (int w = 0; w < NCW; ++w) tot += misc()[w];
  const float inv = rsqrtf(tot / DM + eps);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int k = threadIdx.x + i * NCT;
    if (k < N4)
      ((float4*)xs())[xslot<DM>(k)] = make_float4(v[i].x * inv * bf_lo(g[i].x), v[i].y * inv * bf_hi(g[i].x),
                                       v[i].z * inv * bf_lo(g[i].y), v[i].w * inv * bf_hi(g[i].y));
  }
  csync();
}

template <int N>
__device__ void load_vec(const float* src) {
#ifdef TIME_NO_PREP  // timing experiments only
  return;
#endif
  constexpr int N4 = N / 4, PER = (N4 + NCT - 1) / NCT;
  float4 v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int k = threadIdx.x + i * NCT;
    if (k < N4) v[i] = __ldcg((const float4*)src + k);
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int k = threadIdx.x + i * NCT;
    if (k < N4) ((float4*)xs())[xslot<N>(k)] = v[i];
  }
  csync();
}

struct Cursor {
  int slot;
  u32 phase;
  int red;   // which half of the cross-warp sums buffer the next unit uses
  u64 wait;  // TRACE: ns thread 0 waited for stages in this phase
};

// Units are taken UB at a time (the last batch of a phase may hold fewer, ``nu``): their
// stages are reduced one after another as they land, but the tail of a unit (the lanes' and
// warps' partial sums meeting, the epilogue) is paid once a batch, with the UB units' chains
// side by side, and lane b of a row's owning warp finishes unit b. With the tail paid once a
// unit, the consumers with neither weights to wait for nor arithmetic to do spent 0.42 µs a
// unit (the 1.5B's gate/up: 17 units a block, 7.2 µs a layer; run 44).
#ifndef UB
#define UB 4
#endif

// acc[b][j] = row (j, warp / WPR) of unit b . xs, for b < nu; every lane of a warp holds the
// sums (WPR = 1), or every lane of the row's first warp (warp % WPR == 0) once the slices met.
template <int KIND>
__device__ __forceinline__ void unit_dots(Cursor& c, int nu,
                                          float (&acc)[UB][Kind<KIND>::RPW]) {
  constexpr int K = Kind<KIND>::K, RPW = Kind<KIND>::RPW, NKC = Kind<KIND>::NKC;
  constexpr int WPR = Kind<KIND>::WPR, NR = NCW / WPR;
  constexpr int KC = K / NKC, NCH = KC / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot_row = warp / WPR, part = warp % WPR;
#pragma unroll
  for (int b = 0; b < UB; ++b)
#pragma unroll
    for (int j = 0; j < RPW; ++j) acc[b][j] = 0.f;
#pragma unroll
  for (int b = 0; b < UB; ++b) {
    if (b >= nu) break;
    for (int kc = 0; kc < NKC; ++kc) {
#if TRACE
      const u64 t_wait = gtime();
      mbar_wait(full_bar(c.slot), c.phase);
      c.wait += gtime() - t_wait;
#else
      mbar_wait(full_bar(c.slot), c.phase);
#endif
      const unsigned char* st = ring(c.slot);
      const float4* x4 = (const float4*)xs() + (XSPLIT ? kc * (KC / 8) : kc * (KC / 4));
      // A fixed trip count, fully unrolled: every smem load of the stage is issued at once,
      // and the code does not depend on how the compiler weighs the rest of the kernel (run 32).
      constexpr int STEP = 32 * WPR, ITERS = (NCH + STEP - 1) / STEP;
#ifdef TIME_NO_COMPUTE  // timing experiments only: the stream without the arithmetic
      if (NCH < 0)
#endif
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        const int ch = part * 32 + lane + i * STEP;
        if (NCH % STEP != 0 && ch >= NCH) break;
        const float4 xa = XSPLIT ? x4[ch] : x4[2 * ch];
        const float4 xb = XSPLIT ? x4[K / 8 + ch] : x4[2 * ch + 1];
#pragma unroll
        for (int j = 0; j < RPW; ++j) {
          const uint4 w = ((const uint4*)(st + (size_t)(j * NR + slot_row) * KC * 2))[ch];
          acc[b][j] += bf_lo(w.x) * xa.x + bf_hi(w.x) * xa.y + bf_lo(w.y) * xa.z +
                       bf_hi(w.y) * xa.w + bf_lo(w.z) * xb.x + bf_hi(w.z) * xb.y +
                       bf_lo(w.w) * xb.z + bf_hi(w.w) * xb.w;
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_bar(c.slot));  // NCW arrivals free the stage
      if (++c.slot == NSTAGE) {
        c.slot = 0;
        c.phase ^= 1u;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)  // every lane gets every sum; the chains run side by side
#pragma unroll
    for (int b = 0; b < UB; ++b)
#pragma unroll
      for (int j = 0; j < RPW; ++j) acc[b][j] += __shfl_xor_sync(0xffffffffu, acc[b][j], o);
  if (WPR > 1) {  // the row's slices meet in smem (double-buffered: no barrier after reading)
    float* red = misc() + 64 + c.red * NCW * UB * RPW;
    if (lane == 0)
#pragma unroll
      for (int b = 0; b < UB; ++b)
#pragma unroll
        for (int j = 0; j < RPW; ++j) red[(warp * UB + b) * RPW + j] = acc[b][j];
    csync();
    if (part == 0)
#pragma unroll
      for (int b = 0; b < UB; ++b)
#pragma unroll
        for (int j = 0; j < RPW; ++j) {
          float t = 0.f;
#pragma unroll
          for (int q = 0; q < WPR; ++q) t += red[((warp + q) * UB + b) * RPW + j];
          acc[b][j] = t;
        }
    c.red ^= 1;
  }
}

// Lane b of a row's first warp finishes unit b of a batch of nu.
template <int KIND>
__device__ __forceinline__ bool owns_unit(int nu) {
  return threadIdx.x % 32 < nu && (threadIdx.x / 32) % Kind<KIND>::WPR == 0;
}

// v = acc[b] without indexing registers at run time (that would put acc in local memory).
template <int RPW>
__device__ __forceinline__ void pick(const float (&acc)[UB][RPW], int b, float (&v)[RPW]) {
#pragma unroll
  for (int j = 0; j < RPW; ++j) v[j] = acc[0][j];
#pragma unroll
  for (int bb = 1; bb < UB; ++bb)
    if (bb == b)
#pragma unroll
      for (int j = 0; j < RPW; ++j) v[j] = acc[bb][j];
}

// The o- and down-projection stages: every row a warp owns gets its dot added to the
// residual h, or, in the first layer's o-projection, to the embedding row h is not yet
// written with (``emb_row``; nullptr: h). One body for both stages.
template <int KIND>
__device__ __forceinline__ void residual_units(Cursor& c, int u0, int u1, float* h,
                                               const bf16_t* emb_row) {
  constexpr int RPW = Kind<KIND>::RPW, WPR = Kind<KIND>::WPR;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int u = u0; u < u1; u += UB) {
    const int nu = min(UB, u1 - u);
    const bool own = owns_unit<KIND>(nu);
    float base[RPW], acc[UB][RPW], v[RPW];
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      const int row = row_of<KIND>(u + lane, j, warp / WPR);
      base[j] = !own ? 0.f : emb_row ? bf2f(emb_row[row]) : __ldcg(h + row);
    }
    unit_dots<KIND>(c, nu, acc);
    if (own) {
      pick(acc, lane, v);
#pragma unroll
      for (int j = 0; j < RPW; ++j) h[row_of<KIND>(u + lane, j, warp / WPR)] = base[j] + v[j];
    }
  }
}

#ifndef KV_EARLY
#define KV_EARLY 1
#endif
// One attention tile's K and V rows into registers: the K slice of position t0 + pi for this
// thread, and the V dims of rows warp + i * NCW for this lane; rows at or past ``lim`` (or
// past the split's end s1) are left alone.
template <int NK, int NVP, int NVW>
__device__ __forceinline__ void load_kv_tile(const bf16_t* kbase, const bf16_t* vbase, int t0,
                                             int s1, int lim, uint4 (&kw)[NK],
                                             u32 (&vw)[NVP][NVW]) {
  constexpr int TPP = NCT / ATILE;
  const int pi = threadIdx.x / TPP, slice = threadIdx.x % TPP;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int end = min(s1, lim);
  if (t0 + pi < end) {
    const uint4* kr = (const uint4*)(kbase + (size_t)(t0 + pi) * HD) + slice * NK;
#pragma unroll
    for (int c = 0; c < NK; ++c) kw[c] = __ldcg(kr + c);
  }
  const u32* vrow = (const u32*)(vbase + (size_t)t0 * HD + lane * (HD / 32));
#pragma unroll
  for (int i = 0; i < NVP; ++i)
    if (t0 + warp + i * NCW < end)
#pragma unroll
      for (int e = 0; e < NVW; ++e) vw[i][e] = __ldcg(vrow + (size_t)(warp + i * NCW) * HD / 2 + e);
}

// One layer's attention for the token at ``pos``: (kv head, split) items, one per block.
// Scores: one position per thread (its K row against the group's queries, from smem). Values:
// warp w sums positions w, w + NCW, ... with each lane owning HD/32 dims of every query head
// of the group, then the warps' sums are added in smem. The last split of a kv head to finish
// merges the head's splits into ``attn``. Loads are issued as early as their addresses are
// known (K with q, V before the softmax), so an item costs a few L2/DRAM round trips.
__device__ __forceinline__ void attention(const Params& p, int l, int pos) {
  constexpr int DPL = HD / 32;          // dims per lane in the value sum
  constexpr int VPW = ATILE / NCW;      // positions per warp per tile
  constexpr int VW = DPL / 2;           // 32-bit words per lane per position
  constexpr int QPT = (GRP * HD + NCT - 1) / NCT;
  constexpr int TPP = NCT / ATILE;      // threads per scored position
  const int n = pos + 1, S = active_splits(n);
  const int items = NKV * S;
  const float* qg = (const float*)p.q;
  float* part = (float*)p.part;
  u32* head_ctr = (u32*)p.counters + NL * NBAR_LAYER + l * NKV;
  const int per = (n + S - 1) / S;
  const u32* ready = (const u32*)p.counters + NL * NBAR_LAYER + NL * NKV + l * NKV;
  float* qs = xs();                 // [GRP * HD], scaled
  float* sc = xs() + GRP * HD;      // [GRP][ATILE] scores, then probabilities; then the
                                    // warps' value sums [NCW][GRP * HD]
  float* mrow = misc();             // [GRP] running max
  float* lrow = misc() + 16;        // [GRP] running sum
  float* alpha = misc() + 32;       // [GRP] rescale of this tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int it = blockIdx.x; it < items; it += gridDim.x) {
    const int kvh = it / S, sp = it % S;
    const int s0 = sp * per, s1 = min(n, s0 + per);
    const bf16_t* kbase = (const bf16_t*)p.kc + ((size_t)l * NKV + kvh) * p.cache_s * HD;
    const bf16_t* vbase = (const bf16_t*)p.vc + ((size_t)l * NKV + kvh) * p.cache_s * HD;
    // TPP threads per position, each a 1/TPP slice of the head dim, sums met by shuffles
    const int pi = threadIdx.x / TPP, slice = threadIdx.x % TPP;
    uint4 kw[HD / 8 / TPP];  // the tile's K slice of position t0 + pi
    u32 vw[VPW][VW];         // the tile's V rows warp + i * NCW, this lane's dims
    // KV_EARLY: the first tile's rows are asked for before this head's qkv is written: every
    // row but the new position's is in the cache already (that one is loaded again after).
    // Against loading them after the wait: -0.8 % a step (1.5B @512), -3 to -5 % (0.5B); and
    // V rows now travel with the K rows rather than after the scores (run 50).
    if (KV_EARLY) load_kv_tile(kbase, vbase, s0, s1, pos, kw, vw);
    if (threadIdx.x == 0)  // this head's q, k and v rows are written (no grid barrier)
      while (ld_acquire(ready + kvh) < (u32)((GRP + 2) * (HD / 2 / (NCW / WPR_QKV)))) {
      }
    if (it == blockIdx.x) TR(p, l, 3);
    csync();
    if (!KV_EARLY) {
      load_kv_tile(kbase, vbase, s0, s1, n, kw, vw);
    } else if (s0 <= pos && pos < min(s1, s0 + ATILE)) {  // the new position's rows
      if (s0 + pi == pos) {
        const uint4* kr = (const uint4*)(kbase + (size_t)pos * HD) + slice * (HD / 8 / TPP);
#pragma unroll
        for (int c = 0; c < HD / 8 / TPP; ++c) kw[c] = __ldcg(kr + c);
      }
      const u32* vrow = (const u32*)(vbase + (size_t)pos * HD + lane * DPL);
#pragma unroll
      for (int i = 0; i < VPW; ++i)
        if (s0 + warp + i * NCW == pos)
#pragma unroll
          for (int e = 0; e < VW; ++e) vw[i][e] = __ldcg(vrow + e);
    }
    float qv[QPT];
#pragma unroll
    for (int i = 0; i < QPT; ++i) {
      const int o = threadIdx.x + i * NCT;
      qv[i] = o < GRP * HD ? __ldcg(qg + kvh * GRP * HD + o) : 0.f;
    }
    if (threadIdx.x < GRP) {
      mrow[threadIdx.x] = -1e30f;
      lrow[threadIdx.x] = 0.f;
    }
    float va[GRP][DPL];
#pragma unroll
    for (int g = 0; g < GRP; ++g)
#pragma unroll
      for (int e = 0; e < DPL; ++e) va[g][e] = 0.f;
    bool first = true;
    for (int t0 = s0; t0 < s1; t0 += ATILE) {
      const int pp = t0 + pi;
      const bool mine = pp < s1;  // this thread scores (a slice of) position pp
      if (first) {  // q reaches smem while the first K rows are in flight
#pragma unroll
        for (int i = 0; i < QPT; ++i) {
          const int o = threadIdx.x + i * NCT;
          if (o < GRP * HD) qs[o] = qv[i] * p.scale;
        }
        csync();
        first = false;
      }
      float sg[GRP];
#pragma unroll
      for (int g = 0; g < GRP; ++g) sg[g] = 0.f;
      if (mine) {
        const float* qp = qs + slice * (HD / TPP);
#pragma unroll
        for (int c = 0; c < HD / 8 / TPP; ++c) {
          const uint4 w = kw[c];
          const float kv[8] = {bf_lo(w.x), bf_hi(w.x), bf_lo(w.y), bf_hi(w.y),
                               bf_lo(w.z), bf_hi(w.z), bf_lo(w.w), bf_hi(w.w)};
#pragma unroll
          for (int g = 0; g < GRP; ++g) {
            const float4 qa = *(const float4*)(qp + g * HD + c * 8);
            const float4 qb = *(const float4*)(qp + g * HD + c * 8 + 4);
            sg[g] += qa.x * kv[0] + qa.y * kv[1] + qa.z * kv[2] + qa.w * kv[3] +
                     qb.x * kv[4] + qb.y * kv[5] + qb.z * kv[6] + qb.w * kv[7];
          }
        }
      }
#pragma unroll
      for (int o = 1; o < TPP; o <<= 1)
#pragma unroll
        for (int g = 0; g < GRP; ++g) sg[g] += __shfl_xor_sync(0xffffffffu, sg[g], o);
      if (slice == 0)
#pragma unroll
        for (int g = 0; g < GRP; ++g) sc[g * ATILE + pi] = mine ? sg[g] : -1e30f;
      const int len = min(ATILE, s1 - t0);
      csync();
      if (it == blockIdx.x && t0 == s0) TR(p, l, 20);
      for (int g = warp; g < GRP; g += NCW) {  // one warp per query head: tile max and sum
        float m = -1e30f;
        for (int j = lane; j < ATILE; j += 32) m = fmaxf(m, sc[g * ATILE + j]);
        m = warp_max(m);
        const float m_new = fmaxf(mrow[g], m);
        float sum = 0.f;
        for (int j = lane; j < ATILE; j += 32) {
          const float e = t0 + j < s1 ? __expf(sc[g * ATILE + j] - m_new) : 0.f;
          sc[g * ATILE + j] = e;
          sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
          const float a = __expf(mrow[g] - m_new);
          alpha[g] = a;
          lrow[g] = lrow[g] * a + sum;
          mrow[g] = m_new;
        }
      }
      csync();
      if (it == blockIdx.x && t0 == s0) TR(p, l, 21);
#pragma unroll
      for (int g = 0; g < GRP; ++g) {
        const float a = alpha[g];
#pragma unroll
        for (int e = 0; e < DPL; ++e) va[g][e] *= a;
      }
#pragma unroll
      for (int i = 0; i < VPW; ++i) {
        const int t = warp + i * NCW;
        if (t < len) {
#pragma unroll
          for (int g = 0; g < GRP; ++g) {
            const float pr = sc[g * ATILE + t];
#pragma unroll
            for (int e = 0; e < VW; ++e) {
              va[g][2 * e] += pr * bf_lo(vw[i][e]);
              va[g][2 * e + 1] += pr * bf_hi(vw[i][e]);
            }
          }
        }
      }
      if (t0 + ATILE < s1) load_kv_tile(kbase, vbase, t0 + ATILE, s1, n, kw, vw);  // the next
      csync();
    }
    if (first) csync();  // an empty split: nothing was loaded
    if (it == blockIdx.x) TR(p, l, 22);
    float* wsum = sc;  // [NCW][GRP * HD]: the scores are no longer read
#pragma unroll
    for (int g = 0; g < GRP; ++g)
#pragma unroll
      for (int e = 0; e < DPL; ++e) wsum[warp * GRP * HD + g * HD + lane * DPL + e] = va[g][e];
    csync();
    float* dst = part + (size_t)it * (GRP * HD + 2 * GRP);
    for (int o = threadIdx.x; o < GRP * HD; o += NCT) {
      float a = 0.f;
#pragma unroll
      for (int w = 0; w < NCW; ++w) a += wsum[w * GRP * HD + o];
      dst[o] = a;
    }
    if (threadIdx.x < GRP) {
      dst[GRP * HD + threadIdx.x] = mrow[threadIdx.x];
      dst[GRP * HD + GRP + threadIdx.x] = lrow[threadIdx.x];
    }
    csync();
    if (it == blockIdx.x) TR(p, l, 23);
    if (threadIdx.x == 0) {  // release the partials, acquire the others' if last
      u32 old;
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                   : "=r"(old)
                   : "l"(head_ctr + kvh)
                   : "memory");
      misc()[48] = old == (u32)S - 1 ? 1.f : 0.f;
    }
    TR(p, l, 4);
    csync();
#ifdef TIME_NO_COMBINE  // timing experiments only
    if (pos < 0)
#endif
    if (misc()[48] != 0.f) {  // the last split of this kv head to finish merges them all
      const float* hp = part + (size_t)kvh * S * (GRP * HD + 2 * GRP);
      float* cw = xs();  // [GRP][SPLITS] each split's weight, then [GRP][SPLITS] its l
      float* cl = xs() + GRP * SPLITS;
      for (int i = threadIdx.x; i < GRP * SPLITS; i += NCT) {
        const int g = i / SPLITS, k = i % SPLITS;
        if (k >= S) continue;
        const float* q = hp + k * (GRP * HD + 2 * GRP) + GRP * HD;
        cw[i] = __ldcg(q + g);
        cl[i] = __ldcg(q + GRP + g);
      }
      csync();
      for (int g = warp; g < GRP; g += NCW) {  // one warp per query head: the split weights
        float m = -1e30f;
        for (int k = lane; k < S; k += 32) m = fmaxf(m, cw[g * SPLITS + k]);
        m = warp_max(m);
        float den = 0.f;
        for (int k = lane; k < S; k += 32) den += __expf(cw[g * SPLITS + k] - m) * cl[g * SPLITS + k];
        den = warp_sum(den);
        __syncwarp();
        for (int k = lane; k < S; k += 32) cw[g * SPLITS + k] = __expf(cw[g * SPLITS + k] - m) / den;
      }
      csync();
      float* out = (float*)p.attn + kvh * GRP * HD;
      for (int o = threadIdx.x; o < GRP * HD; o += NCT) {
        const float* wk = cw + (o / HD) * SPLITS;
        float num = 0.f;
#pragma unroll
        for (int k = 0; k < SPLITS; ++k)
          if (k < S) num += wk[k] * __ldcg(hp + k * (GRP * HD + 2 * GRP) + o);
        out[o] = num;
      }
      TR(p, l, 5);
    }
    csync();
  }
}

__device__ void consumer(const Params& p) {
  const long long* in = (const long long*)p.inputs;
  const int pos = (int)in[0];
  const long long tok = in[1];
  const bf16_t* emb_row = (const bf16_t*)p.emb + tok * DM;
  const u64* wtab = (const u64*)p.wtab;
  float* h = (float*)p.h;
  u32* bar = (u32*)p.counters;
  const float* rope = (const float*)p.rope + (size_t)pos * HD;  // [HD/2][2] at pos
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Cursor c{0, 0u, 0, 0ull};
// the time warp 0 waited for stages in phase K, then a fresh count for the next phase
#define TRACE_WAIT(L, K)                \
  do {                                  \
    TRACE_AT(p, 0, L, 24 + (K), c.wait); \
    c.wait = 0;                         \
  } while (0)
  int u0, u1;
  for (int l = 0; l < NL; ++l) {
    const u64* lw = wtab + l * 7;
    // -- qkv + bias + RoPE + cache write
#if KV_PREFETCH
    // This block's attention item reads K/V rows [s0, s1) of this layer after the next
    // barrier; all but the new position are in the cache already: ask L2 for them now, so
    // the attention's loads do not queue behind the weight stream in DRAM.
    const int S = active_splits(pos + 1);
    if (threadIdx.x == 0 && blockIdx.x < NKV * S) {
      const int it = blockIdx.x, kvh = it / S, sp = it % S;
      const int per = (pos + S) / S, s0 = sp * per, s1 = min(pos, s0 + per);
      if (s1 > s0) {
        const size_t off = (((size_t)l * NKV + kvh) * p.cache_s + s0) * HD;
        const u32 bytes = (u32)(s1 - s0) * HD * 2u;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const bf16_t*)p.kc + off),
                     "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const bf16_t*)p.vc + off),
                     "r"(bytes) : "memory");
      }
    }
#endif
    TR(p, l, 0);
    my_units<K_QKV>(l, &u0, &u1);
    if (u1 > u0) load_normed(h, l == 0 ? emb_row : nullptr, (const bf16_t*)lw[5], p.eps);
    TR(p, l, 1);
    for (int u = u0; u < u1; u += UB) {
      const int nu = min(UB, u1 - u);
      const bool own = owns_unit<K_QKV>(nu);
      const int a = row_of<K_QKV>(u + (own ? lane : 0), 0, warp / WPR_QKV), head = a / HD,
                i = a % HD;
      const bf16_t* bias = (const bf16_t*)lw[1];
      float b1 = 0.f, b2 = 0.f, cs = 1.f, sn = 0.f;
      if (own) {  // issued before the dot products: their latency overlaps them
        b1 = bf2f(bias[a]);
        b2 = bf2f(bias[a + HD / 2]);
        cs = rope[2 * i];
        sn = rope[2 * i + 1];
      }
      float acc[UB][2];
      unit_dots<K_QKV>(c, nu, acc);
      if (own) {
        float v[2];
        pick(acc, lane, v);
        float y1 = v[0] + b1, y2 = v[1] + b2;
        if (head < NH + NKV) {  // q and k: NeoX RoPE on (i, i + HD/2)
          const float o1 = y1 * cs - y2 * sn, o2 = y2 * cs + y1 * sn;
          y1 = o1;
          y2 = o2;
        }
        if (head < NH) {
          ((float*)p.q)[head * HD + i] = y1;
          ((float*)p.q)[head * HD + i + HD / 2] = y2;
        } else {
          const int kvh = head < NH + NKV ? head - NH : head - NH - NKV;
          bf16_t* cache = (bf16_t*)(head < NH + NKV ? p.kc : p.vc) +
                          (((size_t)l * NKV + kvh) * p.cache_s + pos) * HD;
          cache[i] = f2bf(y1);
          cache[i + HD / 2] = f2bf(y2);
        }
      }
      csync();  // the units' rows are written: count them for their kv heads' attention
      if (threadIdx.x < nu) {
        const int hd = row_of<K_QKV>(u + threadIdx.x, 0, 0) / HD;
        const int kvh = hd < NH ? hd / GRP : hd < NH + NKV ? hd - NH : hd - NH - NKV;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(
                         (u32*)p.counters + NL * NBAR_LAYER + NL * NKV + l * NKV + kvh)
                     : "memory");
      }
    }
    TR(p, l, 2);
    TRACE_WAIT(l, 0);
#if TIME_NO_ATTN
    grid_sync(bar + l * NBAR_LAYER + 0);
#endif
    // -- attention
#if !TIME_NO_ATTN  // timing experiments only
#ifdef TIME_SKIP_ATTN  // timing experiments only: compiled, never run
    if (pos < 0)
#endif
    attention(p, l, pos);
#endif
    grid_sync(bar + l * NBAR_LAYER + 1);
    TR(p, l, 6);
    // -- o-projection + residual
    my_units<K_WO>(l, &u0, &u1);
    if (u1 > u0) load_vec<QD>((const float*)p.attn);
    TR(p, l, 7);
    residual_units<K_WO>(c, u0, u1, h, l == 0 ? emb_row : nullptr);
    TR(p, l, 8);
    TRACE_WAIT(l, 1);
    grid_sync(bar + l * NBAR_LAYER + 2);
    TR(p, l, 9);
    // -- RMSNorm + gate/up + SiLU * up
    my_units<K_13>(l, &u0, &u1);
    if (u1 > u0) load_normed(h, nullptr, (const bf16_t*)lw[6], p.eps);
    TR(p, l, 10);
    for (int u = u0; u < u1; u += UB) {
      const int nu = min(UB, u1 - u);
      float acc[UB][2], v[2];
      unit_dots<K_13>(c, nu, acc);
      if (owns_unit<K_13>(nu)) {
        pick(acc, lane, v);
        ((float*)p.act)[row_of<K_13>(u + lane, 0, warp / WPR_13)] = v[0] / (1.f + __expf(-v[0])) * v[1];
      }
    }
    TR(p, l, 11);
    TRACE_WAIT(l, 2);
    grid_sync(bar + l * NBAR_LAYER + 3);
    TR(p, l, 12);
    // -- down-projection + residual
    my_units<K_2>(l, &u0, &u1);
    if (u1 > u0) load_vec<FF>((const float*)p.act);
    TR(p, l, 13);
    residual_units<K_2>(c, u0, u1, h, nullptr);
    TR(p, l, 14);
    TRACE_WAIT(l, 3);
    grid_sync(bar + l * NBAR_LAYER + 4);
    TR(p, l, 15);
  }
  // -- final norm + output projection
  TR(p, NL, 0);
  my_units<K_OUT>(NL, &u0, &u1);
  if (u1 > u0) load_normed(h, nullptr, (const bf16_t*)p.out_norm, p.eps);
  TR(p, NL, 1);
  float* logits = (float*)p.logits;
  for (int u = u0; u < u1; u += UB) {
    const int nu = min(UB, u1 - u);
    float acc[UB][RPW_OUT], v[RPW_OUT];
    unit_dots<K_OUT>(c, nu, acc);
    if (owns_unit<K_OUT>(nu)) {
      pick(acc, lane, v);
#pragma unroll
      for (int j = 0; j < RPW_OUT; ++j) logits[row_of<K_OUT>(u + lane, j, warp)] = v[j];
    }
  }
  TR(p, NL, 2);
  TRACE_WAIT(NL, 0);
}

extern "C" __global__ void __launch_bounds__(NCT + 32) decode_step(const __grid_constant__ Params p) {
  if (threadIdx.x == 0) ring_init();
  __syncthreads();
  if (threadIdx.x >= NCT) {  // the producer warp
    Prod st{0, 0u, 0, 0, 0u, 0u};
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(st.policy));
    produce(p, st);
    return;
  }
  consumer(p);
}
