# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""The whole forward step in one persistent launch: every layer, chained by grid barriers.

Why: at batch size one the separate kernels of ``kernels.py`` stream the big matrices at 70-99 %
of copy bandwidth, yet the step reaches only about half the bandwidth floor, because each of its
170 launches pays 2.5-3 µs of fixed cost (launch, ramp-up, the dependent DRAM round trips of a
short kernel). Here one program per SM runs the step's phases in order:

    embed | per layer: qkv+RoPE+KV write | attention splits | combine | o-proj + residual
          | RMSNorm + gate/up + SiLU·up | down-proj + residual | final norm + output projection

separated by a grid-wide barrier (an atomic counter; every program is resident, the grid is at
most one program per SM, so spinning cannot deadlock). Before it waits at a barrier a program
asks L2 for the first weights of its share of the next phase, so DRAM keeps streaming through
the barrier instead of idling for a launch.

Work inside a phase is split into items (row blocks of a matrix, (kv head, split) pairs of the
attention) dealt round-robin to the programs; each item is computed by one program start to
finish, so results do not depend on the grid size (no atomics in the arithmetic: greedy decoding
is reproducible run to run).

The same kernel serves T = 1 (GEMV reductions) and T up to 32 (``tl.dot`` tiles; a verify step
reads every weight once for all T tokens). On the CPU, under ``TRITON_INTERPRET=1``, it runs
with a grid of one program, where every barrier passes at once: the tests check the arithmetic
against the reference forward that way; the barriers themselves are exercised on the GPU by
scripts/bench_gpu.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from openjarvis.engine.torch.kernels import (
    _attn_item,
    _combine_item,
    _linear_out,
    _tile_dot,
    _x_tile,
    block_t,
)
from openjarvis.engine.torch.weights import Weights

# GEMV modes (as kernels.py)
STORE, ADD, SWIGLU = 0, 1, 2


@dataclass(frozen=True, slots=True)
class MegaConfig:
    """Tiles of each phase, attention splits, the launch shape and the L2 prefetch.

    A program walks its share of a matrix ``bn_*`` rows at a time, ``bk`` (``bk_down`` for the
    down-projection, whose K is n_ff) columns per load. ``lines`` is how many 128-byte lines
    one prefetch instruction batch covers (0: no prefetch; the CPU interpreter cannot run the
    PTX); ``ahead`` how many row blocks ahead of its loads a program asks L2 for."""

    bn_qkv: int = 8  # NeoX pairs per block (2 * bn_qkv rows)
    bn_o: int = 8
    bn_gu: int = 4  # rows of gate and of up
    bn_down: int = 4
    bn_out: int = 8
    bk: int = 2048
    bk_down: int = 2048
    nsplit: int = 32
    block_s: int = 64
    num_warps: int = 8
    programs: int = 0  # 0: per_sm per SM, as many as fit resident (the GPU); 1 on the CPU
    per_sm: int = 1
    lines: int = 256
    ahead: int = 2

    def for_t(self, t: int) -> MegaConfig:
        """A verify step (T > 1) multiplies with ``tl.dot``, whose tiles need 16 rows."""
        if t == 1:
            return self
        return replace(self, bn_qkv=16, bn_o=32, bn_gu=32, bn_down=32, bn_out=64,
                       bk=min(self.bk, 128), bk_down=min(self.bk_down, 128),
                       num_warps=min(self.num_warps, 8))


@dataclass(slots=True)
class Stacked:
    """Every layer's matrix of one kind in one tensor ``[L, ...]``, so the kernel reaches layer
    ``i`` by pointer arithmetic. The per-layer tensors of ``Weights`` become views into these
    (no second copy of the weights)."""

    attn_norm: torch.Tensor  # [L, D]
    wqkv: torch.Tensor  # [L, QKV, D]
    bqkv: torch.Tensor  # [L, QKV]
    wo: torch.Tensor  # [L, D, QD]
    ffn_norm: torch.Tensor  # [L, D]
    w13: torch.Tensor  # [L, 2F, D]
    w2: torch.Tensor  # [L, D, F]


