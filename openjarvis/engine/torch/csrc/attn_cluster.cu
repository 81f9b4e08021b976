// One-token attention of one layer in one launch, for the Triton step (attn_cluster.py).
//
// The Triton path runs a split kernel (one program per kv head and split of the sequence) and
// a merge kernel; session 10's trace put the pair at 5.6 us a layer @512 and 8.2 @4096 (1.5B)
// over a floor under 1 us. Here a thread-block cluster of CS CTAs shares one (kv head, group
// of HG query heads): each CTA takes a contiguous CS-th of the keys, and the partial softmax
// states are merged through distributed shared memory, so there is no merge kernel and no
// round trip through global memory between the splits.
//
// Keys before `start` were written by earlier steps, so each CTA asks for its first NB blocks
// of them (cp.async, zero-filled past the live rows) before waiting on the qkv kernel (PDL);
// the step's own key (position `start`, written by that kernel) is read after the wait, with
// q, and added to the softmax of the CTA whose range holds it.
//
// Compile-time shape: HD head dim, G query heads per kv head, HG query heads per CTA, CS CTAs
// per cluster, NT threads, BK keys per block, NB blocks in flight.

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

#define KQ (NT / BK)            // threads per key in the score phase
#define DPT (HD / KQ)           // dims a thread covers in the score phase
#define KS (NT / HD)            // key slices in the value phase
#define ROWB (HD * 2)           // bytes of one K or V row
#define CPR (ROWB / 16)         // 16-byte chunks in a row
#define BLKB (BK * ROWB)        // bytes of a K (or V) block
#define STAGE (2 * BLKB)
#define NOUT (HG * HD / CS)     // outputs each CTA of the cluster finishes

static_assert(NT % BK == 0 && HD % KQ == 0 && DPT % 8 == 0, "score phase shape");
static_assert(NT % HD == 0 && BK % KS == 0, "value phase shape");
static_assert(CPR >= 8, "the swizzle needs 8 chunks a row");
static_assert((HG * HD) % CS == 0 && NOUT <= NT, "merge shape");
static_assert(HG <= NT / 32, "one warp a head in the softmax");

extern __shared__ __align__(128) unsigned char smem[];

