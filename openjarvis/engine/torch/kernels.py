# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Triton kernels for the batch-size-one path, and their launchers.

At batch size one every weight is read once per step, so each kernel is a pass over a weight
matrix with everything around it fused in (per layer, 6 launches):

    qkv_rope      RMSNorm(h) @ Wqkv^T + b, RoPE on q and k, k and v written into the cache
    attn_split    flash-decoding: grid (kv head, split of the sequence), all query heads of the
                  group and all T query tokens in one tile; length read from a device scalar
    attn_combine  merge the splits' (max, sum, partial output)
    linear        o-proj  + residual add into h (in place)
    linear        RMSNorm(h) @ W13^T, SiLU(gate) * up
    linear        down-proj + residual add into h

The same kernels serve T = 1 (a reduction over K per row: a GEMV) and T up to 32 (``tl.dot`` on
a padded [BLOCK_T, BLOCK_K] tile: a verify step reads the weights once for all T tokens).
Everything reads positions from ``start`` on the device, so one CUDA graph per T serves every
position. Optional, measured in docs/gpu-notes.md: split-K with (relaxed) float atomics for the
residual GEMVs (tiles in ``tuning.py``), programmatic dependent launch (``pdl``), for T = 1
``attention_out`` merging the splits inside the o-projection, and ``NormHandoff`` (the
o-projection normalizing for gate/up; on by default for the shapes in ``tuning.NORM_HANDOFF``
and, serially from a split-K o-projection in verify steps, ``tuning.VERIFY_HANDOFF``). Run on
the CPU under ``TRITON_INTERPRET=1`` for tests (float32; the interpreter's bf16 ``tl.dot`` is
wrong, so bf16 is checked on the GPU by scripts/bench_gpu.py).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

# Linear modes
STORE, ADD, SWIGLU, ARGMAX = 0, 1, 2, 3
#: Memory semantics a split-K partial's float atomic may take. The partials need no order of
#: their own: a sum is read either after the kernel that adds it ends, or, in a serial
#: hand-off (``_serial_hand_off``), after a block barrier and an acq_rel count that order them.
#: So "relaxed" (the default) rather than Triton's own default "acq_rel", whose fences cost
#: (session 9 run 83: one-token steps -0.9 to -2.2 %, k = 16 verify -4 to -7 %).
ATOMIC_SEMS = ("relaxed", "acq_rel")
#: Added to a PDL mode (1 or 2; 3 in tests): the kernel lets its successor launch after its
#: main loop (``_gdc_late``) instead of at its start.
PDL_LATE = 4
#: Added to a PDL mode (1 or 2) instead of ``PDL_LATE`` (not with it): the kernel lets its
#: successor launch right after its PDL wait, so the successor's programs are resident as this
#: kernel starts its main loop, not before and not after. It paid for the verify merge, whose
#: successor (the o-projection) has a few hundred programs and no weight prologue (session 17
#: runs 166-167); every one-token kernel tried this way lost (runs 166, 168).
PDL_AFTER_WAIT = 8


@dataclass(frozen=True, slots=True)
class LinearConfig:
    """Tile sizes of one linear launch; ``block_t`` 1 picks the GEMV reduction, >= 16 ``tl.dot``."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2
    split_k: int = 1  # > 1 only for ADD: partial sums land in ``out`` with float atomics
    #: T > 1: the weight tile is the MMA's M operand (W [BN, BK] @ x^T), so the few tokens pad
    #: N (16) rather than M, and a 64- or 128-row weight tile fills Hopper's MMA shape.
    swap: bool = False
    #: T = 1: x read in the weight tile's layout, one copy a row, and the sums kept per row
    #: until after the K loop, so with at least a row a warp the loop has no block barrier
    #: (``_linear_kernel``'s ROWS; with fewer rows a row's sum still spans warps).
    rows: bool = False
    #: With ``rows``: load the next K tile's weights into registers before this one is
    #: reduced, so a program keeps two tiles of loads in flight.
    prefetch: bool = False
    #: With ``rows``: each weight row of a K tile read as this many segments, each a row of
    #: the load ([block_n * segments, block_k / segments]), so that with block_k / segments =
    #: 256 bfloat16 columns (what a warp's 32 threads hold in 16-byte loads) rows wider than
    #: a warp reduce without a block barrier too.
    segments: int = 1
    #: With ``rows``: each K tile's products summed only within a thread (its 8-column vector
    #: and its repeats along the row), into one partial a lane; the lanes of a row are summed
    #: once, after the loop. The default sums each tile across the warp's 32 lanes (5 shuffles
    #: a row and matrix, 20 a tile for gate/up), and the next tile's loads wait behind them.
    #: (With the norm in the loop, its squares are still summed across the warp every tile;
    #: the 1.5B's gate/up reads the norm hand-off, so its loop has no shuffle left.)
    lanes: bool = False

    def __post_init__(self) -> None:
        if self.prefetch and not self.rows:
            raise ValueError("prefetch needs rows=True (the row-layout loop carries the tile)")
        if self.segments != 1 and not (
                self.rows and self.segments > 0 and self.block_k % self.segments == 0
                and (self.segments & (self.segments - 1)) == 0):
            raise ValueError(f"segments={self.segments} needs rows=True and a power of two "
                             f"that divides block_k ({self.block_k})")
        if self.lanes and not (self.rows and (self.block_k // self.segments) % 256 == 0):
            raise ValueError("lanes needs rows=True and segments of a multiple of 256 columns "
                             "(32 lanes of 8)")


@dataclass(frozen=True, slots=True)
class NormHandoff:
    """An RMSNorm handed from the kernel that writes a residual to the product that reads it
    (the o-projection to gate/up): the producer, whose programs each own whole columns of the
    new residual, writes ``xg = h * weight`` and each program's sum of squares into its slot of
    ``ss_part``; the consumer reads ``xg`` as its input and sums the slots for 1/RMS, so its K
    loop does no norm work (session 8 run 77: that work costs the 1.5B's one-token gate/up 1.6
    of its 17 us a layer). One-token steps keep ``xg`` float32: as bfloat16 it was slower for
    the 0.5B and rounded x * g (run 78); verify steps' gate/up rounds x * g to bfloat16 for its
    MMA anyway, so there it is bfloat16.

    A split-K producer (verify steps: its o-projection needs the splits' parallelism, run 79)
    hands off serially: each split adds its partial, then counts itself in at ``count`` (one
    int32 a column block, zero between launches); the last to arrive reads the finished columns
    back and writes the slot, and resets the count (the last-block pattern of CUDA's
    threadFenceReduction sample, ordered as CUTLASS's semaphore orders its split-K)."""

    xg: torch.Tensor  # [T, K] float32 or the weights' dtype
    ss_part: torch.Tensor  # [T, producer programs] float32
    weight: torch.Tensor  # [K] the norm's weight
    count: torch.Tensor | None = None  # [producer programs] int32 zeros: split-K producers


def block_t(t: int) -> int:
    return 1 if t == 1 else max(16, triton.next_power_of_2(t))


def default_linear_config(t: int, n: int, k: int, on_gpu: bool = True) -> LinearConfig:
    """A reasonable tile without tuning: enough programs to cover the SMs several times (on the
    CPU, in the interpreter, few large programs: each program costs Python time there)."""
    if not on_gpu:
        return LinearConfig(min(64, triton.next_power_of_2(n)), min(128, triton.next_power_of_2(k)))
    if t == 1:
        bn = 4 if n <= 2048 else 8 if n <= 16384 else 16
        return LinearConfig(bn, min(512, triton.next_power_of_2(k)))
    return LinearConfig(32, min(128, triton.next_power_of_2(k)), num_warps=4)


@triton.jit
def _tile_dot(x, w, acc, BLOCK_T: tl.constexpr):
    """acc [BT, BN] += x [BT, BK] . w [BN, BK]^T (float32 accumulate)."""
    if BLOCK_T == 1:
        res = acc + tl.sum(x * w.to(tl.float32), axis=1)[None, :]
    else:
        res = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    return res


@triton.jit
def _gdc(PDL: tl.constexpr):
    """Programmatic dependent launch: let the next kernel start its prologue (here, unless
    ``PDL_LATE`` moves that to ``_gdc_late``), then wait until the previous kernel has finished
    and its writes are visible. Everything before this point may read only what no kernel of
    the step writes: weights, the RoPE table, and ``start`` (the host writes it before the
    step's graph runs). ``PDL_AFTER_WAIT``: the next kernel is let go just after the wait."""
    if PDL % 4 == 1 or PDL % 4 == 2:
        if PDL < 4:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
        if PDL >= 8:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _gdc_late(PDL: tl.constexpr):
    """``PDL_LATE``: let the next kernel launch only once every program is past its main loop,
    so its waiting programs never hold SM slots that this kernel's later programs need."""
    if PDL == 5 or PDL == 6:
        tl.extra.cuda.gdc_launch_dependents()


#: A traced program's record (``_stamp``, which writes these two as literals): four timer
#: stamps, then the SM it ran on.
TRACE_WIDTH = 5
TRACE_SM = 4


@triton.jit
def _stamp(tr_ptr, tr_base, pid, e, TRACE: tl.constexpr):
    """Tracing only (``TRACE`` programs a launch recorded, 0: off): event ``e`` of program
    ``pid`` stamped with the GPU's global timer (ns) into record ``tr_base + pid``: 0 entry,
    1 past the PDL wait, 2 past the main loop, 3 done (scripts/trace_step.py); at entry the
    record's ``TRACE_SM`` slot also takes the SM the program runs on, because how a launch's
    programs spread over the SMs is what an early launch changes and the timer cannot show."""
    if TRACE > 0:
        if pid < TRACE:
            t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                          is_pure=False, pack=1)
            tl.store(tr_ptr + (tr_base + pid) * 5 + e, t)
            if e == 0:
                sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                               is_pure=False, pack=1)
                tl.store(tr_ptr + (tr_base + pid) * 5 + 4, sm.to(tl.int64))