def stack_layers(w: Weights) -> Stacked:
    """Stack each kind of layer tensor once (idempotent: already-stacked weights are reused)."""
    names = ("attn_norm", "wqkv", "bqkv", "wo", "ffn_norm", "w13", "w2")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        parts = [getattr(lw, name) for lw in w.layers]
        base = parts[0]._base if parts[0]._base is not None else None
        n = len(parts)
        if (base is not None and base.dim() == parts[0].dim() + 1 and base.shape[0] == n
                and all(p.data_ptr() == base[i].data_ptr() for i, p in enumerate(parts))):
            out[name] = base
            continue
        big = torch.stack(parts)
        for i, lw in enumerate(w.layers):
            setattr(lw, name, big[i])  # the old per-layer tensor is freed with its last user
        out[name] = big
    return Stacked(**out)


# --- device helpers --------------------------------------------------------------------------


@triton.jit
def _sync(bar_ptr, n, NPROG: tl.constexpr):
    """Grid barrier number ``n`` (1, 2, ...) of this launch: the counter starts at 0 each step
    and every program adds 1 per barrier, so barrier n is passed when it reaches n * NPROG.
    Release on arrival publishes this program's stores; acquire while spinning makes every
    other program's stores visible to the loads after it."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    target = n * NPROG
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _now():
    """Nanoseconds of the GPU's global timer (tracing only)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _bar(bar_ptr, n, trace_ptr, pid, NPROG: tl.constexpr, TRACE: tl.constexpr):
    """``_sync``, recording (with TRACE) when this program arrived and when it left:
    trace [NPROG, barriers, 2] int64 nanoseconds."""
    if TRACE:
        tl.store(trace_ptr + (pid * 256 + n) * 2, _now())
    _sync(bar_ptr, n, NPROG)
    if TRACE:
        tl.store(trace_ptr + (pid * 256 + n) * 2 + 1, _now())


@triton.jit
def _prefetch(base, n_elems, LINES: tl.constexpr):
    """Ask L2 for the 128-byte lines of ``n_elems`` bf16/f16 weights at ``base``, ``LINES`` at
    a time (0: do nothing). Nothing waits on them: later loads find the lines in L2."""
    if LINES > 0:
        for off in range(0, n_elems, LINES * 64):
            offs = off + tl.arange(0, LINES) * 64
            ptrs = tl.where(offs < n_elems, base + offs, base)
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                      dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _share(n, pid, NPROG: tl.constexpr):
    """This program's contiguous share [lo, hi) of n rows: balanced within one row."""
    per = tl.cdiv(n, NPROG)
    lo = tl.minimum(pid * per, n)
    return lo, tl.minimum(lo + per, n)


@triton.jit
def _inv_rms(x_ptr, stride_x, T, K, eps, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / RMS of each of the T rows of x [T, K] (float32)."""
    rt = tl.arange(0, BLOCK_T)
    tmask = rt < T
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rt[:, None] * stride_x + rk[None, :],
                    mask=tmask[:, None] & (rk < K)[None, :], other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return tl.rsqrt(ss / K + eps)


@triton.jit
def _rows(x_ptr, stride_x, w_ptr, g_ptr, b_ptr, out_ptr, stride_out, inv, row0, row_hi, T, N, K,
          MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
          BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[:, rows] (=, +=, SwiGLU) (x · g · inv) @ W[rows]^T (+ b) for rows row0.. below
    row_hi; W [N or 2N, K]."""
    rn = row0 + tl.arange(0, BLOCK_N)
    rt = tl.arange(0, BLOCK_T)
    nmask = rn < row_hi
    tmask = rt < T
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)  # unused: the RMS comes in as ``inv``
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        wmask = nmask[:, None] & kmask[None, :]
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=wmask, other=0.0)
        if MODE == 2:
            w2 = tl.load(w_ptr + (rn[:, None] + N) * K + rk[None, :], mask=wmask, other=0.0)
        x, ss = _x_tile(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, ss, NORM)
        acc = _tile_dot(x, w, acc, BLOCK_T)
        if MODE == 2:
            acc2 = _tile_dot(x, w2, acc2, BLOCK_T)
    if NORM:  # the phase's 1/RMS, computed once per program (``inv``), not per row block
        acc = acc * inv[:, None]
        acc2 = acc2 * inv[:, None]
    _linear_out(acc, acc2, ss, rn, rt, nmask, tmask, b_ptr, out_ptr, stride_out, K, 0.0, 0,
                MODE, 2 if NORM else 0, BIAS, 1, "relaxed")