__device__ __forceinline__ float bf2f(bf16_t b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {  // round to nearest even
  u32 u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}
__device__ __forceinline__ u32 smem_u32(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp16(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_groups() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
}
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ float ld_remote(const float* p, u32 rank) {
  u32 a;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_u32(p)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
  return v;
}

// Shared memory after the ring: q [HG][QROW] (padded: the KQ dim slices of a row in other
// banks), scores/weights [HG][CH], per-head state (m, l, alpha, p of the new key) [4][HG],
// value partials [KS][HG][HD], the new key and value [2][HD].
#define CH (NB * BK)             // keys resident at once (a chunk)
#define QROW (HD + 2 * KQ)
__device__ __forceinline__ float* q_s() { return (float*)(smem + NB * STAGE); }
__device__ __forceinline__ float* p_s() { return q_s() + HG * QROW; }
__device__ __forceinline__ float* st_s() { return p_s() + HG * CH; }
__device__ __forceinline__ float* o_s() { return st_s() + 4 * HG; }
__device__ __forceinline__ float* kv_s() { return o_s() + KS * HG * HD; }

// Chunk `c` of this CTA's keys (blocks c*NB .. c*NB+NB-1) into the ring, one commit group:
// rows at or past `live` (this step's key, or past the CTA's range) read as zeros.
__device__ __forceinline__ void issue_chunk(const bf16_t* kb, const bf16_t* vb, int lo, int c,
                                            int live, int nb) {
  const u32 base = smem_u32(smem);
  for (int i = threadIdx.x; i < nb * 2 * BK * CPR; i += NT) {
    const int blk = i / (2 * BK * CPR), rem = i % (2 * BK * CPR);
    const int kv = rem / (BK * CPR), r = (rem / CPR) % BK, ch = rem % CPR;
    const int key = lo + (c * NB + blk) * BK + r;
    const bool ok = key < live;
    const bf16_t* src = (kv ? vb : kb) + (size_t)(ok ? key : 0) * HD + ch * 8;
    cp16(base + blk * STAGE + kv * BLKB + r * ROWB + ((ch ^ (r & 7)) * 16), src, ok);
  }
  commit();
}

__device__ __forceinline__ void stamp(u64* tr, int slot, int e) {
  if (tr != nullptr && threadIdx.x == 0) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    tr[slot * 4 + e] = t;
  }
}

extern "C" __global__ void __launch_bounds__(NT) attn_cluster(
    const float* __restrict__ q,      // [H, HD] float32, RoPE applied
    const bf16_t* __restrict__ kc,    // [NKV, S, HD] this layer's keys
    const bf16_t* __restrict__ vc,    // [NKV, S, HD]
    const long long* __restrict__ start_ptr,  // the step's position (written before the graph)
    bf16_t* __restrict__ out,         // [H * HD] the attention output (the o-projection's input)
    long long stride_ch, float scale,
    u64* tr, int tr_base) {           // tracing only (scripts/trace_step.py): stamps, or null
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const u32 rank = cluster_rank();
  const int slot = tr_base + blockIdx.y * CS + rank;
  stamp(tr, slot, 0);
  const int groups = G / HG;
  const int kvh = blockIdx.y / groups, h0 = kvh * G + (blockIdx.y % groups) * HG;
  const int start = (int)*start_ptr, total = start + 1;
  const int per = (total + CS - 1) / CS;
  const int lo = min((int)rank * per, total), hi = min(lo + per, total);
  const int nch = (hi - lo + CH - 1) / CH;
  const bf16_t* kb = kc + kvh * stride_ch;
  const bf16_t* vb = vc + kvh * stride_ch;
  const int live = min(hi, start);  // old keys of this CTA: [lo, live)

  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // blocks a chunk needs: its keys and one more row (the value pass reads keys in pairs)
#define NEED(c) min(NB, (min(CH, hi - lo - (c) * CH) + BK) / BK)
  if (nch > 0) issue_chunk(kb, vb, lo, 0, live, NEED(0));
  asm volatile("griddepcontrol.wait;" ::: "memory");
  stamp(tr, slot, 1);

  float* qs = q_s();
  float* ps = p_s();
  float* st = st_s();  // m [HG], l [HG], alpha [HG], p of the new key [HG]
  const bool own_new = start >= lo && start < hi;
  for (int i = tid; i < HG * HD; i += NT) {
    const int h = i / HD, d = i % HD;
    qs[h * QROW + (d / DPT) * (DPT + 2) + d % DPT] = q[(size_t)h0 * HD + i] * scale;
  }
  if (own_new)
    for (int i = tid; i < 2 * HD; i += NT)
      kv_s()[i] = bf2f((i < HD ? kb : vb)[(size_t)start * HD + (i % HD)]);
  if (tid < HG) { st[tid] = -INFINITY; st[HG + tid] = 0.f; }
  float acc[HG];
#pragma unroll
  for (int h = 0; h < HG; ++h) acc[h] = 0.f;
  const int r_s = tid / KQ, qq = tid % KQ;   // score phase: key row in a block, dim slice
  const int d_v = tid % HD, ks = tid / HD;   // value phase: dim, key slice

  for (int c = 0; c < nch; ++c) {
    wait_groups<0>();
    __syncthreads();
    const int nk = min(CH, hi - lo - c * CH);  // keys of this chunk
    // scores, every key of the chunk at once: KQ threads a key, DPT dims each
#pragma unroll
    for (int blk = 0; blk < NB; ++blk) {
      if (blk * BK >= nk) break;  // the same for every thread of the CTA
      const unsigned char* kblk = smem + blk * STAGE;
      float s[HG];
#pragma unroll
      for (int h = 0; h < HG; ++h) s[h] = 0.f;
#pragma unroll
      for (int j = 0; j < DPT / 8; ++j) {
        const int ch = qq * (DPT / 8) + j;
        const uint4 w = *(const uint4*)(kblk + r_s * ROWB + ((ch ^ (r_s & 7)) * 16));
        const u32 wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float k0 = __uint_as_float(wv[e] << 16);
          const float k1 = __uint_as_float(wv[e] & 0xffff0000u);
#pragma unroll
          for (int h = 0; h < HG; ++h) {
            const float2 qv = *(const float2*)(qs + h * QROW + qq * (DPT + 2) + j * 8 + 2 * e);
            s[h] = fmaf(qv.x, k0, fmaf(qv.y, k1, s[h]));
          }
        }
      }
#pragma unroll
      for (int h = 0; h < HG; ++h)
#pragma unroll
        for (int o = KQ / 2; o; o >>= 1) s[h] += __shfl_xor_sync(0xffffffffu, s[h], o);
      const int n = blk * BK + r_s;
      const bool ok = lo + c * CH + n < live;
      if (qq == 0)
#pragma unroll
        for (int h = 0; h < HG; ++h) ps[h * CH + n] = ok ? s[h] : -INFINITY;
    }
    __syncthreads();
    // softmax over the chunk: one warp a head
    if (warp < HG) {
      float mb = -INFINITY;
      for (int n = lane; n < nk; n += 32) mb = fmaxf(mb, ps[warp * CH + n]);
      mb = warp_max(mb);
      const float m_old = st[warp], m_new = fmaxf(m_old, mb);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      float sum = 0.f;
      for (int n = lane; n < CH; n += 32) {
        const float p = n < nk ? __expf(ps[warp * CH + n] - m_use) : 0.f;
        ps[warp * CH + n] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = __expf(m_old - m_use);
        st[2 * HG + warp] = alpha;
        st[HG + warp] = st[HG + warp] * alpha + sum;
        st[warp] = m_new;
      }
    }
    __syncthreads();
    // values: this thread's dim over its slice of the chunk's keys, two sums a head
    float pa[HG], pb[HG];
#pragma unroll
    for (int h = 0; h < HG; ++h) pa[h] = pb[h] = 0.f;
    const int c8 = d_v >> 3, e8 = (d_v & 7) * 2;
    const int per_s = (((nk + KS - 1) / KS) + 1) & ~1;  // even: keys go in pairs
    const int n_end = min((ks + 1) * per_s, (nk + 1) & ~1);
#pragma unroll 4
    for (int n = ks * per_s; n < n_end; n += 2) {
      const int r0 = n % BK, r1 = (n + 1) % BK;
      const unsigned char* v0 = smem + (n / BK) * STAGE + BLKB + r0 * ROWB;
      const unsigned char* v1 = smem + ((n + 1) / BK) * STAGE + BLKB + r1 * ROWB;
      const float x0 = bf2f(*(const bf16_t*)(v0 + ((c8 ^ (r0 & 7)) * 16) + e8));
      const float x1 = bf2f(*(const bf16_t*)(v1 + ((c8 ^ (r1 & 7)) * 16) + e8));
#pragma unroll
      for (int h = 0; h < HG; ++h) {
        pa[h] = fmaf(ps[h * CH + n], x0, pa[h]);
        pb[h] = fmaf(ps[h * CH + n + 1], x1, pb[h]);
      }
    }
#pragma unroll
    for (int h = 0; h < HG; ++h) acc[h] = acc[h] * st[2 * HG + h] + pa[h] + pb[h];
    __syncthreads();  // the ring is free again
    if (c + 1 < nch) issue_chunk(kb, vb, lo, c + 1, live, NEED(c + 1));
  }
  // this step's own key, in the CTA whose range holds it
  if (own_new) {
    const float* kn = kv_s();
    if (warp < HG) {
      float s = 0.f;
      for (int d = lane; d < HD; d += 32)
        s = fmaf(qs[warp * QROW + (d / DPT) * (DPT + 2) + d % DPT], kn[d], s);
      s = warp_sum(s);
      if (lane == 0) {
        const float m_old = st[warp], m_new = fmaxf(m_old, s);
        const float alpha = __expf(m_old - m_new), p = __expf(s - m_new);
        st[2 * HG + warp] = alpha;
        st[3 * HG + warp] = p;
        st[HG + warp] = st[HG + warp] * alpha + p;
        st[warp] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < HG; ++h)
      acc[h] = acc[h] * st[2 * HG + h] + (ks == 0 ? st[3 * HG + h] * kv_s()[HD + d_v] : 0.f);
  }
  float* os = o_s();
#pragma unroll
  for (int h = 0; h < HG; ++h) os[(ks * HG + h) * HD + d_v] = acc[h];
  __syncthreads();
  if (ks == 0)
    for (int k2 = 1; k2 < KS; ++k2)
#pragma unroll
      for (int h = 0; h < HG; ++h) os[h * HD + d_v] += os[(k2 * HG + h) * HD + d_v];
  stamp(tr, slot, 2);
  cluster_sync();  // every CTA's (m, l, o) is final and visible to the cluster
  if (tid < NOUT) {
    const int idx = rank * NOUT + tid, h = idx / HD;
    float mr[CS];
#pragma unroll
    for (int r = 0; r < CS; ++r) mr[r] = ld_remote(st + h, r);
    float m_all = -INFINITY;
#pragma unroll
    for (int r = 0; r < CS; ++r) m_all = fmaxf(m_all, mr[r]);
    float l_all = 0.f, o_all = 0.f;
#pragma unroll
    for (int r = 0; r < CS; ++r) {
      const float w = mr[r] == -INFINITY ? 0.f : __expf(mr[r] - m_all);
      l_all = fmaf(w, ld_remote(st + HG + h, r), l_all);
      o_all = fmaf(w, ld_remote(os + idx, r), o_all);
    }
    out[(size_t)h0 * HD + idx] = f2bf(o_all / l_all);
  }
  cluster_sync();  // no CTA leaves while another still reads its shared memory
  stamp(tr, slot, 3);
}