@triton.jit
def _x_tile(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, ss, NORM: tl.constexpr):
    """x [BT, BK] as float32; with NORM, its squares added to ``ss`` (the RMS statistics) and
    the tile multiplied by the norm weight g [BK]."""
    x = tl.load(x_ptr + rt[:, None] * stride_x + rk[None, :],
                mask=tmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
    if NORM:
        ss += tl.sum(x * x, axis=1)
        x = x * tl.load(g_ptr + rk, mask=kmask, other=0.0).to(tl.float32)[None, :]
    return x, ss


@triton.jit
def _seg_cols(k0, k_hi, soff, sc, SEG: tl.constexpr):
    """``LinearConfig.rows``: the columns of a K tile at ``k0`` for each tile row (its segment's
    offset ``soff`` plus ``sc``), and which are inside the split; one shared row of columns
    ([1, BK], broadcast later) where the tile is not segmented."""
    if SEG == 1:
        cols = k0 + sc[None, :]
    else:
        cols = k0 + soff[:, None] + sc[None, :]
    return cols, cols < k_hi


@triton.jit
def _x_rows(x_ptr, g_ptr, sr, cols, cmask, sv, NORM: tl.constexpr):
    """T = 1, ``LinearConfig.rows``: x read once for each row of the weight tile (the pointers
    broadcast, so the load takes the weight tile's layout), as float32; with NORM, each row's
    sum of squares added to ``sv`` and the tile multiplied by the norm weight (read the same
    way)."""
    rows = 0 * sr[:, None]
    m = (rows == 0) & cmask  # (all true down the rows: the column mask broadcast to the tile)
    x = tl.load(x_ptr + cols + rows, mask=m, other=0.0).to(tl.float32)
    if NORM:
        sv += tl.sum(x * x, axis=1)
        x = x * tl.load(g_ptr + cols + rows, mask=m, other=0.0).to(tl.float32)
    return x, sv


@triton.jit
def _seg_tile(w_ptr, srow, smask, k0, k_hi, soff, sc, N, K, SEG: tl.constexpr,
              MODE: tl.constexpr, EVICT: tl.constexpr):
    """T = 1, ``LinearConfig.rows``: K tile ``k0``'s columns, their mask and weights."""
    cols, cmask = _seg_cols(k0, k_hi, soff, sc, SEG)
    w, w2 = _w_pair(w_ptr, srow, cols, smask[:, None] & cmask, N, K, MODE, EVICT)
    return cols, cmask, w, w2


@triton.jit
def _lane_sum(p, LANES: tl.constexpr):
    """A tile's row sums [R] (``LANES`` 0), or each row's partial a lane [R, 32] (1): the
    tile [R, W] viewed as [R, W / 256, 32, 8], 8 consecutive columns a thread."""
    if LANES:
        out = tl.sum(tl.sum(tl.reshape(p, [p.shape[0], p.shape[1] // 256, 32, 8]), axis=3),
                     axis=1)
    else:
        out = tl.sum(p, axis=1)
    return out


@triton.jit
def _row_step(x_ptr, g_ptr, sr, cols, cmask, w, w2, av, av2, sv, MODE: tl.constexpr,
              NORM: tl.constexpr, LANES: tl.constexpr = 0):
    """T = 1, ``LinearConfig.rows``: one K tile's products added to the per-row sums (with
    ``LANES``, to each row's partials a lane: ``LinearConfig.lanes``)."""
    xb, sv = _x_rows(x_ptr, g_ptr, sr, cols, cmask, sv, NORM)
    av += _lane_sum(xb * w.to(tl.float32), LANES)
    if MODE == 2:
        av2 += _lane_sum(xb * w2.to(tl.float32), LANES)
    return av, av2, sv


@triton.jit
def _load_w(ptrs, mask, EVICT: tl.constexpr):
    """A load of weights with their cache policy (``_w_tile`` says which), masked lanes 0."""
    if EVICT == ".cg":  # (a constexpr branch: only the taken one compiles)
        w = tl.load(ptrs, mask=mask, other=0, cache_modifier=EVICT)
    else:
        w = tl.load(ptrs, mask=mask, other=0, eviction_policy=EVICT)
    return w


@triton.jit
def _w_tile(w_ptr, rn, row0, cols, wmask, K, EVICT: tl.constexpr):
    """Rows ``row0 + rn`` of W [*, K], columns ``cols`` ([1, BK], or a row's own for each row):
    a [BN, BK] weight tile (``row0`` N for the up half of a SwiGLU pair), loaded with the
    weights' cache policy: an eviction policy ("", "evict_first": L1 and L2), or ".cg" (L2
    only, so the streamed weights take no L1 lines from the activations every row of a program
    reads again; session 20 run 190: one-token steps 1-5 % slower than "evict_first", as
    with no hint: the L2 hint is what pays)."""
    return _load_w(w_ptr + (rn[:, None] + row0) * K + cols, wmask, EVICT)


@triton.jit
def _w_pair(w_ptr, rn, cols, wmask, N, K, MODE: tl.constexpr, EVICT: tl.constexpr):
    """``_w_tile`` and, for SwiGLU (MODE 2), its up half N rows on; otherwise the tile twice."""
    w = _w_tile(w_ptr, rn, 0, cols, wmask, K, EVICT)
    w2 = w
    if MODE == 2:
        w2 = _w_tile(w_ptr, rn, N, cols, wmask, K, EVICT)
    return w, w2


@triton.jit
def _lin_step(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, w, w2, acc, acc2, ss,
              MODE: tl.constexpr, NORM: tl.constexpr, BLOCK_T: tl.constexpr):
    """One K tile: load x [BT, BK] (RMSNorm statistics and weight on the fly), accumulate."""
    x, ss = _x_tile(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, ss, NORM)
    acc = _tile_dot(x, w, acc, BLOCK_T)
    if MODE == 2:
        acc2 = _tile_dot(x, w2, acc2, BLOCK_T)
    return acc, acc2, ss


@triton.jit
def _linear_out(acc, acc2, ss, rn, rt, nmask, tmask, b_ptr, out_ptr, stride_out, K, eps, pid,
                MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
                SPLIT_K: tl.constexpr, SEM: tl.constexpr):
    """The linear kernels' epilogue on acc [BT, BN]: 1/RMS (NORM 1; NORM 2 leaves it to the
    caller), bias, then store, add into out, SwiGLU, or (split-K) atomically add a partial
    with memory semantics ``SEM`` (what orders the partials is the kernel boundary, or a serial
    hand-off's barrier and count: ``ATOMIC_SEMS``). ``ARGMAX`` (3) stores, per token, only
    this program's largest value and its first column, as two float32 at ``2 * pid`` of the
    token's row of out (``argmax_partials``): a greedy step never writes its logits."""
    if NORM == 1:
        inv = tl.rsqrt(ss / K + eps)
        acc = acc * inv[:, None]
        acc2 = acc2 * inv[:, None]
    if BIAS:
        acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    omask = tmask[:, None] & nmask[None, :]
    optr = out_ptr + rt[:, None] * stride_out + rn[None, :]
    if MODE == 3:
        v = tl.where(nmask[None, :], acc, float("-inf"))
        best = tl.max(v, axis=1)  # [BT]
        first = tl.min(tl.where(v == best[:, None], rn[None, :], 2147483647), axis=1)
        first = tl.minimum(first, tl.max(tl.where(nmask, rn, 0), 0))  # (NaN: a column of ours)
        tl.store(out_ptr + rt * stride_out + 2 * pid, best, mask=tmask)
        tl.store(out_ptr + rt * stride_out + 2 * pid + 1, first.to(tl.float32), mask=tmask)
    elif SPLIT_K > 1:  # MODE 1 only: out (float32) += this split's partial sum
        tl.atomic_add(optr, acc, mask=omask, sem=SEM)
    else:
        if MODE == 1:
            acc += tl.load(optr, mask=omask, other=0.0).to(tl.float32)
        if MODE == 2:
            acc = acc * tl.sigmoid(acc) * acc2
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)
    return acc


@triton.jit
def _handed_ss(ssp_ptr, rt, tmask, NP, NP_BLOCK: tl.constexpr):
    """``NormHandoff`` consumer: each token's sum of squares from the producer's NP slots."""
    sp = tl.arange(0, NP_BLOCK)
    return tl.sum(tl.load(ssp_ptr + rt[:, None] * NP + sp[None, :],
                          mask=tmask[:, None] & (sp < NP)[None, :], other=0.0), axis=1)


@triton.jit
def _hand_off(h, rn, rt, nmask, tmask, g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, pid):
    """``NormHandoff`` producer: this program's columns of the new residual h [BT, BN] as the
    next norm's input, h * g2 (in ``xg``'s dtype), and their squares summed into slot ``pid``."""
    m = tmask[:, None] & nmask[None, :]
    hm = tl.where(m, h, 0.0)
    tl.store(ssp_ptr + rt * NP + pid, tl.sum(hm * hm, axis=1), mask=tmask)
    g2 = tl.load(g2_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    tl.store(xg_ptr + rt[:, None] * stride_xg + rn[None, :],
             (hm * g2[None, :]).to(xg_ptr.dtype.element_ty), mask=m)


@triton.jit
def _serial_hand_off(out_ptr, stride_out, rn, rt, nmask, tmask, cnt_ptr, g2_ptr, xg_ptr, ssp_ptr,
                     stride_xg, NP, pid, SPLIT_K: tl.constexpr):
    """``NormHandoff`` from a split-K producer, after this program's partial is added: the
    last split of the column block to count itself in reads the finished columns back (from
    L2, past this SM's L1) and hands them off, then zeroes the count for the next launch.

    The block barrier puts every thread's partial before the counting atomic, whose release
    (one thread) publishes them; its acquire, broadcast by the barrier Triton places after a
    scalar atomic, puts the read-back after every other split's partial (session 6 run 52's
    counter lacked the first barrier and lost partials)."""
    tl.debug_barrier()
    n = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
    if n == SPLIT_K - 1:
        m = tmask[:, None] & nmask[None, :]
        h = tl.load(out_ptr + rt[:, None] * stride_out + rn[None, :], mask=m, other=0.0,
                    cache_modifier=".cg")
        _hand_off(h, rn, rt, nmask, tmask, g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, pid)
        tl.store(cnt_ptr + pid, 0)


@triton.jit
def _linear_epilogue(acc, acc2, ss, rn, rt, nmask, tmask, b_ptr, out_ptr, stride_out, K, eps,
                     g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, cnt_ptr, pid,
                     MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
                     SPLIT_K: tl.constexpr, SEM: tl.constexpr, HAND: tl.constexpr,
                     NP_BLOCK: tl.constexpr, TRANS: tl.constexpr):
    """Both linear kernels' epilogue on acc [BT, BN] (``TRANS``: given as [BN, BT], the swapped
    kernel's, and transposed here, after the handed slots are asked for) with the
    ``NormHandoff`` sides (``HAND`` as in ``_linear_kernel``): the consumer takes 1/RMS from
    the handed slots; the producer hands its new residual rows off, serially where it splits K."""
    if HAND == 2:
        ss = _handed_ss(ssp_ptr, rt, tmask, NP, NP_BLOCK)
        if TRANS:
            acc, acc2 = tl.trans(acc), tl.trans(acc2)
        _linear_out(acc, acc2, ss, rn, rt, nmask, tmask, b_ptr, out_ptr, stride_out, K, eps,
                    pid, MODE, 1, BIAS, SPLIT_K, SEM)
    else:
        if TRANS:
            acc, acc2 = tl.trans(acc), tl.trans(acc2)
        h = _linear_out(acc, acc2, ss, rn, rt, nmask, tmask, b_ptr, out_ptr, stride_out, K, eps,
                        pid, MODE, NORM, BIAS, SPLIT_K, SEM)
        if HAND == 1 and SPLIT_K > 1:
            _serial_hand_off(out_ptr, stride_out, rn, rt, nmask, tmask, cnt_ptr, g2_ptr, xg_ptr,
                             ssp_ptr, stride_xg, NP, pid, SPLIT_K)
        elif HAND == 1:
            _hand_off(h, rn, rt, nmask, tmask, g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, pid)


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, g_ptr, b_ptr, out_ptr,
    T, N, K, stride_x, stride_out, eps,
    g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, cnt_ptr, tr_ptr, tr_base,
    MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EVICT: tl.constexpr, HAND: tl.constexpr, NP_BLOCK: tl.constexpr,
    SEM: tl.constexpr, TRACE: tl.constexpr = 0, ROWS: tl.constexpr = 0,
    PREFETCH: tl.constexpr = 0, SEG: tl.constexpr = 1, SMEM_FLOOR: tl.constexpr = 0,
    LANES: tl.constexpr = 0,
):
    """``TRACE``: ``_stamp`` (tracing only). ``ROWS``, ``PREFETCH``, ``SEG``, ``LANES`` (T = 1):
    ``LinearConfig.rows``, ``.prefetch``, ``.segments`` and ``.lanes``. ``SMEM_FLOOR`` is not read: it
    gives a launch with a shared-memory floor a compiled kernel of its own (``floor_shared``).

    ``HAND`` (``NormHandoff``): 1, also hand the new rows of ``out`` (a residual) to the
    next norm (``_hand_off``; with split-K, ``_serial_hand_off``); 2, ``x`` is such a hand-off
    (x * g) and the RMS statistics are the ``NP`` partial sums at ``ssp``: no squares or norm
    weight in the loop."""
    pid = tl.program_id(0)
    tpid = pid * SPLIT_K + tl.program_id(1)
    _stamp(tr_ptr, tr_base, tpid, 0, TRACE)
    k_per = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    rt = tl.arange(0, BLOCK_T)  # [BT]
    nmask = rn < N
    tmask = rt < T
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    if ROWS:
        # Each warp's rows read their own copy of x (L1 serves the repeats) in the weight
        # tile's layout, and keep their sums per row until after the loop: the loop has no
        # block barrier (the default loop converts x's layout and the sums through shared
        # memory every tile). SEG > 1: the tile is [BN * SEG, BK / SEG], each of its rows a
        # segment of a weight row, so a segment a warp holds whole (256 bfloat16 columns)
        # keeps rows wider than that barrier-free too; a row's segments are summed after the
        # loop. PREFETCH: tile k0 + BK is asked for before tile k0 is reduced (the last
        # iteration's ask is masked off whole). Where the prologue asks for it (PDL % 4 >= 2)
        # the first tile loads before the PDL wait: with PREFETCH as the loop's carried
        # tile; without, reduced after the wait, the loop taking the tiles after it.
        SW: tl.constexpr = BLOCK_K // SEG
        sr = tl.arange(0, BLOCK_N * SEG)
        srow = pid * BLOCK_N + sr // SEG  # [BN * SEG] the weight row of each tile row
        soff = (sr % SEG) * SW  # [BN * SEG] its segment's first column in the tile
        sc = tl.arange(0, SW)
        smask = srow < N
        if LANES:
            av = tl.zeros([BLOCK_N * SEG, 32], dtype=tl.float32)
            av2 = tl.zeros([BLOCK_N * SEG, 32], dtype=tl.float32)
        else:
            av = tl.zeros([BLOCK_N * SEG], dtype=tl.float32)
            av2 = tl.zeros([BLOCK_N * SEG], dtype=tl.float32)
        sv = tl.zeros([BLOCK_N * SEG], dtype=tl.float32)
        k_start = k_lo
        if PDL % 4 >= 2:
            cols, cmask, w, w2 = _seg_tile(w_ptr, srow, smask, k_lo, k_hi, soff, sc, N, K, SEG,
                                           MODE, EVICT)
        _gdc(PDL)
        _stamp(tr_ptr, tr_base, tpid, 1, TRACE)
        if PREFETCH == 0 and PDL % 4 >= 2:
            av, av2, sv = _row_step(x_ptr, g_ptr, sr, cols, cmask, w, w2, av, av2, sv, MODE,
                                    NORM, LANES)
            k_start = k_lo + BLOCK_K
        elif PREFETCH and PDL % 4 < 2:
            cols, cmask, w, w2 = _seg_tile(w_ptr, srow, smask, k_lo, k_hi, soff, sc, N, K, SEG,
                                           MODE, EVICT)
        for k0 in range(k_start, k_hi, BLOCK_K):
            if PREFETCH:  # (cols: carried from the iteration before)
                coln, cmn, wn, w2n = _seg_tile(w_ptr, srow, smask, k0 + BLOCK_K, k_hi, soff, sc,
                                               N, K, SEG, MODE, EVICT)
            else:
                cols, cmask, w, w2 = _seg_tile(w_ptr, srow, smask, k0, k_hi, soff, sc, N, K,
                                               SEG, MODE, EVICT)
            av, av2, sv = _row_step(x_ptr, g_ptr, sr, cols, cmask, w, w2, av, av2, sv, MODE,
                                    NORM, LANES)
            if PREFETCH:
                w, w2, cols, cmask = wn, w2n, coln, cmn
        if LANES:  # the lanes' partials of each row, summed once
            avr = tl.sum(av, axis=1)
            av2r = tl.sum(av2, axis=1)
        else:
            avr = av
            av2r = av2
        if SEG == 1:
            acc += avr[None, :]
            acc2 += av2r[None, :]
            ss += tl.max(sv, 0)  # every row summed the same x (its load ignores the row mask)
        else:
            acc += tl.sum(tl.reshape(avr, [BLOCK_N, SEG]), axis=1)[None, :]
            acc2 += tl.sum(tl.reshape(av2r, [BLOCK_N, SEG]), axis=1)[None, :]
            ss += tl.max(tl.sum(tl.reshape(sv, [BLOCK_N, SEG]), axis=1), 0)
    elif PDL % 4 >= 2:
        # The first K tile of the weights is loaded before waiting on the previous kernel.
        rk = k_lo + tl.arange(0, BLOCK_K)  # [BK]
        kmask = rk < k_hi
        wmask = nmask[:, None] & kmask[None, :]
        w, w2 = _w_pair(w_ptr, rn, rk[None, :], wmask, N, K, MODE, EVICT)  # [BN, BK]
        _gdc(PDL)
        _stamp(tr_ptr, tr_base, tpid, 1, TRACE)
        acc, acc2, ss = _lin_step(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, w, w2, acc,
                                  acc2, ss, MODE, NORM, BLOCK_T)
        for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            kmask = rk < k_hi
            wmask = nmask[:, None] & kmask[None, :]
            w, w2 = _w_pair(w_ptr, rn, rk[None, :], wmask, N, K, MODE, EVICT)
            acc, acc2, ss = _lin_step(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, w, w2, acc,
                                      acc2, ss, MODE, NORM, BLOCK_T)
    else:
        _gdc(PDL)
        _stamp(tr_ptr, tr_base, tpid, 1, TRACE)
        # At T = 1 (reductions, no tl.dot) Triton does not pipeline this loop's loads; asking
        # it to (``tl.range(..., num_stages=n)``, cp.async into shared memory) lost or was even
        # (session 8 run 76: +0.4 to +18 % for the 1.5B, -0.2 to +30 % for the 0.5B): the many
        # resident programs already keep the bytes in flight.
        # Element-wise accumulators reduced once after the loop lost 4-12 % (run 80): 40 -> 70
        # registers for gate/up, too few programs resident. Again in session 21 (runs 197-200,
        # commit d16a86f): faster than this loop in a chain of gate/ups alone, +1 to +15 % in
        # the step in every tile and launch point tried.
        for k0 in range(k_lo, k_hi, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)  # [BK]
            kmask = rk < k_hi
            x, ss = _x_tile(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, ss, NORM)
            wmask = nmask[:, None] & kmask[None, :]
            w = _w_tile(w_ptr, rn, 0, rk[None, :], wmask, K, EVICT)
            acc = _tile_dot(x, w, acc, BLOCK_T)
            if MODE == 2:
                w2 = _w_tile(w_ptr, rn, N, rk[None, :], wmask, K, EVICT)
                acc2 = _tile_dot(x, w2, acc2, BLOCK_T)
    _stamp(tr_ptr, tr_base, tpid, 2, TRACE)
    _gdc_late(PDL)
    _linear_epilogue(acc, acc2, ss, rn, rt, nmask, tmask, b_ptr, out_ptr, stride_out, K, eps,
                     g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, cnt_ptr, pid,
                     MODE, NORM, BIAS, SPLIT_K, SEM, HAND, NP_BLOCK, False)
    _stamp(tr_ptr, tr_base, tpid, 3, TRACE)


@triton.jit
def _linear_swap_kernel(
    x_ptr, w_ptr, g_ptr, b_ptr, out_ptr,
    T, N, K, stride_x, stride_out, eps,
    g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, cnt_ptr, tr_ptr, tr_base,
    MODE: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EVICT: tl.constexpr, HAND: tl.constexpr, NP_BLOCK: tl.constexpr,
    SEM: tl.constexpr, TRACE: tl.constexpr = 0, SMEM_FLOOR: tl.constexpr = 0,
):
    """``_linear_kernel`` for T > 1 with the product transposed: accT [BN, BT] += W [BN, BK] .
    x^T [BK, BT]; transposed back once, in the same epilogue (``HAND`` as there); ``TRACE``:
    ``_stamp`` (tracing only); ``SMEM_FLOOR`` as there."""
    pid = tl.program_id(0)
    tpid = pid * SPLIT_K + tl.program_id(1)
    _stamp(tr_ptr, tr_base, tpid, 0, TRACE)
    k_per = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rt = tl.arange(0, BLOCK_T)
    nmask = rn < N
    tmask = rt < T
    acc_t = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    acc2_t = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    # No weight prologue here (PDL modes 2 and 6 wait first, like 1 and 5): peeling the first
    # tile out of the pipelined loop lost 1-4 % in every verify step it was tried in (session 6
    # runs 52-58; the peeled version is in commit c2f5d97), and again with gate/up launching
    # the down projection at its start (session 15 runs 146-147: +5.4 %, or -0.7 % with a
    # 64-row tile that gains as much without it; commit 890aa4f).
    _gdc(PDL)
    _stamp(tr_ptr, tr_base, tpid, 1, TRACE)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < k_hi
        x, ss = _x_tile(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, ss, NORM)
        wmask = nmask[:, None] & kmask[None, :]
        w = _w_tile(w_ptr, rn, 0, rk[None, :], wmask, K, EVICT)
        xt = tl.trans(x.to(w.dtype))  # [BK, BT]
        acc_t = tl.dot(w, xt, acc_t)
        if MODE == 2:
            w2 = _w_tile(w_ptr, rn, N, rk[None, :], wmask, K, EVICT)
            acc2_t = tl.dot(w2, xt, acc2_t)
    _stamp(tr_ptr, tr_base, tpid, 2, TRACE)
    _gdc_late(PDL)
    _linear_epilogue(acc_t, acc2_t, ss, rn, rt, nmask, tmask, b_ptr, out_ptr, stride_out, K, eps,
                     g2_ptr, xg_ptr, ssp_ptr, stride_xg, NP, cnt_ptr, pid,
                     MODE, NORM, BIAS, SPLIT_K, SEM, HAND, NP_BLOCK, True)
    _stamp(tr_ptr, tr_base, tpid, 3, TRACE)


@triton.jit
def _qkv_rope_kernel(
    x_ptr, w_ptr, g_ptr, b_ptr, rope_ptr, start_ptr, q_ptr, kc_ptr, vc_ptr,
    T, K, stride_x, stride_ch, stride_cs, eps, tr_ptr, tr_base,
    N_HEAD: tl.constexpr, N_KV: tl.constexpr, HD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    EVICT: tl.constexpr, TRACE: tl.constexpr = 0, SMEM_FLOOR: tl.constexpr = 0,
):
    """Program = BLOCK_P NeoX pairs (rows j and j + HD/2) of one head of q, k or v
    (``SMEM_FLOOR`` as in ``_linear_kernel``)."""
    HALF: tl.constexpr = HD // 2
    PER_HEAD: tl.constexpr = HALF // BLOCK_P
    pid = tl.program_id(0)
    _stamp(tr_ptr, tr_base, pid, 0, TRACE)
    head = pid // PER_HEAD  # 0..N_HEAD+2*N_KV
    j = (pid % PER_HEAD) * BLOCK_P + tl.arange(0, BLOCK_P)  # [BP] pair index within head
    r1 = head * HD + j
    r2 = r1 + HALF
    rt = tl.arange(0, BLOCK_T)
    tmask = rt < T
    acc1 = tl.zeros([BLOCK_T, BLOCK_P], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_T, BLOCK_P], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    k_first = 0
    if PDL % 4 >= 2:  # the first weight tile before waiting on the previous kernel
        rk = tl.arange(0, BLOCK_K)
        kmask = rk < K
        w1 = _w_tile(w_ptr, r1, 0, rk[None, :], kmask[None, :], K, EVICT)
        w2 = _w_tile(w_ptr, r2, 0, rk[None, :], kmask[None, :], K, EVICT)
        # (Loading the norm weight, bias and RoPE row here too, none of which the step writes,
        # took the epilogue's 0.3-0.5 us off and lost the step 0.4 to 0.8 %: the 1.5B's loop
        # grew by as much; session 21 run 201, commit 1f7beae.)
        _gdc(PDL)
        _stamp(tr_ptr, tr_base, pid, 1, TRACE)
        acc1, acc2, ss = _lin_step(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, w1, w2, acc1,
                                   acc2, ss, 2, True, BLOCK_T)
        k_first = BLOCK_K
    else:
        _gdc(PDL)
        _stamp(tr_ptr, tr_base, pid, 1, TRACE)
    for k0 in range(k_first, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        w1 = _w_tile(w_ptr, r1, 0, rk[None, :], kmask[None, :], K, EVICT)
        w2 = _w_tile(w_ptr, r2, 0, rk[None, :], kmask[None, :], K, EVICT)
        acc1, acc2, ss = _lin_step(x_ptr, g_ptr, rt, tmask, rk, kmask, stride_x, w1, w2, acc1,
                                   acc2, ss, 2, True, BLOCK_T)
    _stamp(tr_ptr, tr_base, pid, 2, TRACE)
    _gdc_late(PDL)
    inv = tl.rsqrt(ss / K + eps)
    acc1 = acc1 * inv[:, None] + tl.load(b_ptr + r1).to(tl.float32)[None, :]
    acc2 = acc2 * inv[:, None] + tl.load(b_ptr + r2).to(tl.float32)[None, :]
    pos = tl.load(start_ptr) + rt  # [BT]
    cs = rope_ptr + pos[:, None] * HD + 2 * j[None, :]  # table [n_pos, HD/2, (cos, sin)]
    cos = tl.load(cs, mask=tmask[:, None], other=1.0)
    sin = tl.load(cs + 1, mask=tmask[:, None], other=0.0)
    is_rope = head < N_HEAD + N_KV
    o1 = tl.where(is_rope, acc1 * cos - acc2 * sin, acc1)
    o2 = tl.where(is_rope, acc2 * cos + acc1 * sin, acc2)
    m = tmask[:, None]
    if head < N_HEAD:
        qp = q_ptr + rt[:, None] * (N_HEAD * HD) + head * HD + j[None, :]  # q [T, H, HD]
        tl.store(qp, o1, mask=m)
        tl.store(qp + HALF, o2, mask=m)
    elif head < N_HEAD + N_KV:
        kp = kc_ptr + (head - N_HEAD) * stride_ch + pos[:, None] * stride_cs + j[None, :]
        tl.store(kp, o1.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(kp + HALF, o2.to(kc_ptr.dtype.element_ty), mask=m)
    else:
        vp = vc_ptr + (head - N_HEAD - N_KV) * stride_ch + pos[:, None] * stride_cs + j[None, :]
        tl.store(vp, o1.to(vc_ptr.dtype.element_ty), mask=m)
        tl.store(vp + HALF, o2.to(vc_ptr.dtype.element_ty), mask=m)
    _stamp(tr_ptr, tr_base, pid, 3, TRACE)


@triton.jit
def _rope_kv_kernel(
    qkv_ptr, h_ptr, b_ptr, rope_ptr, start_ptr, q_ptr, kc_ptr, vc_ptr,
    D, stride_ch, stride_cs, eps, tr_ptr, tr_base,
    N_HEAD: tl.constexpr, N_KV: tl.constexpr, HD: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr, TRACE: tl.constexpr = 0, INV: tl.constexpr = 0, ZERO: tl.constexpr = 1,
    SMEM_FLOOR: tl.constexpr = 0,
):
    """Program = (token, head of q, k or v): finish a split-K qkv product. ``qkv [T, QKV]``
    holds (x * g) @ W^T summed over the splits; scale by the token's 1/RMS, add the bias, RoPE
    q and k, store q and the cache, and zero the rows read so the next layer can accumulate
    (``ZERO``). The wide step's product (cuBLAS) is finished the same way, its rows' 1/RMS
    read from ``h_ptr`` (``INV``) and nothing zeroed: the next layer's product overwrites it.
    (``SMEM_FLOOR`` as in ``_linear_kernel``.)

    What a step never writes (bias, position, its RoPE row) loads before the PDL wait, and the
    product's rows beside h in one round trip rather than after it (session 8 runs 75-76:
    k = 8 verify -0.3 to -0.4 % for the 1.5B, -0.2 to 0 % for the 0.5B, never worse)."""
    HALF: tl.constexpr = HD // 2
    QKV: tl.constexpr = (N_HEAD + 2 * N_KV) * HD
    t = tl.program_id(0)
    head = tl.program_id(1)
    tpid = t * (N_HEAD + 2 * N_KV) + head
    _stamp(tr_ptr, tr_base, tpid, 0, TRACE)
    j = tl.arange(0, HALF)
    r1 = head * HD + j
    r2 = r1 + HALF
    b1 = tl.load(b_ptr + r1).to(tl.float32)
    b2 = tl.load(b_ptr + r2).to(tl.float32)
    pos = tl.load(start_ptr) + t
    cos = tl.load(rope_ptr + pos * HD + 2 * j)
    sin = tl.load(rope_ptr + pos * HD + 2 * j + 1)
    _gdc(PDL)
    _stamp(tr_ptr, tr_base, tpid, 1, TRACE)
    p1 = tl.load(qkv_ptr + t * QKV + r1)
    p2 = tl.load(qkv_ptr + t * QKV + r2)
    if INV:  # (``h_ptr`` holds each row's 1/RMS: the wide step's ``residual_norm``)
        inv = tl.load(h_ptr + t)
    else:
        ss = tl.zeros([BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):  # one pass where D <= 2048 (the launcher's BLOCK_D)
            d = d0 + tl.arange(0, BLOCK_D)
            x = tl.load(h_ptr + t * D + d, mask=d < D, other=0.0)
            ss += x * x
    _stamp(tr_ptr, tr_base, tpid, 2, TRACE)
    _gdc_late(PDL)
    if INV == 0:
        inv = tl.rsqrt(tl.sum(ss, 0) / D + eps)
    a1 = p1 * inv + b1
    a2 = p2 * inv + b2
    if ZERO:
        tl.store(qkv_ptr + t * QKV + r1, tl.zeros([HALF], dtype=tl.float32))
        tl.store(qkv_ptr + t * QKV + r2, tl.zeros([HALF], dtype=tl.float32))
    if head < N_HEAD + N_KV:
        o1 = a1 * cos - a2 * sin
        o2 = a2 * cos + a1 * sin
    else:
        o1 = a1
        o2 = a2
    if head < N_HEAD:
        qp = q_ptr + (t * N_HEAD + head) * HD + j
        tl.store(qp, o1)
        tl.store(qp + HALF, o2)
    elif head < N_HEAD + N_KV:
        kp = kc_ptr + (head - N_HEAD) * stride_ch + pos * stride_cs + j
        tl.store(kp, o1.to(kc_ptr.dtype.element_ty))
        tl.store(kp + HALF, o2.to(kc_ptr.dtype.element_ty))
    else:
        vp = vc_ptr + (head - N_HEAD - N_KV) * stride_ch + pos * stride_cs + j
        tl.store(vp, o1.to(vc_ptr.dtype.element_ty))
        tl.store(vp + HALF, o2.to(vc_ptr.dtype.element_ty))
    _stamp(tr_ptr, tr_base, tpid, 3, TRACE)


@triton.jit
def _split_chunk(total, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr):
    """Keys per split of a sequence of ``total`` keys: whole blocks, as few splits as fit."""
    return tl.cdiv(tl.cdiv(total, NSPLIT), BLOCK_S) * BLOCK_S


@triton.jit
def _splits_used(total, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr):
    """How many of the ``NSPLIT`` splits hold keys; the rest are empty (at position 512 with
    64 splits of 64-key blocks, 55 of 64), and a trimmed merge never reads them."""
    return tl.cdiv(total, _split_chunk(total, NSPLIT, BLOCK_S))


@triton.jit
def _attn_update(q, kt, vt, s, smask, qpos, m, den, acc, MASK: tl.constexpr = True):
    """One block of keys into the running (max, sum, output) of the query rows. ``MASK``
    False: every row sees every key of the block (``s``, ``smask`` and ``qpos`` unread), so
    no key is masked and no row's max can be -inf (``_attn_keys``' ``SEEN`` blocks)."""
    sc = tl.dot(q.to(kt.dtype), tl.trans(kt))  # [R, S]
    if MASK:
        valid = smask[None, :] & (s[None, :] <= qpos[:, None])
        sc = tl.where(valid, sc, float("-inf"))
    m_new = tl.maximum(m, tl.max(sc, 1))
    if MASK:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    p = tl.exp(sc - m_safe[:, None])
    alpha = tl.exp(m - m_safe)
    den = den * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
    return m_new, den, acc


@triton.jit
def _attn_keys(q, kbase, vbase, s_lo, s_hi, qpos, stride_cs, d, BLOCK_R: tl.constexpr,
               HD: tl.constexpr, BLOCK_S: tl.constexpr, s_seen=0, SEEN: tl.constexpr = False):
    """Keys s_lo..s_hi - 1 of one kv head (``kbase``, ``vbase``) in blocks into the running
    (max, sum, output) of the query rows ``q`` at positions ``qpos``, from empty. ``SEEN``:
    the whole blocks s_lo..s_seen - 1 are seen by every row and go without masks."""
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    den = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, HD], dtype=tl.float32)
    s_from = s_lo
    if SEEN:
        for s0 in range(s_lo, s_seen, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            kt = tl.load(kbase + s[:, None] * stride_cs + d[None, :])
            vt = tl.load(vbase + s[:, None] * stride_cs + d[None, :])
            m, den, acc = _attn_update(q, kt, vt, s, s, qpos, m, den, acc, False)
        s_from = s_seen
    for s0 in range(s_from, s_hi, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = s < s_hi
        kt = tl.load(kbase + s[:, None] * stride_cs + d[None, :], mask=smask[:, None], other=0.0)
        vt = tl.load(vbase + s[:, None] * stride_cs + d[None, :], mask=smask[:, None], other=0.0)
        m, den, acc = _attn_update(q, kt, vt, s, smask, qpos, m, den, acc)
    return m, den, acc


@triton.jit
def _attn_partials(o_ptr, ml_ptr, idx, rmask, d, m, den, acc, HD: tl.constexpr):
    """Store rows ``idx`` of a split's partials: output [., HD], then (max, sum)."""
    tl.store(o_ptr + idx[:, None] * HD + d[None, :], acc, mask=rmask[:, None])
    tl.store(ml_ptr + idx * 2, m, mask=rmask)
    tl.store(ml_ptr + idx * 2 + 1, den, mask=rmask)


@triton.jit
def _attn_item(q_ptr, kc_ptr, vc_ptr, start, o_ptr, ml_ptr, T, kvh, sp, stride_ch, stride_cs, scale,
               N_HEAD: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
               TRIM: tl.constexpr, tr_ptr=None, tr_base=0, tpid=0,
               TRACE: tl.constexpr = 0):
    """Flash-decoding partials of one (kv head, split of the sequence): rows r = t * G + g of
    the query tile (all query heads of the group, all T tokens) share one K/V stream.

    ``PDL``: wait for the previous kernel (``_gdc``) first. ``TRIM``: empty splits store
    nothing (a trimmed merge reads only the splits that hold keys).

    Loading the first K/V block before the wait (positions before ``start`` are written by
    earlier steps) was measured in session 7 (runs 63-64) and lost 1-3 % in every step: the
    split holding this step's positions must load after the wait all the same."""
    r = tl.arange(0, BLOCK_R)
    t = r // G
    head = kvh * G + r % G
    rmask = t < T
    d = tl.arange(0, HD)
    total = start + T
    chunk = _split_chunk(total, NSPLIT, BLOCK_S)
    s_lo = sp * chunk
    s_hi = tl.minimum(s_lo + chunk, total)
    kbase = kc_ptr + kvh * stride_ch
    vbase = vc_ptr + kvh * stride_ch
    _gdc(PDL)
    _stamp(tr_ptr, tr_base, tpid, 1, TRACE)
    q = tl.load(q_ptr + (t * N_HEAD + head)[:, None] * HD + d[None, :],
                mask=rmask[:, None], other=0.0) * scale  # [R, HD] float32
    qpos = start + t  # [R]
    m, den, acc = _attn_keys(q, kbase, vbase, s_lo, s_hi, qpos, stride_cs, d, BLOCK_R, HD,
                             BLOCK_S)
    _stamp(tr_ptr, tr_base, tpid, 2, TRACE)
    idx = (sp * T + t) * N_HEAD + head  # partials [NSPLIT, T, H, ...]
    if TRIM:
        rmask = rmask & (s_lo + t * 0 < total)  # (a block: the interpreter's masks are)
    _attn_partials(o_ptr, ml_ptr, idx, rmask, d, m, den, acc, HD)


@triton.jit
def _attn_split_kernel(
    q_ptr, kc_ptr, vc_ptr, start_ptr, o_ptr, ml_ptr,
    T, stride_ch, stride_cs, scale, tr_ptr, tr_base,
    N_HEAD: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr, TRIM: tl.constexpr,
    TRACE: tl.constexpr = 0,
):
    """Program = (kv head, split): ``_attn_item``. ``start`` is written before the step's
    graph is launched, so it is read before the PDL wait."""
    tpid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    _stamp(tr_ptr, tr_base, tpid, 0, TRACE)
    _attn_item(q_ptr, kc_ptr, vc_ptr, tl.load(start_ptr), o_ptr, ml_ptr, T, tl.program_id(0),
               tl.program_id(1), stride_ch, stride_cs, scale, N_HEAD, G, HD, NSPLIT, BLOCK_R,
               BLOCK_S, PDL, TRIM, tr_ptr, tr_base, tpid, TRACE)
    _gdc_late(PDL)
    _stamp(tr_ptr, tr_base, tpid, 3, TRACE)


@triton.jit
def _attn_wide_kernel(
    q_ptr, kc_ptr, vc_ptr, start_ptr, o_ptr, ml_ptr, T, stride_ch, stride_cs, scale,
    N_HEAD: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
    SEEN: tl.constexpr = True,
):
    """Program = (kv head, split, block of ``BLOCK_Q`` query tokens): ``_attn_item`` for the
    wide step (``attention_wide``), whose T (a prompt's run) is too long for one query tile:
    rows r = (t - t0) * G + g hold the group's query heads of the block's tokens, which read
    only the keys up to the block's last token. Partials as ``_attn_item`` writes them with
    ``TRIM``: only the splits that hold keys, which alone the merge reads."""
    kvh = tl.program_id(0)
    sp = tl.program_id(1)
    r = tl.arange(0, BLOCK_R)
    t = tl.program_id(2) * BLOCK_Q + r // G
    head = kvh * G + r % G
    rmask = (r < BLOCK_Q * G) & (t < T)
    d = tl.arange(0, HD)
    start = tl.load(start_ptr)
    total = start + T
    chunk = _split_chunk(total, NSPLIT, BLOCK_S)
    s_lo = sp * chunk
    # the keys the block's last token sees, no further: a prompt's first run reads half the
    # key blocks it would (a split past them stores an empty partial, which the merge weighs 0).
    # Work, not time, where the grid is one wave: the last block still reads every key (runs
    # 326 and 328: 1,024 of 4,096 tokens in 1 split, 116.0 µs without, 114.8 with)
    seen = start + tl.minimum((tl.program_id(2) + 1) * BLOCK_Q, T)
    s_hi = tl.minimum(tl.minimum(s_lo + chunk, total), seen)
    q = (tl.load(q_ptr + (t * N_HEAD + head)[:, None] * HD + d[None, :],
                 mask=rmask[:, None], other=0.0) * scale).to(kc_ptr.dtype.element_ty)
    # the whole key blocks every row of the block sees (those before its first token)
    seen_all = tl.minimum(s_hi, start + tl.program_id(2) * BLOCK_Q)
    s_seen = s_lo + tl.maximum(seen_all - s_lo, 0) // BLOCK_S * BLOCK_S
    m, den, acc = _attn_keys(q, kc_ptr + kvh * stride_ch, vc_ptr + kvh * stride_ch, s_lo, s_hi,
                             start + t, stride_cs, d, BLOCK_R, HD, BLOCK_S, s_seen, SEEN)
    idx = (sp * T + t) * N_HEAD + head  # partials [NSPLIT, T, H, ...]
    _attn_partials(o_ptr, ml_ptr, idx, rmask & (s_lo + t * 0 < total), d, m, den, acc, HD)


@triton.jit
def _head_cols(c0, HD: tl.constexpr, HDC: tl.constexpr):
    """The columns of a head a merge program takes: c0 .. c0 + HDC - 1, or (HDC 0) all HD."""
    if HDC > 0:
        d = c0 + tl.arange(0, HDC)
    else:
        d = tl.arange(0, HD)
    return d


@triton.jit
def _merged(o_ptr, ml_ptr, T, item, n_used, N_HEAD: tl.constexpr, HD: tl.constexpr,
            NSPLIT: tl.constexpr, c0=0, HDC: tl.constexpr = 0):
    """The attention output [HD] (float32) of item = t * N_HEAD + head: the first ``n_used``
    splits' (max, sum, partial output) merged; the others are never read. ``HDC`` > 0: only
    its columns c0 .. c0 + HDC - 1 ([HDC]).

    One [NSPLIT, HD] (or [NSPLIT, HDC]) tile, even where it spills: reading the partials 16
    or 32 splits at a time lost 0.1 to 21 % (session 10 run 101, commit 98efb21 holds it)."""
    sp = tl.arange(0, NSPLIT)
    used = sp < n_used
    d = _head_cols(c0, HD, HDC)
    idx = sp * T * N_HEAD + item  # partials [NSPLIT, T, H, ...]
    m = tl.load(ml_ptr + idx * 2, mask=used, other=float("-inf"))
    den = tl.load(ml_ptr + idx * 2 + 1, mask=used, other=0.0)
    wgt = tl.exp(m - tl.max(m, 0))  # empty splits carry m = -inf -> weight 0
    o = tl.load(o_ptr + idx[:, None] * HD + d[None, :], mask=used[:, None], other=0.0)
    return tl.sum(o * wgt[:, None], 0) / tl.sum(wgt * den, 0)


@triton.jit
def _n_used(start_ptr, T, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, TRIM: tl.constexpr):
    """The splits a merge reads: those that hold keys (``TRIM``), else all. ``start`` is
    written before the step's graph is launched, so this may run before the PDL wait."""
    n = NSPLIT
    if TRIM:
        n = _splits_used(tl.load(start_ptr) + T, NSPLIT, BLOCK_S)
    return n


@triton.jit
def _combine_item(o_ptr, ml_ptr, out_ptr, T, item, n_used, N_HEAD: tl.constexpr,
                  HD: tl.constexpr, NSPLIT: tl.constexpr, c0=0, HDC: tl.constexpr = 0):
    """Merge the splits of item = t * N_HEAD + head (``_merged``; ``HDC`` > 0: columns c0 ..
    c0 + HDC - 1 only) into ``out``."""
    res = _merged(o_ptr, ml_ptr, T, item, n_used, N_HEAD, HD, NSPLIT, c0, HDC)
    tl.store(out_ptr + item * HD + _head_cols(c0, HD, HDC), res.to(out_ptr.dtype.element_ty))


@triton.jit
def _attn_combine_kernel(
    o_ptr, ml_ptr, out_ptr, start_ptr, T, tr_ptr, tr_base,
    N_HEAD: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr,
    PDL: tl.constexpr, TRIM: tl.constexpr, TRACE: tl.constexpr = 0, HDC: tl.constexpr = 0,
    SMEM_FLOOR: tl.constexpr = 0,
):
    """Program = (token, head), or with ``HDC`` > 0 (token, head, HDC columns of the head)
    (``SMEM_FLOOR`` as in ``_linear_kernel``)."""
    pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    _stamp(tr_ptr, tr_base, pid, 0, TRACE)
    n_used = _n_used(start_ptr, T, NSPLIT, BLOCK_S, TRIM)
    _gdc(PDL)
    _stamp(tr_ptr, tr_base, pid, 1, TRACE)
    _combine_item(o_ptr, ml_ptr, out_ptr, T, tl.program_id(0), n_used, N_HEAD, HD, NSPLIT,
                  tl.program_id(1) * HDC, HDC)
    _stamp(tr_ptr, tr_base, pid, 2, TRACE)
    _gdc_late(PDL)
    _stamp(tr_ptr, tr_base, pid, 3, TRACE)


@triton.jit
def _attn_out_kernel(
    o_ptr, ml_ptr, w_ptr, h_ptr, start_ptr, N, QD,
    N_HEAD: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr, PDL: tl.constexpr, TRIM: tl.constexpr, SEM: tl.constexpr,
):
    """T = 1: merge head ``h``'s splits and add its share of the o-projection into ``h``.

    Program = (rows of Wo, head): the [BLOCK_N, HD] block of Wo that multiplies this head's
    output, so one launch replaces the combine and the o-projection (partial sums over heads
    land in the float32 residual with atomics)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    head = tl.program_id(1)
    d = tl.arange(0, HD)
    nmask = rn < N
    w = tl.load(w_ptr + rn[:, None] * QD + head * HD + d[None, :], mask=nmask[:, None], other=0.0)
    n_used = _n_used(start_ptr, 1, NSPLIT, BLOCK_S, TRIM)
    _gdc(PDL)
    ov = _merged(o_ptr, ml_ptr, 1, head, n_used, N_HEAD, HD, NSPLIT)  # [HD]
    y = tl.sum(w.to(tl.float32) * ov[None, :], 1)  # [BLOCK_N]
    _gdc_late(PDL)
    tl.atomic_add(h_ptr + rn, y, mask=nmask, sem=SEM)


@triton.jit
def _embed_kernel(tok_ptr, emb_ptr, h_ptr, D, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    _gdc(PDL)
    t = tl.program_id(0)
    tok = tl.load(tok_ptr + t).to(tl.int64)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        row = tl.load(emb_ptr + tok * D + d, mask=d < D, other=0.0)
        tl.store(h_ptr + t * D + d, row.to(tl.float32), mask=d < D)
    _gdc_late(PDL)


@triton.jit
def _residual_norm_kernel(h_ptr, y_ptr, g_ptr, xg_ptr, inv_ptr, D, eps, ADD: tl.constexpr,
                          BLOCK_D: tl.constexpr):
    """Program = token: h += y (``ADD``: a product's rows into the residual), then x * g of the
    next norm and the row's 1/RMS, which its product's consumer applies (``residual_norm``)."""
    t = tl.program_id(0)
    ss = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):  # one pass where D <= 4096 (the launcher's BLOCK_D)
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        h = tl.load(h_ptr + t * D + d, mask=dm, other=0.0)
        if ADD:
            h += tl.load(y_ptr + t * D + d, mask=dm, other=0.0).to(tl.float32)
            tl.store(h_ptr + t * D + d, h, mask=dm)
        ss += h * h
        xg = h * tl.load(g_ptr + d, mask=dm, other=0.0).to(tl.float32)
        tl.store(xg_ptr + t * D + d, xg.to(xg_ptr.dtype.element_ty), mask=dm)
    tl.store(inv_ptr + t, tl.rsqrt(tl.sum(ss, 0) / D + eps))


@triton.jit
def _swiglu_rows_kernel(gu_ptr, inv_ptr, act_ptr, F, BLOCK_F: tl.constexpr):
    """Program = (token, ``BLOCK_F`` columns): act = SiLU(gate / RMS(h)) * (up / RMS(h)),
    where ``gu`` [T, 2F] holds (h * g) @ W13^T: the norm's 1/RMS is a factor of each row of
    the product, so the wide step's product (cuBLAS) takes h * g and this kernel scales it
    (``inv``: each row's 1/RMS, ``residual_norm``'s)."""
    t = tl.program_id(0)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    inv = tl.load(inv_ptr + t)
    gate = tl.load(gu_ptr + t * 2 * F + f, mask=fmask, other=0.0).to(tl.float32) * inv
    up = tl.load(gu_ptr + t * 2 * F + F + f, mask=fmask, other=0.0).to(tl.float32) * inv
    act = gate * tl.sigmoid(gate) * up
    tl.store(act_ptr + t * F + f, act.to(act_ptr.dtype.element_ty), mask=fmask)


@triton.jit
def _l2_prefetch_kernel(w_ptr, off0, off1, n_lines, LINE: tl.constexpr, BLOCK: tl.constexpr,
                        PER: tl.constexpr):
    """Program (p, r): ask L2 for its ``PER * BLOCK`` lines of region r (lines of ``LINE``
    elements from element ``off0``, or ``off1`` for r = 1), one ``prefetch.global.L2`` a line.
    Nothing waits for the lines: the program ends once it has asked (lines past ``n_lines``
    ask for the region's first line again)."""
    base = tl.where(tl.program_id(1) == 0, off0, off1).to(tl.int64)
    for i in range(PER):
        idx = (tl.program_id(0) * PER + i) * BLOCK + tl.arange(0, BLOCK)
        idx = tl.where(idx < n_lines, idx, 0).to(tl.int64)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                  [w_ptr + base + idx * LINE], dtype=tl.int32, is_pure=False,
                                  pack=1)


# --- launchers ------------------------------------------------------------------------------


def pdl_supported() -> bool:
    """Programmatic dependent launch: a Hopper-or-later GPU and a Triton that exposes it."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda as tl_cuda
    except ImportError:
        return False
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return "launch_pdl" in fields and hasattr(tl_cuda, "gdc_wait")


def _wait(pdl: int) -> int:
    """The PDL flag of kernels without a weight prologue: wait first (keeping ``PDL_LATE`` or
    ``PDL_AFTER_WAIT``), or not at all."""
    return (1 | (pdl & (PDL_LATE | PDL_AFTER_WAIT))) if pdl % 4 in (1, 2) else 0


def _launch(pdl: int) -> dict[str, bool]:
    """PDL modes: 0 off; 1 launched early, waits first; 2 also loads its first weight tile
    before waiting (linear and qkv kernels); 3 the code of 2 without PDL (tests, interpreter);
    plus ``PDL_LATE`` (5, 6, 7): the next kernel is let go after the main loop, not at the
    start; or plus ``PDL_AFTER_WAIT`` (9, 10, 11): just after the wait. Both flags at once,
    or anything past 11, is refused: the kernels would silently drop ``PDL_LATE``."""
    if not 0 <= pdl <= 11 or (pdl & PDL_LATE and pdl & PDL_AFTER_WAIT):
        raise ValueError(f"PDL mode {pdl}: use 0-3, plus PDL_LATE (4) or PDL_AFTER_WAIT (8)")
    return {"launch_pdl": True} if pdl % 4 in (1, 2) else {}


#: Tracing only (scripts/trace_step.py): while ``buf`` is set (int64 [slots, TRACE_WIDTH]), each launch
#: of a step's traced kernels (one-token and verify) takes the next ``progs`` slots for its
#: programs' ``_stamp``s (``next`` counts launches; the Runner resets it as a step is
#: captured). ``tracing`` sets and clears it.
TRACE: dict[str, object] = {"buf": None, "progs": 0, "next": 0}


def _trace(dummy: torch.Tensor) -> tuple[tuple[torch.Tensor, int], dict[str, int]]:
    """A launch's trace arguments (buffer, first slot) and its ``TRACE`` constant; off, a dummy
    pointer and no constant, so an untraced kernel compiles with no stamp in it."""
    buf = TRACE["buf"]
    if buf is None:
        return (dummy, 0), {}
    assert isinstance(buf, torch.Tensor)
    n, p = int(TRACE["next"]), int(TRACE["progs"])  # type: ignore[call-overload]
    if (n + 1) * p > buf.shape[0]:
        raise ValueError(f"the trace buffer holds {buf.shape[0] // p} launches")
    TRACE["next"] = n + 1
    return (buf, n * p), {"TRACE": p}


#: The carveout's "no preference" value (``CU_SHAREDMEM_CARVEOUT_DEFAULT``).
CARVEOUT_DEFAULT = -1


def set_carveout(percent: int, only: Collection[str] | None = None) -> int:
    """Ask every kernel of this module compiled so far (``only``: those of these names) to
    prefer ``percent`` of each SM's L1 as shared memory (``CARVEOUT_DEFAULT``: the driver's
    choice again); returns how many.

    Why it was tried (session 20, ``scripts/bench_carveout.py``): Triton asks the driver for
    the largest shared-memory split only for kernels over 48 KB (gate/up, the verify
    attention); the others keep the driver's choice, and an SM changes its split only once it
    is empty. If that were why a kernel launched early (PDL) piles its programs onto a few SMs
    (the verify down projection on 104 SMs, up to 6 an SM), one split for every kernel would
    spread them. It did not (run 189: the same pile), and one-token steps ran 4-6 % slower
    with L1 at its smallest. Takes effect in steps captured after the call
    (``Runner.drop_steps``)."""
    from openjarvis.engine.torch import cuda_step

    if percent != CARVEOUT_DEFAULT and not 0 <= percent <= 100:
        raise ValueError(f"a carveout is a percentage 0-100 or {CARVEOUT_DEFAULT}, not {percent}")
    n = 0
    for name, ck in compiled_kernels(only):
        if ck.function is None:
            ck._init_handles()
        cuda_step.set_function_attribute(ck.function, cuda_step.FUNC_CARVEOUT, percent,
                                          f"carveout {percent} of {name}")
        n += 1
    return n


def compiled_kernels(only: Collection[str] | None = None) -> Iterator[tuple[str, Any]]:
    """(name, compiled kernel) for every specialization of this module's Triton functions
    compiled so far (``only``: of the functions of these names), for instruments that act on
    or read the compiled code (``set_carveout``, scripts/ptx_hints.py)."""
    from triton.runtime.jit import JITFunction

    for obj in list(globals().values()):
        if not isinstance(obj, JITFunction) or (only is not None and obj.__name__ not in only):
            continue
        for caches in list(obj.device_caches.values()):
            for ck in list(caches[0].values()):  # (the kernel cache: key -> CompiledKernel)
                yield obj.__name__, ck


def floor_shared(ck: Any, nbytes: int) -> None:
    """From now on launch compiled kernel ``ck`` with at least ``nbytes`` of dynamic shared
    memory a program (0: its own need again), used or not.

    Why: a kernel launched early (PDL) or while another's programs are still resident puts
    its programs wherever there is room, and fills the SMs it finds up to their limit: session
    20's traces found the 0.5B's one-token qkv on 70 SMs, 12 an SM, and its gate/up on 98, 16
    an SM, where 132 were there. Shared memory a program bounds how many share an SM, so
    ``nbytes`` sets the most an SM takes (``shared_floor_for``). Takes effect from the next
    launch (a step's warm-up run launches, the capture after it sees this). The setting lives
    on the compiled kernel, which every launch of the same specialization shares, so the
    launchers (``linear``, ``qkv_rope``, ``rope_kv``, ``_merge``) pass the floor as a
    constexpr too (``SMEM_FLOOR``): a floored launch compiles a kernel of its own and no other
    launch inherits its floor.
    Triton passes a kernel's shared memory at each launch from ``packed_metadata``
    (num_warps, num_ctas, shared); a Triton whose tuple differs is refused, not guessed at."""
    if ck is None or not hasattr(ck, "packed_metadata"):  # (the interpreter: no compiled kernel)
        return
    own = int(ck.metadata.shared)
    pm = tuple(ck.packed_metadata)
    want = max(own, nbytes)
    if len(pm) < 3 or not isinstance(pm[2], int) or pm[2] < own:
        raise RuntimeError(f"this Triton's packed launch metadata {pm} does not carry shared "
                           f"memory third; floor_shared cannot set it")
    if pm[2] == want:
        return
    if want > 48 * 1024:  # the driver allows past 48 KB only when asked
        from openjarvis.engine.torch import cuda_step

        if ck.function is None:
            ck._init_handles()
        cuda_step.set_function_attribute(ck.function, cuda_step.FUNC_MAX_DYNAMIC_SHARED, want,
                                          f"allowing {want} bytes of dynamic shared memory")
    ck.packed_metadata = (*pm[:2], want, *pm[3:])


def _floor_kw(smem: int) -> dict[str, int]:
    """A launch's ``SMEM_FLOOR`` constexpr: a floored launch (``smem`` > 0) compiles a kernel of
    its own, so its floor (``_floor``, after the launch) reaches no unfloored launch."""
    return {"SMEM_FLOOR": smem} if smem > 0 else {}


def _floor(ck: Any, smem: int) -> None:
    """After a launch made with ``_floor_kw(smem)``: its compiled kernel floored from the next
    launch on (``floor_shared``); nothing for an unfloored one."""
    if smem > 0:
        floor_shared(ck, smem)


@functools.cache
def floor_supported() -> bool:
    """Whether ``floor_shared`` works with this Triton and driver, found without compiling
    anything: the CUDA backend packs a kernel's launch metadata with shared memory third, and
    the driver library (``cuFuncSetAttribute``, for floors past 48 KB) loads. The tuned
    defaults that use floors (``tuning.VERIFY_SMEM_CAPS``) are left off where it does not, so a
    Triton that packs its metadata otherwise runs the step unfloored instead of failing."""
    try:
        from types import SimpleNamespace

        from triton.backends.nvidia.compiler import CUDABackend

        from openjarvis.engine.torch import cuda_step

        meta = SimpleNamespace(num_warps=4, num_ctas=1, shared=12345)
        packed = tuple(CUDABackend.pack_metadata(None, meta))
        cuda_step._driver()
    except Exception:  # noqa: BLE001 (any other layout or a missing driver: no floors)
        return False
    return len(packed) >= 3 and packed[2] == 12345


def shared_floor_for(per_sm: int, sm_bytes: int = 228 * 1024) -> int:
    """The shared memory a program that lets at most ``per_sm`` programs share an SM of
    ``sm_bytes`` (each program also takes 1 KB the system reserves), with no room to spare
    for one more: the smallest such amount, rounded up to 256 bytes."""
    if per_sm < 1:
        raise ValueError(f"per_sm must be at least 1, not {per_sm}")
    need = sm_bytes // (per_sm + 1) - 1024 + 1  # one more program must not fit
    return -(-need // 256) * 256


@contextmanager
def tracing(launches: int, progs: int, device: torch.device | str) -> Iterator[torch.Tensor]:
    """Trace the launches made while open (``TRACE``): the stamp buffer [launches * progs,
    ``TRACE_WIDTH``] (int64: ns stamps, then the SM; zeros where nothing stamped), reset
    whatever happens inside."""
    buf = torch.zeros(launches * progs, TRACE_WIDTH, dtype=torch.int64, device=device)
    TRACE.update(buf=buf, progs=progs, next=0)
    try:
        yield buf
    finally:
        TRACE.update(buf=None, progs=0, next=0)


#: The weight loads' cache policies ``_w_tile`` knows.
WEIGHT_CACHE = ("", "evict_first", "evict_last", ".cg")


def _check_evict(evict: str) -> None:
    if evict not in WEIGHT_CACHE:
        raise ValueError(f"evict (the weights' cache policy) must be one of {WEIGHT_CACHE}, "
                         f"not {evict!r}")


def _check_sem(atomic_sem: str) -> None:
    if atomic_sem not in ATOMIC_SEMS:
        raise ValueError(f"atomic_sem must be one of {ATOMIC_SEMS}, not {atomic_sem!r}")


def linear(
    x: torch.Tensor,  # [T, K]
    w: torch.Tensor,  # [N, K], or [2N, K] for SWIGLU
    out: torch.Tensor,  # [T, N]
    *,
    mode: int = STORE,
    norm: torch.Tensor | None = None,  # [K] RMSNorm weight: normalize x first
    bias: torch.Tensor | None = None,  # [N]
    eps: float = 1e-6,
    cfg: LinearConfig | None = None,
    pdl: int = 0,
    norm_scale: bool = True,  # False: multiply by the norm weight only (split-K safe)
    evict: str = "",  # cache policy of the weight loads: "", "evict_first" or ".cg"
    hand_out: NormHandoff | None = None,  # ADD into a residual: also hand it to the next norm
    hand_in: NormHandoff | None = None,  # x is hand_in.xg: normalize with its statistics
    smem: int = 0,  # at least this much shared memory a program (``floor_shared``)
    atomic_sem: str = "relaxed",  # split-K: memory semantics of the partials' atomics
) -> torch.Tensor:
    t, k = x.shape
    _check_sem(atomic_sem)
    _check_evict(evict)
    n = w.shape[0] // 2 if mode == SWIGLU else w.shape[0]
    cfg = cfg or default_linear_config(t, n, k, x.device.type == "cuda")
    if cfg.split_k > 1 and (mode != ADD or (norm is not None and norm_scale) or bias is not None
                            or out.dtype != torch.float32):
        raise ValueError("split_k > 1 needs mode=ADD into float32, without a norm scale or bias")
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    if mode == ARGMAX and (out.dtype != torch.float32 or tuple(out.shape) != (t, 2 * grid[0])
                           or not out.is_contiguous() or hand_out is not None):
        raise ValueError(f"an ARGMAX linear writes contiguous float32 partials [{t}, "
                         f"{2 * grid[0]}] (argmax_partials), two a program; got "
                         f"{out.dtype} {tuple(out.shape)}")
    hand = hand_out or hand_in
    if hand is not None:
        if norm is not None or (hand_out is not None) == (hand_in is not None):
            raise ValueError("a norm hand-off runs instead of a norm, one side at a time")
        if hand_out is not None and (mode != ADD or out.dtype != torch.float32
                                     or hand.ss_part.shape[1] != grid[0]):
            raise ValueError(f"a hand-off producer adds into a float32 residual with one "
                             f"statistics slot a program ({grid[0]}); got "
                             f"{hand.ss_part.shape[1]} slots")
        if hand_out is not None and cfg.split_k > 1 and (
                hand.count is None or tuple(hand.count.shape) != (grid[0],)
                or hand.count.dtype != torch.int32 or not hand.count.is_contiguous()
                or hand.count.device != out.device):
            raise ValueError(f"a split-K hand-off producer needs count: contiguous int32 zeros "
                             f"on the residual's device, one a column block ({grid[0]})")
        width = n if hand_out is not None else k
        if (tuple(hand.xg.shape) != (t, width) or hand.ss_part.shape[0] != t
                or not (hand.xg.is_contiguous() and hand.ss_part.is_contiguous())):
            raise ValueError(f"a hand-off needs contiguous xg [{t}, {width}] and ss_part "
                             f"[{t}, slots]; got {tuple(hand.xg.shape)} and "
                             f"{tuple(hand.ss_part.shape)}")
        if hand_in is not None and x.data_ptr() != hand.xg.data_ptr():
            raise ValueError("a hand-off consumer reads x from the hand-off (hand_in.xg)")
    hand_args = (
        hand.weight if hand else w, hand.xg if hand else w, hand.ss_part if hand else out,
        hand.xg.stride(0) if hand else 0, hand.ss_part.shape[1] if hand else 1,
        hand.count if hand is not None and hand.count is not None else out,
    )
    common = dict(
        MODE=mode, NORM=0 if norm is None else 1 if norm_scale else 2, BIAS=bias is not None,
        BLOCK_T=block_t(t), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        PDL=pdl, EVICT=evict, HAND=1 if hand_out else 2 if hand_in else 0,
        NP_BLOCK=triton.next_power_of_2(hand.ss_part.shape[1]) if hand else 1, SEM=atomic_sem,
        **({"ROWS": 1, "PREFETCH": int(cfg.prefetch), "SEG": cfg.segments,
            **({"LANES": 1} if cfg.lanes else {})}
           if cfg.rows and t == 1 else {}),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_launch(pdl),
        **_floor_kw(smem),
    )
    if cfg.swap and t > 1:
        if cfg.block_n < 16:
            raise ValueError("a swapped tile needs block_n >= 16 (it is the MMA's M)")
        kernel = _linear_swap_kernel
    else:
        kernel = _linear_kernel
    tr, trc = _trace(out)
    ck = kernel[grid](
        x, w, norm if norm is not None else w, bias if bias is not None else w, out,
        t, n, k, x.stride(0), out.stride(0), eps, *hand_args, *tr, **common, **trc,
    )
    _floor(ck, smem)
    return out


def argmax_partials(t: int, n: int, cfg: LinearConfig, device: torch.device | str) -> torch.Tensor:
    """The buffer an ``ARGMAX`` linear of ``n`` columns with tile ``cfg`` writes for ``t``
    tokens: per token, each program's largest value and its first column (float32 holds every
    column index of a vocabulary below 2^24 exactly)."""
    return torch.empty(t, 2 * triton.cdiv(n, cfg.block_n), dtype=torch.float32, device=device)


@triton.jit
def _argmax_merge_kernel(part_ptr, ids_ptr, host_ptr, feed_ptr, NP, stride_p, tr_ptr, tr_base,
                         BLOCK: tl.constexpr, PDL: tl.constexpr, HOST: tl.constexpr,
                         FEED: tl.constexpr, TRACE: tl.constexpr = 0):
    """Program = token: the largest of the ``NP`` programs' maxima and its column. The
    programs' columns rise with their index (``screen``'s rescoring interleaves them, but
    stays within one chunk, where the least column of equal maxima wins whatever the order)
    and each gave its first column of its maximum,
    so keeping the earlier chunk on equal values gives the first column overall, as
    ``torch.argmax`` and ``np.argmax`` do."""
    t = tl.program_id(0)
    _stamp(tr_ptr, tr_base, t, 0, TRACE)
    _gdc(PDL)
    _stamp(tr_ptr, tr_base, t, 1, TRACE)
    row = part_ptr + t * stride_p
    p = tl.arange(0, BLOCK)
    v = tl.load(row + 2 * p, mask=p < NP, other=float("-inf"))
    i = tl.load(row + 2 * p + 1, mask=p < NP, other=0.0)
    best = tl.max(v, 0)
    first = tl.min(tl.where(v == best, i, 3.0e38), 0)
    for p0 in range(BLOCK, NP, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        v = tl.load(row + 2 * p, mask=p < NP, other=float("-inf"))
        i = tl.load(row + 2 * p + 1, mask=p < NP, other=0.0)
        cm = tl.max(v, 0)
        ci = tl.min(tl.where(v == cm, i, 3.0e38), 0)
        first = tl.where(cm > best, ci, first)
        best = tl.maximum(best, cm)
    first = tl.where(first < 3.0e38, first, 0.0)  # (all NaN: still a column)
    _stamp(tr_ptr, tr_base, t, 2, TRACE)
    tl.store(ids_ptr + t, first.to(ids_ptr.dtype.element_ty))
    if HOST:  # page-locked host memory, written straight over the bus
        tl.store(host_ptr + t, first.to(host_ptr.dtype.element_ty))
    if FEED:  # the next step's input token (``Runner.draft``)
        tl.store(feed_ptr + t, first.to(feed_ptr.dtype.element_ty))
    _stamp(tr_ptr, tr_base, t, 3, TRACE)


def argmax_merge(partials: torch.Tensor, ids: torch.Tensor, pdl: int = 0,
                 host: torch.Tensor | None = None,
                 feed: torch.Tensor | None = None) -> torch.Tensor:
    """``ids [T]`` (int64) = each token's column of its largest value, from the partials of an
    ``ARGMAX`` linear (``argmax_partials``): the greedy token, with no logits written. ``host``
    (page-locked, [T] int64): written too, by the kernel itself (mapped memory), so that no
    copy follows it (``Runner.graph_io``). ``feed`` ([T] int64 on the device): written too, as
    the input token of the step that follows in the same graph (``Runner.draft``)."""
    t, width = partials.shape
    if width % 2 or ids.shape != (t,) or ids.dtype != torch.int64 or not partials.is_contiguous():
        raise ValueError(f"argmax_merge takes contiguous partials [T, 2 * programs] and int64 ids "
                         f"[T]; got {tuple(partials.shape)} and {ids.dtype} {tuple(ids.shape)}")
    if host is not None and (host.shape != (t,) or host.dtype != torch.int64
                             or not host.is_pinned()):
        raise ValueError(f"argmax_merge writes host ids into page-locked int64 [{t}]; got "
                         f"{host.dtype} {tuple(host.shape)}, pinned: {host.is_pinned()}")
    if feed is not None and (feed.shape != (t,) or feed.dtype != torch.int64
                             or feed.device != ids.device):
        raise ValueError(f"argmax_merge feeds int64 [{t}] on the ids' device; got "
                         f"{feed.dtype} {tuple(feed.shape)} on {feed.device}")
    block = min(2048, triton.next_power_of_2(width // 2))
    tr, trc = _trace(partials)
    _argmax_merge_kernel[(t,)](partials, ids, ids if host is None else host,
                               ids if feed is None else feed, width // 2, partials.stride(0),
                               *tr, BLOCK=block, PDL=_wait(pdl), HOST=host is not None,
                               FEED=feed is not None, num_warps=4, **_launch(pdl), **trc)
    return ids


#: ``screen_weights``' allowance, as a fraction of a row's norm, for what float32 arithmetic
#: adds to the bound: the screen's and the rescoring's sums of K products (each off by at most
#: ~K * 2^-24 of the sum of their magnitudes, taken here four times over), and the verify
#: steps' input split into two bfloat16 halves (2^-17 of x).
SCREEN_SLACK_PER_K = 4 * 2.0 ** -24
SCREEN_SLACK = 2.0 ** -14


@dataclass(frozen=True, slots=True)
class OutScreen:
    """The output matrix in int8 for an exact greedy pick that reads half its bytes.

    A greedy step needs only the largest logit, not all of them. Row v of W [V, K] is kept as
    ``q`` (int8, one ``scale`` a row: W_v ~ scale_v * q_v) and ``err_v`` = ||W_v - scale_v *
    q_v||_2 plus an allowance for float32 rounding (``SCREEN_SLACK``). For x = RMSNorm's
    h * g, Cauchy-Schwarz bounds each true logit: |W_v . x - scale_v q_v . x| <= err_v ||x||.
    So ``screen`` reads the int8 rows (1 byte a weight, against 2) and gives every row an
    upper and a lower bound; only rows whose upper bound reaches the largest lower bound can
    hold the maximum, and ``rescore`` computes those few exactly from the bfloat16 rows. The
    pick is the argmax of exact logits, not an approximation. Over 1,024 positions of real
    code the real pair's bounds leave 1 row to rescore at the median, 12-13 at the 99th
    percentile and 44 (0.5B) or 70 (1.5B) at most (scripts/screen_candidates.py; a scale a
    32 weights would leave fewer, for 6 % more bytes; int4 leaves thousands)."""

    q: torch.Tensor  # [V, K] int8
    scale: torch.Tensor  # [V] float32
    err: torch.Tensor  # [V] float32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.err))


def screen_weights(w: torch.Tensor, rows_at_once: int = 8192) -> OutScreen:
    """``OutScreen`` of W [V, K] (any float dtype), on W's device, a slice of rows at a time so
    that the float32 copy it works in stays small next to a 151,936-row vocabulary."""
    if w.dim() != 2 or not w.is_floating_point() or w.shape[0] == 0:
        raise ValueError(f"screen_weights takes a float matrix [V, K]; got {w.dtype} "
                         f"{tuple(w.shape)}")
    v, k = w.shape
    q = torch.empty(v, k, dtype=torch.int8, device=w.device)
    scale = torch.empty(v, dtype=torch.float32, device=w.device)
    err = torch.empty(v, dtype=torch.float32, device=w.device)
    slack = SCREEN_SLACK_PER_K * k + SCREEN_SLACK
    for r0 in range(0, v, rows_at_once):
        wf = w[r0 : r0 + rows_at_once].float()
        d = wf.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        qi = torch.round(wf / d[:, None]).clamp_(-127, 127)
        q[r0 : r0 + rows_at_once] = qi.to(torch.int8)
        scale[r0 : r0 + rows_at_once] = d
        err[r0 : r0 + rows_at_once] = ((wf - qi * d[:, None]).norm(dim=1)
                                       + slack * wf.norm(dim=1))
    if not bool(torch.isfinite(err).all()):
        raise ValueError("screen_weights: the output matrix holds a NaN or an infinity")
    return OutScreen(q, scale, err)


@triton.jit
def _screen_prep_kernel(x_ptr, g_ptr, lim_ptr, st_ptr, T, K, stride_x, eps, tr_ptr, tr_base,
                        BLOCK_K: tl.constexpr, PDL: tl.constexpr, TRACE: tl.constexpr = 0):
    """The screen's input, once a step (program = token), so that none of the screen's
    ~1,200 programs walks x itself before or after its weights stream (session 32 run 272:
    such walks held the 1.5B's screen at 94 µs against ~55 for its bytes): x = h * g as three
    int8 limbs [3, T, K] (``_screen_kernel``'s ``IMMA``), and 1/RMS, ||x|| (the screen on
    both paths and the rescoring take these two from here) and the limbs' scale at ``st``
    [T, 4]. One tile holds the whole row (``BLOCK_K`` >= K, which ``screen`` keeps to 8192),
    so x is read once: this launch sits between the last layer and the screen, and its
    latency is the step's."""
    t = tl.program_id(0)
    _stamp(tr_ptr, tr_base, t, 0, TRACE)
    _gdc(PDL)
    _stamp(tr_ptr, tr_base, t, 1, TRACE)
    rk = tl.arange(0, BLOCK_K)
    kmask = rk < K
    h = tl.load(x_ptr + t * stride_x + rk, mask=kmask, other=0.0).to(tl.float32)
    x = h * tl.load(g_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
    big = tl.max(tl.abs(x), 0)
    sc = tl.where(big > 1e-30, big / 127.0, 1.0)  # (a subnormal scale: 1/s would overflow)
    xs = x * (1.0 / sc)
    l1, f1 = _limb(xs)
    v = (xs - f1) * 254.0
    l2, f2 = _limb(v)
    l3, _ = _limb((v - f2) * 254.0)
    _stamp(tr_ptr, tr_base, t, 2, TRACE)
    tl.store(lim_ptr + t * K + rk, l1, mask=kmask)
    tl.store(lim_ptr + (T + t) * K + rk, l2, mask=kmask)
    tl.store(lim_ptr + (2 * T + t) * K + rk, l3, mask=kmask)
    tl.store(st_ptr + t * 4, tl.rsqrt(tl.sum(h * h, 0) / K + eps))
    # ||x|| from the scaled row (|xs| <= 127): x * x itself underflows for |x| below ~1e-19,
    # which would make the bound's width 0 and leave the true argmax unread
    tl.store(st_ptr + t * 4 + 1, sc * tl.sqrt(tl.sum(xs * xs, 0)))
    tl.store(st_ptr + t * 4 + 2, sc)
    tl.store(st_ptr + t * 4 + 3, 0.0)  # (unused: written so that the buffer is all defined)
    _stamp(tr_ptr, tr_base, t, 3, TRACE)


@triton.jit
def _limb(v):
    """v (|v| <= 127.5) rounded to the nearest integer, as int8 and as float32 (by the bits
    of 1.5 * 2^23 + v: no conversion instruction)."""
    y = v + 12582912.0
    f = y - 12582912.0
    i = (y.to(tl.int32, bitcast=True) - 0x4B400000).to(tl.int8)
    return i, f


@triton.jit
def _screen_imma(lim_ptr, q_ptr, rn, rt, nmask, tmask, T, K,
                 EVICT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """``_screen_kernel``'s ``IMMA`` sums: acc [BT, BN] = (x / s) . q_v for every row, exact to
    the limbs' 2^-23 (``_screen_prep_kernel`` wrote them; the rows past T load as zeros).

    Triton pipelines these loads into shared memory as ``cp.async`` copies, which Triton 3.6
    (the device's) issues without the weights' L2 ``evict_first`` hint (3.9 keeps it;
    ``scripts/ptx_hints.py``), so there the screen's int8 stream pushes the K/V cache out of
    L2: the 0.5B's next step then loses at short positions what the screen saves (session
    34, runs 285-288). Loading the tiles a tile ahead into registers instead, by loads that
    keep the hint, made the screen 2x slower (run 289: 131 against 63 µs, the 1.5B)."""
    a1 = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.int32)
    a2 = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.int32)
    a3 = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        q = _load_w(q_ptr + rn[:, None] * K + rk[None, :], nmask[:, None] & kmask[None, :],
                    EVICT)
        lp = lim_ptr + rt[:, None] * K + rk[None, :]
        lm = tmask[:, None] & kmask[None, :]
        a1 = tl.dot(q, tl.trans(tl.load(lp, mask=lm, other=0)), a1, out_dtype=tl.int32)
        a2 = tl.dot(q, tl.trans(tl.load(lp + T * K, mask=lm, other=0)), a2, out_dtype=tl.int32)
        a3 = tl.dot(q, tl.trans(tl.load(lp + 2 * T * K, mask=lm, other=0)), a3,
                    out_dtype=tl.int32)
    acc = (a1.to(tl.float32) + a2.to(tl.float32) * (1.0 / 254.0)
           + a3.to(tl.float32) * (1.0 / 64516.0))
    return tl.trans(acc)


@triton.jit
def _screen_float(x_ptr, g_ptr, q_ptr, q, rn, rt, nmask, tmask, K, stride_x,
                  EVICT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, HILO: tl.constexpr, CVT: tl.constexpr):
    """``_screen_kernel``'s float path (the interpreter's; ``SCREEN_IMMA`` 0): acc [BT, BN] =
    (h * g) . q_v, the int8 rows made float32; ``q``, the first tile, loaded by the caller
    before its PDL wait."""
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        if k0 > 0:
            q = _load_w(q_ptr + rn[:, None] * K + rk[None, :],
                        nmask[:, None] & kmask[None, :], EVICT)
        x = tl.load(x_ptr + rt[:, None] * stride_x + rk[None, :],
                    mask=tmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        x = x * tl.load(g_ptr + rk, mask=kmask, other=0.0).to(tl.float32)[None, :]
        if CVT:  # int8 -> float32 by its bits: 2^23 + 128 + q, less 2^23 + 128 (exact)
            qf = (q.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
        else:  # (the conversion instruction: a quarter of the FMAs' rate, ``SCREEN_CVT``)
            qf = q.to(tl.float32)
        if BLOCK_T == 1:
            acc += tl.sum(x * qf, axis=1)[None, :]
        elif HILO:
            qb = tl.trans(qf.to(tl.bfloat16))
            hi = x.to(tl.bfloat16)
            acc = tl.dot(hi, qb, acc)
            acc = tl.dot((x - hi.to(tl.float32)).to(tl.bfloat16), qb, acc)
        else:
            acc = tl.dot(x, tl.trans(qf), acc, input_precision="ieee")
    return acc


@triton.jit
def _screen_kernel(x_ptr, g_ptr, q_ptr, d_ptr, e_ptr, up_ptr, lo_ptr, lim_ptr, st_ptr, T, N, K,
                   stride_x, stride_up, stride_lo, tr_ptr, tr_base, BLOCK_T: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                   EVICT: tl.constexpr, HILO: tl.constexpr, CVT: tl.constexpr = 1,
                   IMMA: tl.constexpr = 0, TRACE: tl.constexpr = 0):
    """``OutScreen``'s first pass over rows ``pid * BLOCK_N``..: each token's bounds of each
    row's logit, the upper ones stored whole (``up`` [T, N]), the largest lower one a program
    (``lo`` [T, programs]). x = RMSNorm(h) as the output projection takes it (h * g, times
    1/RMS after the loop; 1/RMS and ||x|| are ``_screen_prep_kernel``'s). T > 1 multiplies
    through ``tl.dot``: with ``HILO`` (the GPU) x as two bfloat16 halves (x = hi + lo to
    2^-17) against the int8 rows made bfloat16 (exact), so the matrix instructions lose
    nothing the bound does not allow for; without (the interpreter), in float32.

    ``IMMA`` (the GPU's default, ``SCREEN_IMMA``): no weight is converted at all.
    ``_screen_prep_kernel`` has written x, scaled to 127 at its largest, as three int8 limbs
    (x / s = l1 + l2 / 254 + l3 / 254^2 to 2^-23 of the largest, inside ``SCREEN_SLACK``) and
    each token's 1/RMS, ||x|| and s; the int8 rows multiply the limbs through integer matrix
    instructions into exact int32 sums, the rows as M (``BLOCK_T`` >= 16)."""
    pid = tl.program_id(0)
    _stamp(tr_ptr, tr_base, pid, 0, TRACE)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rt = tl.arange(0, BLOCK_T)
    nmask = rn < N
    tmask = rt < T
    if IMMA:  # (its loop loads every tile itself, so Triton pipelines it)
        _gdc(PDL)
        _stamp(tr_ptr, tr_base, pid, 1, TRACE)
        acc = _screen_imma(lim_ptr, q_ptr, rn, rt, nmask, tmask, T, K, EVICT, BLOCK_T,
                           BLOCK_N, BLOCK_K)
    else:
        rk = tl.arange(0, BLOCK_K)
        q = _load_w(q_ptr + rn[:, None] * K + rk[None, :],
                    nmask[:, None] & (rk < K)[None, :], EVICT)  # (weights: before the wait)
        _gdc(PDL)
        _stamp(tr_ptr, tr_base, pid, 1, TRACE)
        acc = _screen_float(x_ptr, g_ptr, q_ptr, q, rn, rt, nmask, tmask, K, stride_x, EVICT,
                            BLOCK_T, BLOCK_N, BLOCK_K, HILO, CVT)
    _stamp(tr_ptr, tr_base, pid, 2, TRACE)
    _gdc_late(PDL)
    inv = tl.load(st_ptr + rt * 4, mask=tmask, other=0.0)  # (``_screen_prep_kernel``'s)
    xn = tl.load(st_ptr + rt * 4 + 1, mask=tmask, other=0.0)
    if IMMA:  # (the limbs' sums are of x / s)
        acc = acc * tl.load(st_ptr + rt * 4 + 2, mask=tmask, other=0.0)[:, None]
    d = tl.load(d_ptr + rn, mask=nmask, other=0.0)
    e = tl.load(e_ptr + rn, mask=nmask, other=0.0)
    s = acc * d[None, :] * inv[:, None]
    b = (inv * xn)[:, None] * e[None, :]
    tl.store(up_ptr + rt[:, None] * stride_up + rn[None, :], s + b,
             mask=tmask[:, None] & nmask[None, :])
    lo = tl.max(tl.where(nmask[None, :], s - b, float("-inf")), axis=1)
    tl.store(lo_ptr + rt * stride_lo + pid, lo, mask=tmask)
    _stamp(tr_ptr, tr_base, pid, 3, TRACE)


@triton.jit
def _rescore_kernel(x_ptr, g_ptr, w_ptr, up_ptr, lo_ptr, part_ptr, st_ptr, N, K, NLO, NPROG,
                    stride_x, stride_up, stride_lo, stride_p, tr_ptr, tr_base,
                    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
                    C: tl.constexpr, GRAIN: tl.constexpr, PDL: tl.constexpr,
                    TRACE: tl.constexpr = 0):
    """``OutScreen``'s second pass, program (p, token t) of ``NPROG`` a token: the largest
    lower bound over the screen's programs, then, of its ``BLOCK_R`` rows, those whose upper
    bound reaches it, their exact logits (bfloat16 rows . x in float32), ``C`` rows at a time
    in column order; the largest and its first column go to ``part`` as an ``ARGMAX``
    linear's program would put them, for ``argmax_merge``. Its rows are every ``NPROG``-th run
    of ``GRAIN`` (a 32-byte sector of bounds), so that neighbouring candidates, where a
    vocabulary keeps related tokens together, fall to different programs rather than queue
    in one. A program with no such row gives -inf at its first column (the largest lower
    bound is always some row's own, so some program has one; x = 0 makes every row one, and
    NaN none, so token 0). ``argmax_merge`` still gives
    the first column of equal maxima: with at most its 2,048 programs in one chunk, it takes
    the least column among them, whatever order the programs' columns are in."""
    p = tl.program_id(0)
    t = tl.program_id(1)
    tp = t * NPROG + p  # (the trace's record: every program of every token)
    _stamp(tr_ptr, tr_base, tp, 0, TRACE)
    _gdc(PDL)
    _stamp(tr_ptr, tr_base, tp, 1, TRACE)
    lp = tl.arange(0, BLOCK_P)
    lim = tl.max(tl.load(lo_ptr + t * stride_lo + lp, mask=lp < NLO, other=float("-inf")), 0)
    for p0 in range(BLOCK_P, NLO, BLOCK_P):
        lim = tl.maximum(lim, tl.max(tl.load(lo_ptr + t * stride_lo + p0 + lp,
                                             mask=p0 + lp < NLO, other=float("-inf")), 0))
    rk = tl.arange(0, BLOCK_K)
    kmask = rk < K
    h = tl.load(x_ptr + t * stride_x + rk, mask=kmask, other=0.0).to(tl.float32)
    inv = tl.load(st_ptr + t * 4)  # 1/RMS (``_screen_prep_kernel``'s, as the screen's bounds)
    x = h * tl.load(g_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
    j = tl.arange(0, BLOCK_R)
    r = ((j // GRAIN) * NPROG + p) * GRAIN + j % GRAIN  # (rising with j)
    u = tl.load(up_ptr + t * stride_up + r, mask=r < N, other=float("-inf"))
    cand = (u >= lim) & (r < N)
    n = tl.sum(cand.to(tl.int32), 0)
    slot_of = tl.cumsum(cand.to(tl.int32), 0) - 1
    best = tl.max(tl.full([C], float("-inf"), tl.float32), 0)
    first = tl.minimum(p * GRAIN, N - 1)
    for c0 in range(0, n, C):
        slot = c0 + tl.arange(0, C)
        row = tl.sum(tl.where(cand[:, None] & (slot_of[:, None] == slot[None, :]),
                              r[:, None], 0), axis=0)  # [C]: the candidates' columns, in order
        ok = slot < n
        w = tl.load(w_ptr + row[:, None] * K + rk[None, :], mask=ok[:, None] & kmask[None, :],
                    other=0.0).to(tl.float32)
        val = tl.where(ok, tl.sum(w * x[None, :], axis=1) * inv, float("-inf"))
        cm = tl.max(val, 0)
        ci = tl.min(tl.where(val == cm, row, 2147483647), 0)
        first = tl.where(cm > best, ci, first)
        best = tl.maximum(best, cm)
    _stamp(tr_ptr, tr_base, tp, 2, TRACE)
    tl.store(part_ptr + t * stride_p + 2 * p, best)
    tl.store(part_ptr + t * stride_p + 2 * p + 1, first.to(tl.float32))
    _stamp(tr_ptr, tr_base, tp, 3, TRACE)


#: ``screen``'s second pass: rows a program (a power of two; at most 2,048 programs, as
#: ``argmax_merge`` needs for the first of equal maxima), candidates rescored at once, and the
#: runs of rows its programs take in turn.
RESCORE_ROWS = 1024
RESCORE_AT_ONCE = 8
RESCORE_GRAIN = 8
#: The screen's lower bounds a rescoring program reads at once (it reads every screen
#: program's, 1,185 for the vocabulary in 128-row tiles); past it, a loop of such reads.
#: Session 34 run 285 (each pass alone): 2048 against 1024, the 1.5B's rescoring 6.53 ->
#: 6.17 µs at T = 1, 26.7 -> 24.3 at T = 9; the 0.5B's 4.60 -> 4.38, 15.1 -> 13.2.
RESCORE_LO_BLOCK = 2048
#: How the float path (``SCREEN_IMMA`` 0, the interpreter's) makes int8 weights float32: 1, by
#: their bits (an integer add and a float add); 0, the conversion instruction (session 32 run
#: 270: 218 against 177 µs for the 1.5B's screen).
SCREEN_CVT = 1
#: On the GPU, the screen multiplies the int8 rows by x's int8 limbs through integer matrix
#: instructions (``_screen_kernel``'s ``IMMA``); 0: float32 (T = 1) or bfloat16 halves; 2:
#: the integer path on the CPU too (tests: the interpreter runs it).
SCREEN_IMMA = 1


@dataclass(slots=True)
class ScreenBuffers:
    """What one greedy step's passes hand on: x's limbs [3, T, K] int8 (the integer path's)
    and per-token statistics [T, 4] (both paths'), the upper bounds [T, V], the largest lower bound of each
    screen program [T, programs], and ``rescore``'s partials [T, 2 * its programs]
    (``argmax_merge``'s input)."""

    up: torch.Tensor
    lo: torch.Tensor
    partials: torch.Tensor
    limbs: torch.Tensor
    stats: torch.Tensor


def screen_buffers(t: int, n: int, k: int, cfg: LinearConfig, device: torch.device | str,
                   rows: int = RESCORE_ROWS, up: torch.Tensor | None = None) -> ScreenBuffers:
    """``screen``'s buffers for T tokens, n rows of k and the screen tile ``cfg``; ``up``, the
    [T, n] float32 bounds, where the caller shares one buffer between step sizes (the
    Runner's scratch: the largest of them, 0.6 MB a token for the vocabulary)."""
    f32 = torch.float32
    return ScreenBuffers(up if up is not None else torch.empty(t, n, dtype=f32, device=device),
                         torch.empty(t, triton.cdiv(n, cfg.block_n), dtype=f32, device=device),
                         torch.empty(t, 2 * triton.cdiv(n, rows), dtype=f32, device=device),
                         torch.empty(3, t, k, dtype=torch.int8, device=device),
                         torch.empty(t, 4, dtype=f32, device=device))


def default_screen_config(t: int, on_gpu: bool = True) -> LinearConfig:
    """The screen's tile where ``tuning`` names none: on the GPU the integer path's, the
    rows as the matrix instructions' M (scripts/bench_screen.py --parts sweeps others)."""
    if not on_gpu:
        return LinearConfig(32, 64)
    return LinearConfig(128, 128, num_warps=4, num_stages=2)  # (run 277: s2 <= s3)


def screen(x: torch.Tensor, norm: torch.Tensor, scr: OutScreen, bufs: ScreenBuffers,
           w: torch.Tensor, *, eps: float = 1e-6, cfg: LinearConfig | None = None,
           pdl: int = 0, evict: str = "", rows: int = RESCORE_ROWS,
           at_once: int = RESCORE_AT_ONCE, passes: int = 3) -> torch.Tensor:
    """The greedy output projection through ``OutScreen`` (both passes): ``bufs.partials``
    for ``argmax_merge``, which then gives the same column as an ``ARGMAX`` linear over
    ``w`` (the bfloat16 rows ``scr`` was made from) up to float32 rounding between near-equal
    logits. ``pdl`` is the screen's mode (the limbs' kernel before it waits first and lets
    the screen go at once, or runs without PDL where ``pdl`` has none); the rescoring waits
    first and lets the merge go.
    ``passes`` (benchmarks): 1 launches the screen alone (with the limbs' kernel before it),
    2 the rescoring alone (on the statistics and bounds an earlier call left in ``bufs``)."""
    t, k = x.shape
    n = scr.q.shape[0]
    _check_evict(evict)
    cfg = cfg or default_screen_config(t, x.device.type == "cuda")
    if (scr.q.shape != (n, k) or w.shape[0] < n or w.shape[1] != k or not w.is_contiguous()
            or norm.shape != (k,) or not scr.q.is_contiguous()):
        raise ValueError(f"screen: x [T, {k}] needs an OutScreen of [V, {k}] int8 rows made "
                         f"from w's first V rows and a norm of [{k}]; got q "
                         f"{tuple(scr.q.shape)}, w {tuple(w.shape)}, norm {tuple(norm.shape)}")
    nprog = triton.cdiv(n, cfg.block_n)
    want = ((t, n), (t, nprog), (t, 2 * triton.cdiv(n, rows)), (3, t, k), (t, 4))
    bl = (bufs.up, bufs.lo, bufs.partials, bufs.limbs, bufs.stats)
    got = tuple(tuple(b.shape) for b in bl)
    dtypes = (torch.float32,) * 3 + (torch.int8, torch.float32)
    if got != want or not all(b.is_contiguous() and b.dtype == d
                              for b, d in zip(bl, dtypes, strict=True)):
        raise ValueError(f"screen: buffers for T = {t}, {n} rows of {k} and this tile are "
                         f"{want}, contiguous, float32 but the int8 limbs (screen_buffers); "
                         f"got {got}, {[str(b.dtype) for b in bl]}")
    if k > 8192:
        raise ValueError(f"screen: rows of {k} do not fit one rescoring tile (at most 8192)")
    if rows & (rows - 1) or rows < RESCORE_GRAIN or triton.cdiv(n, rows) > 2048:
        raise ValueError(f"screen: {rows} rows a rescoring program must be a power of two of "
                         f"at least {RESCORE_GRAIN}, and at most 2,048 programs ({n} rows)")
    imma = int(SCREEN_IMMA == 2 or (x.is_cuda and SCREEN_IMMA == 1))
    if passes & 1:
        # the statistics of both paths (and the integer path's limbs), in one place; it lets
        # the screen launch at its start (one program a token leaves the SMs free for
        # the screen's to wait on); the screen then runs in the caller's mode, so that with
        # PDL_LATE the rescoring's programs take no SM slots before the screen's loop is done
        ppdl = 1 if pdl % 4 in (1, 2) else 0
        tr, trc = _trace(bufs.stats)
        _screen_prep_kernel[(t,)](x, norm, bufs.limbs, bufs.stats, t, k, x.stride(0), eps, *tr,
                                  BLOCK_K=triton.next_power_of_2(k), PDL=ppdl,
                                  num_warps=4 if k <= 2048 else 8, **_launch(ppdl), **trc)
    if passes & 1:
        tr, trc = _trace(bufs.lo)
        _screen_kernel[(nprog,)](
            x, norm, scr.q, scr.scale, scr.err, bufs.up, bufs.lo, bufs.limbs, bufs.stats, t, n,
            k, x.stride(0), bufs.up.stride(0), bufs.lo.stride(0), *tr,
            BLOCK_T=max(16, block_t(t)) if imma else block_t(t), BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, PDL=pdl, EVICT=evict, HILO=x.is_cuda, CVT=SCREEN_CVT,
            IMMA=imma, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_launch(pdl),
            **trc)
    if not passes & 2:
        return bufs.partials
    rpdl = 1 if pdl % 4 in (1, 2) else 0
    nres = triton.cdiv(n, rows)
    tr, trc = _trace(bufs.partials)
    _rescore_kernel[(nres, t)](
        x, norm, w, bufs.up, bufs.lo, bufs.partials, bufs.stats, n, k, nprog, nres, x.stride(0),
        bufs.up.stride(0), bufs.lo.stride(0), bufs.partials.stride(0), *tr, BLOCK_R=rows,
        BLOCK_K=triton.next_power_of_2(k),
        BLOCK_P=min(RESCORE_LO_BLOCK, triton.next_power_of_2(nprog)),
        C=at_once, GRAIN=RESCORE_GRAIN, PDL=rpdl, num_warps=8 if k > 1024 else 4,
        **_launch(rpdl), **trc)
    return bufs.partials


def qkv_rope(
    x: torch.Tensor,  # [T, D] float32 residual
    wqkv: torch.Tensor,  # [(H + 2 Hkv) hd, D]
    norm: torch.Tensor,  # [D]
    bias: torch.Tensor,  # [(H + 2 Hkv) hd]
    rope: torch.Tensor,  # [n_pos, hd/2, 2] float32
    start: torch.Tensor,  # [1] int32/int64 on the device: position of x[0]
    q_out: torch.Tensor,  # [T, H, hd] float32
    k_cache: torch.Tensor,  # [Hkv, S, hd] (one layer)
    v_cache: torch.Tensor,  # [Hkv, S, hd]
    eps: float,
    block_p: int | None = None,
    block_k: int | None = None,
    num_warps: int = 4,
    pdl: int = 0,
    evict: str = "",
    smem: int = 0,  # at least this much shared memory a program (``floor_shared``)
) -> None:
    _check_evict(evict)
    t, k = x.shape
    n_head, hd = q_out.shape[1], q_out.shape[2]
    n_kv = k_cache.shape[0]
    bp = block_p or (4 if t == 1 and x.device.type == "cuda" else 16)
    bp = min(bp, hd // 2)
    grid = ((n_head + 2 * n_kv) * (hd // 2 // bp),)
    tr, trc = _trace(q_out)
    ck = _qkv_rope_kernel[grid](
        x, wqkv, norm, bias, rope, start, q_out, k_cache, v_cache,
        t, k, x.stride(0), k_cache.stride(0), k_cache.stride(1), eps, *tr,
        N_HEAD=n_head, N_KV=n_kv, HD=hd,
        BLOCK_T=block_t(t), BLOCK_P=bp, BLOCK_K=block_k or min(512, triton.next_power_of_2(k)),
        PDL=pdl, EVICT=evict, num_warps=num_warps, **_launch(pdl), **trc,
        **_floor_kw(smem),
    )
    _floor(ck, smem)


def qkv_split(
    x: torch.Tensor,  # [T, D] float32 residual
    wqkv: torch.Tensor,  # [(H + 2 Hkv) hd, D]
    norm: torch.Tensor,  # [D]
    bias: torch.Tensor,  # [(H + 2 Hkv) hd]
    rope: torch.Tensor,  # [n_pos, hd/2, 2] float32
    start: torch.Tensor,  # [1]
    q_out: torch.Tensor,  # [T, H, hd] float32
    k_cache: torch.Tensor,  # [Hkv, S, hd] (one layer)
    v_cache: torch.Tensor,
    acc: torch.Tensor,  # [T, (H + 2 Hkv) hd] float32, all zeros on entry (left zero on exit)
    eps: float,
    cfg: LinearConfig,
    pdl: int = 0,
    evict: str = "",
    pdl_rope: int | None = None,  # the second kernel's PDL mode; default: as ``pdl``
    rope_warps: int = 1,  # warps of each (token, head) program of the second kernel
    atomic_sem: str = "relaxed",
    smem: int = 0,  # shared-memory floors a program (``floor_shared``): the product's,
    rope_smem: int = 0,  # and the second kernel's
) -> None:
    """``qkv_rope`` for verify steps in two launches: a split-K product (many programs; the
    per-pair qkv kernel has only (heads x pairs / 16) of them at T > 1) and a small kernel that
    applies what does not distribute over the splits (1/RMS, bias, RoPE) and stores.

    The second kernel zeroes the product's values it has read, with no barrier between. Where
    a program has more threads than values, threads hold copies, and in another warp a copy
    could be read after its owner zeroed it (session 9 run 89 saw that race in a kernel since
    removed); within one warp the load and the store keep their order. So a (token, head)
    program has one warp, or at most as many as own hd / 2 values a thread (hd / 64)."""
    _check_evict(evict)
    hd = q_out.shape[2]
    if rope_warps < 1 or (rope_warps > 1 and rope_warps * 32 > hd // 2):
        raise ValueError(f"rope_warps must be 1, or at most {max(1, hd // 64)} for head "
                         f"dimension {hd} (no thread of another warp may hold a copy of a value "
                         f"the kernel zeroes); got {rope_warps}")
    linear(x, wqkv, acc, mode=ADD, norm=norm, eps=eps, cfg=cfg, pdl=pdl, norm_scale=False,
           evict=evict, atomic_sem=atomic_sem, smem=smem)
    rope_kv(acc, x, bias, rope, start, q_out, k_cache, v_cache, eps,
            pdl=pdl if pdl_rope is None else pdl_rope, num_warps=rope_warps, smem=rope_smem)


def rope_kv(
    qkv: torch.Tensor,  # [T, (H + 2 Hkv) hd]: (x * g) @ Wqkv^T, without 1/RMS or bias
    h: torch.Tensor,  # [T, D] float32 residual (its 1/RMS)
    bias: torch.Tensor,  # [(H + 2 Hkv) hd]
    rope: torch.Tensor,  # [n_pos, hd/2, 2] float32
    start: torch.Tensor,  # [1]
    q_out: torch.Tensor,  # [T, H, hd] float32
    k_cache: torch.Tensor,  # [Hkv, S, hd] (one layer)
    v_cache: torch.Tensor,
    eps: float,
    pdl: int = 0,
    num_warps: int = 1,
    inv: torch.Tensor | None = None,  # [T] float32: each row's 1/RMS, instead of h's own
    zero: bool = True,  # zero what it read of qkv (a split-K accumulator)
    smem: int = 0,  # at least this much shared memory a program (``floor_shared``)
) -> None:
    """Finish a qkv product made without the norm's 1/RMS (a split-K one, or the wide step's
    cuBLAS one): scale, add the bias, RoPE q and k, store q and the cache. With ``zero``,
    zeroes what it read of ``qkv``, so a split-K accumulator is ready for the next layer."""
    t, d = h.shape
    n_head, hd = q_out.shape[1], q_out.shape[2]
    n_kv = k_cache.shape[0]
    if tuple(qkv.shape) != (t, (n_head + 2 * n_kv) * hd) or not qkv.is_contiguous():
        raise ValueError(f"rope_kv: qkv must be contiguous [{t}, {(n_head + 2 * n_kv) * hd}]; "
                         f"got {tuple(qkv.shape)}")
    if inv is not None and (tuple(inv.shape) != (t,) or inv.dtype != torch.float32):
        raise ValueError(f"rope_kv: inv holds each row's 1/RMS, float32 [{t}]; got "
                         f"{inv.dtype} {tuple(inv.shape)}")
    tr, trc = _trace(qkv)
    ck = _rope_kv_kernel[(t, n_head + 2 * n_kv)](
        qkv, h if inv is None else inv, bias, rope, start, q_out, k_cache, v_cache,
        d, k_cache.stride(0), k_cache.stride(1), eps, *tr,
        N_HEAD=n_head, N_KV=n_kv, HD=hd, BLOCK_D=min(2048, triton.next_power_of_2(d)),
        PDL=_wait(pdl), num_warps=num_warps, **_launch(pdl), **trc,
        **({"INV": 1} if inv is not None else {}), **({} if zero else {"ZERO": 0}),
        **_floor_kw(smem),
    )
    _floor(ck, smem)


def attention(
    q: torch.Tensor,  # [T, H, hd] float32, RoPE applied
    k_cache: torch.Tensor,  # [Hkv, S, hd]
    v_cache: torch.Tensor,  # [Hkv, S, hd]
    start: torch.Tensor,  # [1]: q[t] sits at position start + t and sees keys 0..start+t
    out: torch.Tensor,  # [T, H * hd]
    o_part: torch.Tensor,  # [NSPLIT, T, H, hd] float32 scratch
    ml_part: torch.Tensor,  # [NSPLIT, T, H, 2] float32 scratch
    block_s: int = 64,
    num_warps: int = 4,
    pdl: int = 0,
    pdl_combine: int | None = None,  # the merge kernel's PDL mode; default: as ``pdl``
    combine_warps: int = 1,  # warps of each program of the merge
    trim: bool = True,  # the merge reads only the splits that hold keys
    combine_cols: int = 1,  # programs of the merge a (token, head), each hd / this columns
    combine_smem: int = 0,  # the merge's programs: at least this much shared memory each
) -> torch.Tensor:
    """Attention of T query tokens over the cache in two launches: partials per (kv head,
    split), then their merge."""
    t, n_head, hd = q.shape
    width = hd // max(combine_cols, 1)
    if combine_cols < 1 or hd % combine_cols or (combine_cols > 1 and width & (width - 1)):
        raise ValueError(f"combine_cols must divide the head dimension {hd} into a power of "
                         f"two; got {combine_cols}")
    n_kv = k_cache.shape[0]
    g = n_head // n_kv
    nsplit = o_part.shape[0]
    block_r = max(16, triton.next_power_of_2(t * g))
    num_warps = num_warps if block_r <= 32 else 8
    tr, trc = _trace(out)
    _attn_split_kernel[(n_kv, nsplit)](
        q, k_cache, v_cache, start, o_part, ml_part,
        t, k_cache.stride(0), k_cache.stride(1), hd**-0.5, *tr,
        N_HEAD=n_head, G=g, HD=hd, NSPLIT=nsplit,
        BLOCK_R=block_r, BLOCK_S=block_s, PDL=_wait(pdl), TRIM=trim, num_warps=num_warps,
        **_launch(pdl), **trc,
    )
    return _merge(o_part, ml_part, out, start, block_s,
                  pdl=pdl if pdl_combine is None else pdl_combine, trim=trim,
                  num_warps=combine_warps, cols=combine_cols, smem=combine_smem)


def _merge(o_part: torch.Tensor, ml_part: torch.Tensor, out: torch.Tensor, start: torch.Tensor,
           block_s: int, *, pdl: int = 0, trim: bool = True, num_warps: int = 1,
           cols: int = 1, smem: int = 0) -> torch.Tensor:
    """The attention's second launch (``attention``, ``attention_wide``): the splits'
    partials ``o_part`` [NSPLIT, T, H, hd] and ``ml_part`` merged into ``out`` [T, H * hd],
    ``cols`` programs a (token, head); ``smem``: a shared-memory floor a program
    (``floor_shared``)."""
    nsplit, t, n_head, hd = o_part.shape
    tr, trc = _trace(out)
    ck = _attn_combine_kernel[(t * n_head, cols)](
        o_part, ml_part, out, start, t, *tr, N_HEAD=n_head, HD=hd, NSPLIT=nsplit,
        BLOCK_S=block_s, PDL=_wait(pdl), TRIM=trim, num_warps=num_warps,
        HDC=hd // cols if cols > 1 else 0, **_launch(pdl), **trc,
        **_floor_kw(smem),
    )
    _floor(ck, smem)
    return out


#: The wide step's attention: query tokens a program (``_attn_wide_kernel``), at most
#: ``WIDE_ROWS`` query rows (tokens x the group's heads) a tile (bench_wide.py
#: --sweep-attention, H200, 8 splits: 128 and 64 even for the 1.5B, 128 faster for the 0.5B
#: by 0.4-1.0 µs; 32 slower by 3-14 µs).
WIDE_ROWS = 128


def attention_wide(
    q: torch.Tensor,  # [T, H, hd] float32, RoPE applied
    k_cache: torch.Tensor,  # [Hkv, S, hd]
    v_cache: torch.Tensor,  # [Hkv, S, hd]
    start: torch.Tensor,  # [1]: q[t] sits at position start + t and sees keys 0..start+t
    out: torch.Tensor,  # [T, H * hd]
    o_part: torch.Tensor,  # [NSPLIT, T, H, hd] float32 scratch
    ml_part: torch.Tensor,  # [NSPLIT, T, H, 2] float32 scratch
    block_s: int = 64,
    rows: int = 0,  # query rows a tile at most (0: ``WIDE_ROWS``)
    num_stages: int = 0,  # the key loop's pipeline depth (0: Triton's default)
    seen: bool = True,  # the key blocks every row sees without masks
) -> torch.Tensor:
    """``attention`` for a long run of query tokens (a wide step's, 128 to 1,024 of a
    prompt's): the splits of the sequence as there, and the tokens in blocks, so that no tile
    holds more than ``rows`` query rows; then the same merge."""
    t, n_head, hd = q.shape
    n_kv = k_cache.shape[0]
    g = n_head // n_kv
    nsplit = o_part.shape[0]
    rows = rows or WIDE_ROWS
    if (tuple(out.shape) != (t, n_head * hd) or not (q.is_contiguous() and out.is_contiguous())
            or nsplit & (nsplit - 1)):
        raise ValueError(f"attention_wide: contiguous q [{t}, {n_head}, {hd}] and out "
                         f"[{t}, {n_head * hd}], splits a power of two; got out "
                         f"{tuple(out.shape)}, {nsplit} splits")
    if g > rows or tuple(o_part.shape) != (nsplit, t, n_head, hd) or tuple(
            ml_part.shape) != (nsplit, t, n_head, 2):
        raise ValueError(f"attention_wide: partials [splits, {t}, {n_head}, {hd}] and "
                         f"[splits, {t}, {n_head}, 2], a group of at most {rows} heads; "
                         f"got {tuple(o_part.shape)}, {tuple(ml_part.shape)}")
    block_q = rows // g
    block_q = 1 << (block_q.bit_length() - 1)  # (a power of two: whole blocks of a run)
    block_r = max(16, triton.next_power_of_2(block_q * g))
    _attn_wide_kernel[(n_kv, nsplit, triton.cdiv(t, block_q))](
        q, k_cache, v_cache, start, o_part, ml_part, t, k_cache.stride(0), k_cache.stride(1),
        hd**-0.5, N_HEAD=n_head, G=g, HD=hd, NSPLIT=nsplit, BLOCK_Q=block_q, BLOCK_R=block_r,
        BLOCK_S=block_s, SEEN=seen, num_warps=8 if block_r > 64 else 4,
        **({"num_stages": num_stages} if num_stages else {}),
    )
    return _merge(o_part, ml_part, out, start, block_s)


def residual_norm(h: torch.Tensor, y: torch.Tensor | None, g: torch.Tensor, xg: torch.Tensor,
                  inv: torch.Tensor, eps: float) -> None:
    """The wide step between its products, one launch: ``h [T, D]`` (float32) += ``y`` (a
    product's rows; None: nothing to add), ``xg`` = h * g (the next product's input, in its
    dtype) and ``inv [T]`` = each row's 1/RMS, which that product's consumer applies
    (``rope_kv``, ``swiglu_rows``)."""
    t, d = h.shape
    if (h.dtype != torch.float32 or tuple(xg.shape) != (t, d) or tuple(g.shape) != (d,)
            or tuple(inv.shape) != (t,) or inv.dtype != torch.float32
            or (y is not None and tuple(y.shape) != (t, d))
            or not all(x.is_contiguous() for x in (h, xg, inv, *([] if y is None else [y])))):
        raise ValueError(f"residual_norm: contiguous float32 h [{t}, {d}], y and xg of its "
                         f"shape, g [{d}] and float32 inv [{t}]; got h {h.dtype} "
                         f"{tuple(h.shape)}, xg {tuple(xg.shape)}, g {tuple(g.shape)}, inv "
                         f"{inv.dtype} {tuple(inv.shape)}")
    _residual_norm_kernel[(t,)](h, h if y is None else y, g, xg, inv, d, eps, ADD=y is not None,
                                BLOCK_D=min(4096, triton.next_power_of_2(d)), num_warps=4)


def swiglu_rows(gu: torch.Tensor, inv: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    """``act [T, F]`` = SiLU(gate * inv) * (up * inv) of ``gu [T, 2F]`` = (h * g) @ W13^T and
    ``inv [T]`` = 1/RMS(h) (the wide step's feed-forward, its product made by cuBLAS without
    the norm's 1/RMS)."""
    t, f = act.shape
    if tuple(gu.shape) != (t, 2 * f) or tuple(inv.shape) != (t,) or (
            inv.dtype != torch.float32) or not (gu.is_contiguous() and act.is_contiguous()):
        raise ValueError(f"swiglu_rows: contiguous gu [{t}, {2 * f}], float32 inv [{t}], act "
                         f"[{t}, {f}]; got {tuple(gu.shape)}, {tuple(inv.shape)}, "
                         f"{tuple(act.shape)}")
    block_f = min(1024, triton.next_power_of_2(f))
    _swiglu_rows_kernel[(t, triton.cdiv(f, block_f))](gu, inv, act, f, BLOCK_F=block_f,
                                                      num_warps=4)
    return act


def attention_out(
    q: torch.Tensor,  # [1, H, hd] float32, RoPE applied
    k_cache: torch.Tensor,  # [Hkv, S, hd]
    v_cache: torch.Tensor,  # [Hkv, S, hd]
    start: torch.Tensor,  # [1]
    wo: torch.Tensor,  # [D, H * hd]
    h: torch.Tensor,  # [1, D] float32 residual: h += attention(q) @ wo^T
    o_part: torch.Tensor,  # [NSPLIT, 1, H, hd] float32 scratch
    ml_part: torch.Tensor,  # [NSPLIT, 1, H, 2] float32 scratch
    block_s: int = 64,
    block_n: int = 128,
    pdl: int = 0,
    trim: bool = True,
    atomic_sem: str = "relaxed",
) -> torch.Tensor:
    """The one-token step's attention and o-projection in two launches instead of three
    (``pdl`` and ``trim`` as in ``attention``)."""
    t, n_head, hd = q.shape
    if t != 1 or h.dtype != torch.float32:
        raise ValueError("attention_out serves the one-token step into a float32 residual")
    _check_sem(atomic_sem)
    n_kv = k_cache.shape[0]
    nsplit = o_part.shape[0]
    tr, trc = _trace(o_part)
    _attn_split_kernel[(n_kv, nsplit)](
        q, k_cache, v_cache, start, o_part, ml_part,
        1, k_cache.stride(0), k_cache.stride(1), hd**-0.5, *tr,
        N_HEAD=n_head, G=n_head // n_kv, HD=hd, NSPLIT=nsplit,
        BLOCK_R=max(16, triton.next_power_of_2(n_head // n_kv)), BLOCK_S=block_s,
        PDL=_wait(pdl), TRIM=trim, num_warps=4, **_launch(pdl), **trc,
    )
    n = wo.shape[0]
    _attn_out_kernel[(triton.cdiv(n, block_n), n_head)](
        o_part, ml_part, wo, h, start, n, wo.shape[1],
        N_HEAD=n_head, HD=hd, NSPLIT=nsplit, BLOCK_N=block_n, BLOCK_S=block_s, PDL=_wait(pdl),
        TRIM=trim, SEM=atomic_sem, num_warps=4, **_launch(pdl),
    )
    return h


def embed(
    tokens: torch.Tensor, emb: torch.Tensor, h: torch.Tensor, pdl: int = 0
) -> torch.Tensor:
    """``h [T, D]`` float32 = ``emb [V, D]`` rows of ``tokens [T]``."""
    d = emb.shape[1]
    _embed_kernel[(tokens.shape[0],)](
        tokens, emb, h, d, BLOCK_D=min(1024, triton.next_power_of_2(d)), PDL=_wait(pdl),
        **_launch(pdl),
    )
    return h


def l2_prefetch(w: torch.Tensor, starts: tuple[int, ...], count: int, programs: int) -> None:
    """Ask L2 for ``count`` elements of ``w`` from each element offset in ``starts`` (one or
    two regions), spread over ``programs`` programs a region; returns once the launch is
    queued (the GPU).

    Runs on a side stream of a one-token step (``Runner.l2_prefetch``), so that the latency-
    bound chain of qkv, attention and o-projection, which leaves DRAM idle, is not what waits
    for it (sessions 3-10 asked from the kernels of that chain, and lost)."""
    if not 1 <= len(starts) <= 2 or not w.is_contiguous() or count <= 0 or programs <= 0 or any(
            s < 0 or s + count > w.numel() for s in starts):
        raise ValueError(f"an L2 prefetch takes one or two regions of {count} elements inside "
                         f"a contiguous tensor of {w.numel()}, from programs > 0 ({programs}); "
                         f"got starts {starts}")
    if w.device.type != "cuda":
        raise ValueError("an L2 prefetch needs the GPU (the interpreter has no inline assembly)")
    line = 128 // w.element_size()
    n_lines = triton.cdiv(count, line)
    block = 128
    per = triton.cdiv(n_lines, programs * block)
    _l2_prefetch_kernel[(programs, len(starts))](w, starts[0], starts[-1], n_lines, LINE=line,
                                                 BLOCK=block, PER=per, num_warps=4)