@triton.jit
def _gemv_phase(x_ptr, stride_x, w_ptr, g_ptr, b_ptr, out_ptr, stride_out, T, N, K, eps, pid,
                MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                NPROG: tl.constexpr, LINES: tl.constexpr, AHEAD: tl.constexpr):
    """This program's share of rows, BLOCK_N at a time; while it multiplies one block it asks
    L2 for the block AHEAD blocks later, so its loads wait on L2 rather than on DRAM."""
    inv = tl.zeros([BLOCK_T], dtype=tl.float32)
    if NORM:
        inv = _inv_rms(x_ptr, stride_x, T, K, eps, BLOCK_T, BLOCK_K)
    lo, hi = _share(N, pid, NPROG)
    if BLOCK_T == 1:
        _gemv_t1(x_ptr, w_ptr, g_ptr, b_ptr, out_ptr, inv, lo, hi, N, K, MODE, NORM, BIAS,
                 BLOCK_N, BLOCK_K, LINES, AHEAD, K <= BLOCK_K)
    else:
        for r0 in range(lo, hi, BLOCK_N):
            nxt = r0 + AHEAD * BLOCK_N
            _prefetch_w_rows(w_ptr, nxt, tl.minimum(nxt + BLOCK_N, hi), N, K, MODE, LINES)
            _rows(x_ptr, stride_x, w_ptr, g_ptr, b_ptr, out_ptr, stride_out, inv, r0, hi, T, N,
                  K, MODE, NORM, BIAS, BLOCK_T, BLOCK_N, BLOCK_K)


@triton.jit
def _row_out(y, y2, rn, hi, b_ptr, out_ptr, MODE: tl.constexpr, BIAS: tl.constexpr):
    """One token's epilogue for rows rn below hi: bias, then store, add into out (MODE 1) or
    SwiGLU of the gate y and the up y2 (MODE 2)."""
    nmask = rn < hi
    if BIAS:
        y += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    if MODE == 1:
        y += tl.load(out_ptr + rn, mask=nmask, other=0.0)
    if MODE == 2:
        y = y * tl.sigmoid(y) * y2
    tl.store(out_ptr + rn, y.to(out_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _gemv_t1_one(x_ptr, w_ptr, g_ptr, b_ptr, out_ptr, inv, lo, hi, N, K,
                 MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LINES: tl.constexpr,
                 AHEAD: tl.constexpr):
    """``_gemv_t1`` where K <= BLOCK_K: no element-wise accumulator (registers go to the
    tiles in flight instead), x and the norm weight loaded once for the whole share."""
    ar_n = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    kmask = rk < K
    x = tl.load(x_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
    if NORM:
        x = x * tl.load(g_ptr + rk, mask=kmask, other=0.0).to(tl.float32) * inv
    rn = lo + ar_n
    wm = (rn < hi)[:, None] & kmask[None, :]
    w_nxt = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=wm, other=0.0)
    w2_nxt = w_nxt
    if MODE == 2:
        w2_nxt = tl.load(w_ptr + (rn[:, None] + N) * K + rk[None, :], mask=wm, other=0.0)
    for r0 in range(lo, hi, BLOCK_N):
        w = w_nxt
        w2 = w2_nxt
        rn_j = r0 + BLOCK_N + ar_n
        wm_j = (rn_j < hi)[:, None] & kmask[None, :]
        w_nxt = tl.load(w_ptr + rn_j[:, None] * K + rk[None, :], mask=wm_j, other=0.0)
        if MODE == 2:
            w2_nxt = tl.load(w_ptr + (rn_j[:, None] + N) * K + rk[None, :], mask=wm_j,
                             other=0.0)
        nxt = r0 + AHEAD * BLOCK_N
        _prefetch_w_rows(w_ptr, nxt, tl.minimum(nxt + BLOCK_N, hi), N, K, MODE, LINES)
        y = tl.sum(x[None, :] * w.to(tl.float32), axis=1)
        y2 = y
        if MODE == 2:
            y2 = tl.sum(x[None, :] * w2.to(tl.float32), axis=1)
        _row_out(y, y2, r0 + ar_n, hi, b_ptr, out_ptr, MODE, BIAS)


@triton.jit
def _gemv_t1(x_ptr, w_ptr, g_ptr, b_ptr, out_ptr, inv, lo, hi, N, K,
             MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LINES: tl.constexpr,
             AHEAD: tl.constexpr, ONE_K: tl.constexpr):
    """One token: the share as a flat sequence of [BLOCK_N, BLOCK_K] weight tiles, each
    loaded one tile ahead of its use (a single resident program per SM has nothing else to
    hide a load behind), products accumulated element-wise and reduced once per row block."""
    if ONE_K:  # K fits one tile: x is loaded once, each row block is one tile and one sum
        _gemv_t1_one(x_ptr, w_ptr, g_ptr, b_ptr, out_ptr, inv, lo, hi, N, K, MODE, NORM, BIAS,
                     BLOCK_N, BLOCK_K, LINES, AHEAD)
        return
    n_kc = tl.cdiv(K, BLOCK_K)
    n_tiles = tl.cdiv(hi - lo, BLOCK_N) * n_kc
    ar_n = tl.arange(0, BLOCK_N)
    ar_k = tl.arange(0, BLOCK_K)
    # tile 0
    rn = lo + ar_n
    wm = (rn < hi)[:, None] & (ar_k < K)[None, :]  # an empty share masks everything
    w_nxt = tl.load(w_ptr + rn[:, None] * K + ar_k[None, :], mask=wm, other=0.0)
    w2_nxt = w_nxt
    if MODE == 2:
        w2_nxt = tl.load(w_ptr + (rn[:, None] + N) * K + ar_k[None, :], mask=wm, other=0.0)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for i in range(0, n_tiles):
        w = w_nxt
        w2 = w2_nxt
        rb = i // n_kc
        kc = i % n_kc
        # the next tile's loads go out before this tile is used
        j = i + 1
        rn_j = lo + (j // n_kc) * BLOCK_N + ar_n
        rk_j = (j % n_kc) * BLOCK_K + ar_k
        wm_j = (rn_j < hi)[:, None] & (rk_j < K)[None, :]  # past the last tile: rn_j >= hi
        w_nxt = tl.load(w_ptr + rn_j[:, None] * K + rk_j[None, :], mask=wm_j, other=0.0)
        if MODE == 2:
            w2_nxt = tl.load(w_ptr + (rn_j[:, None] + N) * K + rk_j[None, :], mask=wm_j,
                             other=0.0)
        if kc == 0:  # a new row block: ask L2 for the one AHEAD blocks later
            nxt = lo + (rb + AHEAD) * BLOCK_N
            _prefetch_w_rows(w_ptr, nxt, tl.minimum(nxt + BLOCK_N, hi), N, K, MODE, LINES)
        rk = kc * BLOCK_K + ar_k
        kmask = rk < K
        x = tl.load(x_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
        if NORM:
            x = x * tl.load(g_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
        acc += x[None, :] * w.to(tl.float32)
        if MODE == 2:
            acc2 += x[None, :] * w2.to(tl.float32)
        if kc == n_kc - 1:
            y = tl.sum(acc, axis=1)
            y2 = tl.sum(acc2, axis=1)
            if NORM:
                y = y * inv
                y2 = y2 * inv
            _row_out(y, y2, lo + rb * BLOCK_N + ar_n, hi, b_ptr, out_ptr, MODE, BIAS)
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)


@triton.jit
def _prefetch_w_rows(w_ptr, r0, r1, N, K, MODE: tl.constexpr, LINES: tl.constexpr):
    """L2 prefetch of rows [r0, r1) of W, and of the same rows of the up half for SwiGLU
    (MODE 2: W is [gate; up], N rows each); nothing for an empty range."""
    if r1 > r0:
        n_el = (r1 - r0) * K
        _prefetch(w_ptr + r0 * K, n_el, LINES)
        if MODE == 2:
            _prefetch(w_ptr + (N + r0) * K, n_el, LINES)


@triton.jit
def _prefetch_rows(w_ptr, N, K, pid, MODE: tl.constexpr, BLOCK_N: tl.constexpr,
                   NPROG: tl.constexpr, LINES: tl.constexpr, AHEAD: tl.constexpr):
    """Before a barrier: L2 prefetch of the first AHEAD blocks of this program's share of the
    next phase's W (both halves for SwiGLU)."""
    lo, hi = _share(N, pid, NPROG)
    _prefetch_w_rows(w_ptr, lo, tl.minimum(lo + AHEAD * BLOCK_N, hi), N, K, MODE, LINES)


@triton.jit
def _prefetch_qkv(w_ptr, D, pid, N_HEAD: tl.constexpr, N_KV: tl.constexpr, HD: tl.constexpr,
                  NPROG: tl.constexpr, LINES: tl.constexpr):
    """L2 prefetch of this program's whole qkv share (it is small): the rows of its pairs."""
    HALF: tl.constexpr = HD // 2
    lo, hi = _share((N_HEAD + 2 * N_KV) * HALF, pid, NPROG)
    h_lo = lo // HALF
    h_hi = (hi + HALF - 1) // HALF
    for head in range(h_lo, h_hi):
        j_lo = tl.maximum(lo - head * HALF, 0)
        j_hi = tl.minimum(hi - head * HALF, HALF)
        if j_hi > j_lo:
            _prefetch(w_ptr + (head * HD + j_lo) * D, (j_hi - j_lo) * D, LINES)
            _prefetch(w_ptr + (head * HD + HALF + j_lo) * D, (j_hi - j_lo) * D, LINES)


@triton.jit
def _qkv_phase(h_ptr, D, w_ptr, g_ptr, b_ptr, rope_ptr, start, q_ptr, kc_ptr, vc_ptr,
               stride_ch, stride_cs, T, eps, pid,
               N_HEAD: tl.constexpr, N_KV: tl.constexpr, HD: tl.constexpr,
               BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
               NPROG: tl.constexpr):
    """This program's share of the NeoX pairs (rows j and j + HD/2 of a head of q, k or v),
    BLOCK_P at a time: RMSNorm(h) @ W^T + b, RoPE on q and k, q to scratch, k and v into the
    cache at their positions."""
    HALF: tl.constexpr = HD // 2
    inv = _inv_rms(h_ptr, D, T, D, eps, BLOCK_T, BLOCK_K)
    rt = tl.arange(0, BLOCK_T)
    tmask = rt < T
    pos = start + rt
    lo, hi = _share((N_HEAD + 2 * N_KV) * HALF, pid, NPROG)
    for p0 in range(lo, hi, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)  # global pair index
        pmask = p < hi
        head = p // HALF
        j = p % HALF
        r1 = head * HD + j
        r2 = r1 + HALF
        acc1 = tl.zeros([BLOCK_T, BLOCK_P], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_T, BLOCK_P], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            kmask = rk < D
            wm = pmask[:, None] & kmask[None, :]
            w1 = tl.load(w_ptr + r1[:, None] * D + rk[None, :], mask=wm, other=0.0)
            w2 = tl.load(w_ptr + r2[:, None] * D + rk[None, :], mask=wm, other=0.0)
            x = tl.load(h_ptr + rt[:, None] * D + rk[None, :],
                        mask=tmask[:, None] & kmask[None, :], other=0.0)
            x = x * tl.load(g_ptr + rk, mask=kmask, other=0.0).to(tl.float32)[None, :]
            acc1 = _tile_dot(x, w1, acc1, BLOCK_T)
            acc2 = _tile_dot(x, w2, acc2, BLOCK_T)
        acc1 = acc1 * inv[:, None] + tl.load(b_ptr + r1, mask=pmask, other=0.0).to(tl.float32)[None, :]
        acc2 = acc2 * inv[:, None] + tl.load(b_ptr + r2, mask=pmask, other=0.0).to(tl.float32)[None, :]
        cs = rope_ptr + pos[:, None] * HD + 2 * j[None, :]  # table [n_pos, HD/2, (cos, sin)]
        m = tmask[:, None] & pmask[None, :]
        cos = tl.load(cs, mask=m, other=1.0)
        sin = tl.load(cs + 1, mask=m, other=0.0)
        is_rope = (head < N_HEAD + N_KV)[None, :]
        o1 = tl.where(is_rope, acc1 * cos - acc2 * sin, acc1)
        o2 = tl.where(is_rope, acc2 * cos + acc1 * sin, acc2)
        is_q = (head < N_HEAD)[None, :]
        is_k = ((head >= N_HEAD) & (head < N_HEAD + N_KV))[None, :]
        is_v = (head >= N_HEAD + N_KV)[None, :]
        qp = q_ptr + rt[:, None] * (N_HEAD * HD) + (head * HD + j)[None, :]  # q [T, H, HD]
        tl.store(qp, o1, mask=m & is_q)
        tl.store(qp + HALF, o2, mask=m & is_q)
        kvh = tl.where(head >= N_HEAD + N_KV, head - N_HEAD - N_KV, head - N_HEAD)
        kvh = tl.where(head < N_HEAD, 0, kvh)[None, :]
        off = kvh * stride_ch + pos[:, None] * stride_cs + j[None, :]
        tl.store(kc_ptr + off, o1.to(kc_ptr.dtype.element_ty), mask=m & is_k)
        tl.store(kc_ptr + off + HALF, o2.to(kc_ptr.dtype.element_ty), mask=m & is_k)
        tl.store(vc_ptr + off, o1.to(vc_ptr.dtype.element_ty), mask=m & is_v)
        tl.store(vc_ptr + off + HALF, o2.to(vc_ptr.dtype.element_ty), mask=m & is_v)


@triton.jit
def _attn_phase(q_ptr, kc_ptr, vc_ptr, start, o_ptr, ml_ptr, T, stride_ch, stride_cs, scale, pid,
                N_HEAD: tl.constexpr, N_KV: tl.constexpr, HD: tl.constexpr,
                NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
                NPROG: tl.constexpr):
    """Items = (kv head, split of the sequence), as ``kernels._attn_split_kernel``'s programs."""
    for item in range(pid, N_KV * NSPLIT, NPROG):
        _attn_item(q_ptr, kc_ptr, vc_ptr, start, o_ptr, ml_ptr, T, item // NSPLIT, item % NSPLIT,
                   stride_ch, stride_cs, scale, N_HEAD, N_HEAD // N_KV, HD, NSPLIT, BLOCK_R, BLOCK_S,
                   0, False)


@triton.jit
def _combine_phase(o_ptr, ml_ptr, out_ptr, T, pid,
                   N_HEAD: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr,
                   NPROG: tl.constexpr):
    """Items = (token, head): merge the splits (``kernels._combine_item``)."""
    for item in range(pid, T * N_HEAD, NPROG):
        _combine_item(o_ptr, ml_ptr, out_ptr, T, item, NSPLIT, N_HEAD, HD, NSPLIT)


@triton.jit
def _step_kernel(
    inp_ptr, emb_ptr, n1_ptr, wqkv_ptr, bqkv_ptr, wo_ptr, n2_ptr, w13_ptr, w2_ptr, nf_ptr,
    wout_ptr, rope_ptr, kc_ptr, vc_ptr,
    h_ptr, q_ptr, op_ptr, ml_ptr, attn_ptr, act_ptr, logits_ptr, bar_ptr, trace_ptr,
    T, n_layer, V, stride_cl, stride_ch, stride_cs, eps, scale,
    D: tl.constexpr, F: tl.constexpr, N_HEAD: tl.constexpr, N_KV: tl.constexpr,
    HD: tl.constexpr, BLOCK_T: tl.constexpr,
    BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DOWN: tl.constexpr,
    BN_OUT: tl.constexpr, BK: tl.constexpr, BK_DOWN: tl.constexpr, NSPLIT: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, NPROG: tl.constexpr, LINES: tl.constexpr,
    AHEAD: tl.constexpr, TRACE: tl.constexpr,
):
    QD: tl.constexpr = N_HEAD * HD
    QKV: tl.constexpr = (N_HEAD + 2 * N_KV) * HD
    pid = tl.program_id(0)
    start = tl.load(inp_ptr)
    nb = 0
    if TRACE:
        tl.store(trace_ptr + pid * 512 + 1, _now())
    # embed: h [T, D] float32 = rows of the embedding table
    for item in range(pid, T * tl.cdiv(D, BK), NPROG):
        t = item // tl.cdiv(D, BK)
        d = (item % tl.cdiv(D, BK)) * BK + tl.arange(0, BK)
        tok = tl.load(inp_ptr + 1 + t)
        row = tl.load(emb_ptr + tok * D + d, mask=d < D, other=0.0)
        tl.store(h_ptr + t * D + d, row.to(tl.float32), mask=d < D)
    _prefetch_qkv(wqkv_ptr, D, pid, N_HEAD, N_KV, HD, NPROG, LINES)
    nb += 1
    _bar(bar_ptr, nb, trace_ptr, pid, NPROG, TRACE)
    for layer32 in range(n_layer):
        layer = tl.cast(layer32, tl.int64)  # offsets into [L, ...] tensors pass 2**31 on big models
        kc = kc_ptr + layer * stride_cl
        vc = vc_ptr + layer * stride_cl
        wqkv = wqkv_ptr + layer * QKV * D
        wo = wo_ptr + layer * D * QD
        w13 = w13_ptr + layer * 2 * F * D
        w2 = w2_ptr + layer * D * F
        _qkv_phase(h_ptr, D, wqkv, n1_ptr + layer * D, bqkv_ptr + layer * QKV, rope_ptr, start,
                   q_ptr, kc, vc, stride_ch, stride_cs, T, eps, pid,
                   N_HEAD, N_KV, HD, BLOCK_T, BN_QKV, BK, NPROG)
        nb += 1
        _bar(bar_ptr, nb, trace_ptr, pid, NPROG, TRACE)
        _attn_phase(q_ptr, kc, vc, start, op_ptr, ml_ptr, T, stride_ch, stride_cs, scale, pid,
                    N_HEAD, N_KV, HD, NSPLIT, BLOCK_R, BLOCK_S, NPROG)
        _prefetch_rows(wo, D, QD, pid, 0, BN_O, NPROG, LINES, AHEAD)
        nb += 1
        _bar(bar_ptr, nb, trace_ptr, pid, NPROG, TRACE)
        _combine_phase(op_ptr, ml_ptr, attn_ptr, T, pid, N_HEAD, HD, NSPLIT, NPROG)
        nb += 1
        _bar(bar_ptr, nb, trace_ptr, pid, NPROG, TRACE)
        _gemv_phase(attn_ptr, QD, wo, wo, wo, h_ptr, D, T, D, QD, eps, pid,
                    1, False, False, BLOCK_T, BN_O, BK, NPROG, LINES, AHEAD)
        _prefetch_rows(w13, F, D, pid, 2, BN_GU, NPROG, LINES, AHEAD)
        nb += 1
        _bar(bar_ptr, nb, trace_ptr, pid, NPROG, TRACE)
        _gemv_phase(h_ptr, D, w13, n2_ptr + layer * D, w13, act_ptr, F, T, F, D, eps, pid,
                    2, True, False, BLOCK_T, BN_GU, BK, NPROG, LINES, AHEAD)
        _prefetch_rows(w2, D, F, pid, 0, BN_DOWN, NPROG, LINES, AHEAD)
        nb += 1
        _bar(bar_ptr, nb, trace_ptr, pid, NPROG, TRACE)
        _gemv_phase(act_ptr, F, w2, w2, w2, h_ptr, D, T, D, F, eps, pid,
                    1, False, False, BLOCK_T, BN_DOWN, BK_DOWN, NPROG, LINES, AHEAD)
        if layer32 + 1 < n_layer:
            _prefetch_qkv(wqkv + QKV * D, D, pid, N_HEAD, N_KV, HD, NPROG, LINES)
        else:
            _prefetch_rows(wout_ptr, V, D, pid, 0, BN_OUT, NPROG, LINES, AHEAD)
        nb += 1
        _bar(bar_ptr, nb, trace_ptr, pid, NPROG, TRACE)
    _gemv_phase(h_ptr, D, wout_ptr, nf_ptr, wout_ptr, logits_ptr, V, T, V, D, eps, pid,
                0, True, False, BLOCK_T, BN_OUT, BK, NPROG, LINES, AHEAD)
    if TRACE:
        tl.store(trace_ptr + (pid * 256 + nb + 1) * 2, _now())


@dataclass(slots=True)
class Scratch:
    """Per-T buffers the step writes; ``logits`` is what it leaves behind."""

    h: torch.Tensor  # [T, D] float32
    q: torch.Tensor  # [T, H, hd] float32
    o_part: torch.Tensor  # [NSPLIT, T, H, hd] float32
    ml_part: torch.Tensor  # [NSPLIT, T, H, 2] float32
    attn: torch.Tensor  # [T, q_dim] float32
    act: torch.Tensor  # [T, F] float32
    logits: torch.Tensor  # [T, V] float32
    bar: torch.Tensor  # [1] int32 barrier counter, zeroed before each launch
    programs: int = 0  # the launch's grid, fixed at the first step (0: not yet)


def scratch(args, t: int, nsplit: int, device: torch.device | str) -> Scratch:  # noqa: ANN001
    f32 = torch.float32
    a = args
    return Scratch(
        h=torch.empty(t, a.n_embd, dtype=f32, device=device),
        q=torch.empty(t, a.n_head, a.head_dim, dtype=f32, device=device),
        o_part=torch.empty(nsplit, t, a.n_head, a.head_dim, dtype=f32, device=device),
        ml_part=torch.empty(nsplit, t, a.n_head, 2, dtype=f32, device=device),
        attn=torch.empty(t, a.q_dim, dtype=f32, device=device),
        act=torch.empty(t, a.n_ff, dtype=f32, device=device),
        logits=torch.empty(t, a.n_vocab, dtype=f32, device=device),
        bar=torch.zeros(1, dtype=torch.int32, device=device),
    )


def programs_for(device: torch.device, cfg: MegaConfig) -> int:
    """Programs of the launch before occupancy is known: ``per_sm`` per SM (1 on the CPU)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return cfg.programs if cfg.programs > 0 else sms * cfg.per_sm


def resident_per_sm(compiled: object, device: torch.device) -> int:
    """How many programs of a compiled kernel one SM holds at once (registers, shared memory,
    warps): the grid barrier spins forever unless every program is resident."""
    props = torch.cuda.get_device_properties(device)
    regs_sm = int(getattr(props, "regs_per_multiprocessor", 65536))
    threads_sm = int(getattr(props, "max_threads_per_multi_processor", 2048))
    smem_sm = int(getattr(props, "shared_memory_per_multiprocessor", 233472))
    compiled._init_handles()  # type: ignore[attr-defined]  # loads the binary: n_regs is set
    md = compiled.metadata  # type: ignore[attr-defined]
    warps = int(md.num_warps)
    n_regs = max(1, int(compiled.n_regs))  # type: ignore[attr-defined]
    per_warp = -(-n_regs * 32 // 256) * 256
    by_regs = regs_sm // (per_warp * warps)
    by_threads = threads_sm // (32 * warps)
    by_smem = smem_sm // (int(md.shared) + 1024)
    return max(0, min(by_regs, by_threads, by_smem, 32))


def step(
    args,  # noqa: ANN001  ModelArgs
    weights: Weights,
    stacked: Stacked,
    rope: torch.Tensor,  # [n_pos, hd/2, 2]
    k_cache: torch.Tensor,  # [L, Hkv, S, hd]
    v_cache: torch.Tensor,
    inputs: torch.Tensor,  # [1 + T] int64: start, tokens
    s: Scratch,
    cfg: MegaConfig,
    trace: torch.Tensor | None = None,  # [programs, 256, 2] int64: barrier arrival/exit ns
) -> torch.Tensor:
    """Run one step of ``T = inputs.numel() - 1`` tokens; returns ``s.logits [T, V]``."""
    t = inputs.numel() - 1
    c = cfg.for_t(t)
    on_gpu = inputs.device.type == "cuda"
    nprog = programs_for(inputs.device, c)
    a = args
    if trace is not None and (trace.shape[1] < 1 + 6 * a.n_layer + 2 or not on_gpu):
        raise ValueError("a trace needs the GPU and room for every barrier")
    if s.o_part.shape[0] != c.nsplit:
        raise ValueError("scratch was made for another number of attention splits")
    kwargs = dict(
        D=a.n_embd, F=a.n_ff, N_HEAD=a.n_head, N_KV=a.n_head_kv, HD=a.head_dim,
        BLOCK_T=block_t(t), BN_QKV=c.bn_qkv, BN_O=c.bn_o, BN_GU=c.bn_gu, BN_DOWN=c.bn_down,
        BN_OUT=c.bn_out, BK=min(c.bk, triton.next_power_of_2(max(a.n_embd, a.q_dim))),
        BK_DOWN=min(c.bk_down, triton.next_power_of_2(a.n_ff)), NSPLIT=c.nsplit,
        BLOCK_S=c.block_s, BLOCK_R=max(16, triton.next_power_of_2(t * a.group)),
        LINES=c.lines if on_gpu else 0, AHEAD=c.ahead, TRACE=trace is not None,
        num_warps=c.num_warps,
    )
    args_ = (
        inputs, weights.tok_emb, stacked.attn_norm, stacked.wqkv, stacked.bqkv, stacked.wo,
        stacked.ffn_norm, stacked.w13, stacked.w2, weights.out_norm, weights.out, rope,
        k_cache, v_cache,
        s.h, s.q, s.o_part, s.ml_part, s.attn, s.act, s.logits, s.bar,
        trace if trace is not None else s.bar,
        t, a.n_layer, a.n_vocab, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        a.rms_eps, a.head_dim**-0.5,
    )
    if s.programs == 0:
        programs = nprog
        if on_gpu and c.programs == 0:  # the most programs per SM that stay resident
            sms = nprog // c.per_sm
            for m in range(c.per_sm, 0, -1):
                compiled = _step_kernel.warmup(*args_, NPROG=sms * m, grid=(sms * m,), **kwargs)
                if resident_per_sm(compiled, inputs.device) >= m:
                    programs = sms * m
                    break
            else:
                raise RuntimeError("the single-launch step does not fit one program per SM")
        s.programs = programs  # only once known to be resident: a partial grid never returns
    if trace is not None and trace.shape[0] < s.programs:
        raise ValueError("the trace needs a row per program")
    s.bar.zero_()
    _step_kernel[(s.programs,)](*args_, NPROG=s.programs, **kwargs)
    return s.logits
