"""What would the one-token products cost reading the GGUF's own Q4_K blocks instead of bf16?

The default pair's 1.5B file holds gate, up, q, k and the o-projection as Q4_K, and half the
layers' down and v projections (the rest Q6_K): 144 bytes a block of 256 weights, 0.5625 bytes a
weight against bf16's 2. The backend decodes every block to bf16 on load (issue 7 asks for bf16
on the GPU), so each step reads 3.6x the bytes the file holds. Issue 7's floor is bf16 bytes over
copy bandwidth; this instrument asks a different question, how far under that floor a step could
go by reading what the file holds, so the team can weigh a quantized path against the
persistent kernel the notes name for the bf16 goals.

Each kernel here reads a matrix's blocks as the file lays them out (a row is K / 256 blocks of
[f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles]), several blocks an
iteration, split over K where a row is long, and decodes in registers to what dequant.py's
``_q4_k`` (llama.cpp's arithmetic) gives, in two ways. The byte forms build each weight,
float32 ``d * scale * q - dmin * min``, and multiply it by x. The word forms never build a
weight: they sum q * x and x over each sub-block of 32 and apply ``d * scale`` and
``dmin * min`` once to those sums, so a weight costs a float32 multiply-add with x, an add and
a few integer operations (a nibble made a float by its bits, 2^23 + q less 2^23, rather than by a
conversion instruction, which runs at a quarter of the FMA rate on sm_90). Timed in the chain
bench_gateup.py uses (a CUDA graph of L launches, each over a copy of the weights of its own,
L x bytes past L2, each waiting for the one before through PDL), against:

    ours    today's bf16 product (``kernels.linear``, the tuned one-token tile), waiting first
            (pdl 1) or its first tile loaded before the wait (pdl 2)
    read    bench_read_size's pure read of the bf16 bytes, its best tile (bf16's ceiling)
    read4   the same pure read of the Q4_K bytes: a Q4_K product's ceiling

and the Q4_K products named by ``--variants`` (tiles swept: rows a program, blocks an
iteration, split, warps; ``pre``: the first blocks loaded before the wait; ``pdl``: waiting
first):

    q4k     a word form, x read in eight strided loads a block (run 229); ``pre`` swept, then
            its six best tiles ``pdl``
    q4kx    a word form with x in nibble order (``nibble_order``) and every tensor of its loop
            in the nibble words' layout, so nothing in the loop passes through shared memory
            (run 229); ``pdl``
    q4kb    the byte form, nibbles loaded as bytes and made floats by conversion instructions
            (run 228; its results were written under ``q4k_*`` then); ``pre``
    q4kbm   the byte form with the nibbles made floats by their bits; ``pre``

Products: the 1.5B's gate/up (SwiGLU over both halves, 2 x 8960 rows of 1536) and its down
projection (1536 rows of 8960) and o-projection (1536 x 1536); the 0.5B's down projection (its
other layer matrices are Q5_0 and Q8_0, rows of 896, which no 256-weight block divides). Every
product is checked against a float32 product over dequant.py's decode of the same blocks
(outputs poisoned first) before it is timed. Random blocks: random bytes, with d and dmin set to
small positive float16 values (weights within about -0.013 to +0.2).

An instrument, not a backend: a chain of one kernel does not show what its neighbours in a step
would take from it (session 21), and the verify steps' MMA tiles would need their own decode.
Run on the lent GPU: ``python3 scripts/bench_q4k.py --out DIR [--variants q4k,q4kx,q4kb,q4kbm]``
(DIR/q4k.json; by default q4k and q4kx).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_read_size  # noqa: E402
from bench_gateup import chain_us  # noqa: E402
from bench_read_size import CHAIN_BYTES, best, choices  # noqa: E402

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B  # noqa: E402
from openjarvis.engine.torch.dequant import QK_K, _q4_k  # noqa: E402
from openjarvis.engine.torch.tuning import tuned_configs  # noqa: E402

BLOCK_BYTES = 144  # a Q4_K block: 256 weights
#: (model, product) -> (rows N, columns K, SwiGLU over [2N, K]); names as ``tuning.TUNED``'s.
PRODUCTS: dict[tuple[str, str], tuple[int, int, bool]] = {
    ("1.5B", "w13"): (QWEN25_1_5B.n_ff, QWEN25_1_5B.n_embd, True),
    ("1.5B", "w2"): (QWEN25_1_5B.n_embd, QWEN25_1_5B.n_ff, False),
    ("1.5B", "wo"): (QWEN25_1_5B.n_embd, QWEN25_1_5B.n_embd, False),
    ("0.5B", "w2"): (QWEN25_0_5B.n_embd, QWEN25_0_5B.n_ff, False),
}
ARGS = {"0.5B": QWEN25_0_5B, "1.5B": QWEN25_1_5B}
MODES = {"pdl": 1, "pre": 3}


@triton.jit
def _headers(hw, bm):
    """The four header words of the blocks at int32 pointers ``hw`` (masked by ``bm``)."""
    w0 = tl.load(hw, mask=bm, other=0)
    w1 = tl.load(hw + 1, mask=bm, other=0)
    w2 = tl.load(hw + 2, mask=bm, other=0)
    w3 = tl.load(hw + 3, mask=bm, other=0)
    return w0, w1, w2, w3


@triton.jit
def _d_dmin(w0):
    """A block's float16 d and dmin (word 0's low and high halves) as float32."""
    d = (w0 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = (w0 >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return d, dmin


@triton.jit
def _chunk_loads(rw, b0, NB, BB: tl.constexpr, woff):
    """Blocks b0 .. b0 + BB - 1 (those past ``NB`` masked to zero) of the rows at int32
    pointers ``rw`` ([RB]): the nibbles as words [RB, BB, 4, 8] (word 8j + i holds bytes
    32j + 4i .. 32j + 4i + 3; byte 32j + l holds weight 64j + l low and 64j + 32 + l high), and
    the headers' four words [RB, BB] (d | dmin << 16, then the 12 bytes of scales and mins)."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NB)[None, :]
    hw = rw[:, None] + bb[None, :] * 36
    q = tl.load(hw[:, :, None, None] + woff[None, None, :, :], mask=bm[:, :, None, None],
                other=0, eviction_policy="evict_first")
    w0, w1, w2, w3 = _headers(hw, bm)
    return q, w0, w1, w2, w3


@triton.jit
def _scale_min(w1, w2, w3, g):
    """Sub-blocks ``g``'s ([4], 0-7) 6-bit scale and min from the header words [RB, BB], as
    float32 [RB, BB, 4] (``_scale_min3``)."""
    return _scale_min3(w1[:, :, None], w2[:, :, None], w3[:, :, None], g[None, None, :])


@triton.jit
def _nibble(q, shift: tl.constexpr):
    """Nibbles at ``shift`` of each word as float32 without a conversion instruction (a
    quarter-rate I2F on sm_90): the bits of 2^23 + n, less 2^23 (exact)."""
    return (((q >> shift) & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _chunk_fma(q, w0, w1, w2, w3, j, x_ptr, b0, NB, BB: tl.constexpr, xoff, acc):
    """acc [RB, BB, 4] += each sub-block pair's d * scale * (q . x) - dmin * min * sum(x), low
    and high nibbles (sub-blocks 2j and 2j + 1): a float32 multiply-add a weight."""
    bb = b0 + tl.arange(0, BB)
    xm = (bb < NB)[:, None, None]
    xp = x_ptr + bb[:, None, None] * 256 + xoff[None, :, :]  # [BB, 4, 8]: x[64j + 4i]
    dot_lo = tl.zeros(q.shape, tl.float32)
    dot_hi = tl.zeros(q.shape, tl.float32)
    xs_lo = tl.zeros([BB, 4, 8], tl.float32)
    xs_hi = tl.zeros([BB, 4, 8], tl.float32)
    for k in tl.static_range(4):
        x_lo = tl.load(xp + k, mask=xm, other=0.0)
        x_hi = tl.load(xp + 32 + k, mask=xm, other=0.0)
        dot_lo += _nibble(q, 8 * k) * x_lo[None, :, :, :]
        dot_hi += _nibble(q, 8 * k + 4) * x_hi[None, :, :, :]
        xs_lo += x_lo
        xs_hi += x_hi
    d, dmin = _d_dmin(w0)
    sc_lo, mn_lo = _scale_min(w1, w2, w3, 2 * j)
    sc_hi, mn_hi = _scale_min(w1, w2, w3, 2 * j + 1)
    acc += d[:, :, None] * (sc_lo * tl.sum(dot_lo, axis=3) + sc_hi * tl.sum(dot_hi, axis=3))
    acc -= dmin[:, :, None] * (mn_lo * tl.sum(xs_lo, axis=2)[None, :, :]
                               + mn_hi * tl.sum(xs_hi, axis=2)[None, :, :])
    return acc


@triton.jit
def _chunk_xp(rw, x_ptr, b0, NB, BB: tl.constexpr, RB: tl.constexpr, woff, j, i8, acc):
    """``_chunk_loads`` + ``_chunk_fma`` with every tensor in the layout of the nibble words
    [RB, BB, 4, 8], so that nothing in the loop passes through shared memory: x is read in
    nibble order (``nibble_order``: [b, h, k, j, i] = x[256b + 64j + 32h + 4i + k]) straight into
    that layout, and the header words come as a [RB, BB, 4, 8] load of words i % 4, each then
    picked out by a sum over i (one thread holds it, one shuffle)."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NB)[None, :, None, None]
    hw = (rw[:, None] + bb[None, :] * 36)[:, :, None, None]
    q = tl.load(hw + woff[None, None, :, :], mask=bm, other=0, eviction_policy="evict_first")
    hdr = tl.load(hw + (i8 % 4)[None, None, None, :] + 0 * j[None, None, :, None], mask=bm,
                  other=0)
    ii = i8[None, None, None, :]
    w0 = tl.sum(tl.where(ii == 0, hdr, 0), axis=3)
    w1 = tl.sum(tl.where(ii == 1, hdr, 0), axis=3)
    w2 = tl.sum(tl.where(ii == 2, hdr, 0), axis=3)
    w3 = tl.sum(tl.where(ii == 3, hdr, 0), axis=3)
    xp = (x_ptr + (bb * 256)[None, :, None, None] + (j[:, None] * 8 + i8[None, :])[None, None]
          + tl.zeros([RB, 1, 1, 1], tl.int32))
    dot_lo = tl.zeros([RB, BB, 4, 8], tl.float32)
    dot_hi = tl.zeros([RB, BB, 4, 8], tl.float32)
    xs_lo = tl.zeros([RB, BB, 4, 8], tl.float32)
    xs_hi = tl.zeros([RB, BB, 4, 8], tl.float32)
    for k in tl.static_range(4):
        x_lo = tl.load(xp + 32 * k, mask=bm, other=0.0)
        x_hi = tl.load(xp + 128 + 32 * k, mask=bm, other=0.0)
        dot_lo += _nibble(q, 8 * k) * x_lo
        dot_hi += _nibble(q, 8 * k + 4) * x_hi
        xs_lo += x_lo
        xs_hi += x_hi
    d, dmin = _d_dmin(w0)
    g = j[None, None, :]
    sc_lo, mn_lo = _scale_min3(w1, w2, w3, 2 * g)
    sc_hi, mn_hi = _scale_min3(w1, w2, w3, 2 * g + 1)
    acc += d * (sc_lo * tl.sum(dot_lo, axis=3) + sc_hi * tl.sum(dot_hi, axis=3))
    acc -= dmin * (mn_lo * tl.sum(xs_lo, axis=3) + mn_hi * tl.sum(xs_hi, axis=3))
    return acc


@triton.jit
def _scale_min3(w1, w2, w3, g):
    """Sub-blocks ``g``'s 6-bit scale and min (ggml's get_scale_min_k4) from the header words
    (bytes s[0:4], s[4:8], s[8:12]), all broadcast to one shape, as float32."""
    sh = 8 * (g % 4)
    a = (w1 >> sh) & 0xFF
    m = (w2 >> sh) & 0xFF
    c = (w3 >> sh) & 0xFF
    low = g < 4
    sc = tl.where(low, a & 63, (c & 15) | ((a >> 6) << 4))
    mn = tl.where(low, m & 63, (c >> 4) | ((m >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _q4k_product(x_ptr, w32_ptr, out_ptr, N, RW, NB, SWIGLU: tl.constexpr, ADD: tl.constexpr,
                 MODE: tl.constexpr, RB: tl.constexpr, BB: tl.constexpr, SPLIT: tl.constexpr,
                 XP: tl.constexpr = 0, GDC: tl.constexpr = 1):
    """out[r] (+)= W[r] . x over Q4_K rows of ``RW`` int32 words (``NB`` blocks of 36 words),
    ``BB`` blocks an iteration; SWIGLU: out[r] = silu(W[r] . x) * (W[N + r] . x). ``SPLIT`` > 1
    (ADD only): program (i, s) takes every SPLIT-th chunk from chunk s and adds its partial
    atomically. MODE 1 waits first; 3 loads its first chunk before the wait. XP 1: x is
    ``x_perm``'s nibble order and the loop is ``_chunk_xp``'s (MODE 3 then only starts its
    first chunk after the wait). ``GDC`` 0 leaves the PDL calls out (Triton's interpreter has
    none)."""
    pid = tl.program_id(0)
    sid = tl.program_id(1)
    rows = pid * RB + tl.arange(0, RB)
    rmask = rows < N
    rw = w32_ptr + tl.where(rmask, rows, 0).to(tl.int64) * RW  # rows past N read row 0
    uw = rw + N.to(tl.int64) * RW
    j = tl.arange(0, 4)
    i8 = tl.arange(0, 8)
    woff = 4 + j[:, None] * 8 + i8[None, :]
    xoff = j[:, None] * 64 + i8[None, :] * 4
    acc = tl.zeros([RB, BB, 4], tl.float32)
    uacc = tl.zeros([RB, BB, 4], tl.float32)
    b_first = sid * BB
    b_start = b_first
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if XP:
        if MODE != 0 and GDC:
            tl.extra.cuda.gdc_wait()
        for b0 in range(b_first, NB, SPLIT * BB):
            acc = _chunk_xp(rw, x_ptr, b0, NB, BB, RB, woff, j, i8, acc)
            if SWIGLU:
                uacc = _chunk_xp(uw, x_ptr, b0, NB, BB, RB, woff, j, i8, uacc)
    else:
        if MODE == 3:
            q, w0, w1, w2, w3 = _chunk_loads(rw, b_first, NB, BB, woff)
            if SWIGLU:
                uq, u0, u1, u2, u3 = _chunk_loads(uw, b_first, NB, BB, woff)
        if MODE != 0 and GDC:
            tl.extra.cuda.gdc_wait()
        if MODE == 3:
            acc = _chunk_fma(q, w0, w1, w2, w3, j, x_ptr, b_first, NB, BB, xoff, acc)
            if SWIGLU:
                uacc = _chunk_fma(uq, u0, u1, u2, u3, j, x_ptr, b_first, NB, BB, xoff, uacc)
            b_start = b_first + SPLIT * BB
        for b0 in range(b_start, NB, SPLIT * BB):
            q, w0, w1, w2, w3 = _chunk_loads(rw, b0, NB, BB, woff)
            if SWIGLU:
                uq, u0, u1, u2, u3 = _chunk_loads(uw, b0, NB, BB, woff)
            acc = _chunk_fma(q, w0, w1, w2, w3, j, x_ptr, b0, NB, BB, xoff, acc)
            if SWIGLU:
                uacc = _chunk_fma(uq, u0, u1, u2, u3, j, x_ptr, b0, NB, BB, xoff, uacc)
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    if SWIGLU:
        u = tl.sum(tl.sum(uacc, axis=2), axis=1)
        y = y * tl.sigmoid(y) * u
    if SPLIT > 1:
        tl.atomic_add(out_ptr + rows, y, mask=rmask, sem="relaxed")
    else:
        if ADD:
            y += tl.load(out_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _bchunk_loads(rp, rw, b0, NB, BB: tl.constexpr, qoff):
    """Blocks b0 .. b0 + BB - 1 (those past ``NB`` masked to zero) of the rows at byte pointers
    ``rp`` ([RB]; ``rw`` the same rows as int32 pointers): the nibble bytes [RB, BB, 4, 32] (byte
    32j + l holds weight 64j + l low and 64j + 32 + l high), and the block headers' four 32-bit
    words [RB, BB] (d | dmin << 16, then the 12 bytes of 6-bit scales and mins)."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NB)[None, :]
    hp = rp[:, None] + bb[None, :] * 144
    hw = rw[:, None] + bb[None, :] * 36
    q = tl.load(hp[:, :, None, None] + qoff[None, None, :, :], mask=bm[:, :, None, None],
                other=0, eviction_policy="evict_first")
    w0, w1, w2, w3 = _headers(hw, bm)
    return q, w0, w1, w2, w3


@triton.jit
def _bchunk_fma(q, w0, w1, w2, w3, j, x_lo, x_hi, acc_lo, acc_hi, MAGIC: tl.constexpr):
    """acc [RB, BB, 4] += the sub-blocks' sums of (d * scale * q - dmin * min) * x: each sum
    runs along a thread's own bytes (16 of a sub-block's 32) and one shuffle."""
    d, dmin = _d_dmin(w0)
    sc_lo, mn_lo = _scale_min(w1, w2, w3, 2 * j)
    sc_hi, mn_hi = _scale_min(w1, w2, w3, 2 * j + 1)
    s_lo = (d[:, :, None] * sc_lo)[:, :, :, None]
    m_lo = (dmin[:, :, None] * mn_lo)[:, :, :, None]
    s_hi = (d[:, :, None] * sc_hi)[:, :, :, None]
    m_hi = (dmin[:, :, None] * mn_hi)[:, :, :, None]
    if MAGIC:  # (see _nibble)
        lo = ((q & 15).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        hi = ((q >> 4).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    else:
        lo = (q & 15).to(tl.float32)
        hi = (q >> 4).to(tl.float32)
    acc_lo += tl.sum((lo * s_lo - m_lo) * x_lo[None, :, :, :], axis=3)
    acc_hi += tl.sum((hi * s_hi - m_hi) * x_hi[None, :, :, :], axis=3)
    return acc_lo, acc_hi


@triton.jit
def _bx_chunk(x_ptr, b0, NB, BB: tl.constexpr, xoff):
    bb = b0 + tl.arange(0, BB)
    xm = (bb < NB)[:, None, None]
    xp = x_ptr + bb[:, None, None] * 256 + xoff[None, :, :]
    return tl.load(xp, mask=xm, other=0.0), tl.load(xp + 32, mask=xm, other=0.0)


@triton.jit
def _q4k_bytes(x_ptr, w_ptr, w32_ptr, out_ptr, N, RS, NB, SWIGLU: tl.constexpr,
               ADD: tl.constexpr, MODE: tl.constexpr, RB: tl.constexpr, BB: tl.constexpr,
               SPLIT: tl.constexpr, MAGIC: tl.constexpr = 0, GDC: tl.constexpr = 1):
    """Run 228's form (kept to compare): the nibbles loaded as bytes [RB, BB, 4, 32] beside x
    in two contiguous [BB, 4, 32] halves, each weight scaled on its own; MAGIC 1: a nibble
    becomes a float by its bits, as ``_nibble``. Otherwise as ``_q4k_product`` (``RS`` bytes a
    row, ``w32_ptr`` the same bytes as int32)."""
    pid = tl.program_id(0)
    sid = tl.program_id(1)
    rows = pid * RB + tl.arange(0, RB)
    rmask = rows < N
    r64 = tl.where(rmask, rows, 0).to(tl.int64)  # rows past N read row 0, never stored
    rp = w_ptr + r64 * RS
    rw = w32_ptr + r64 * (RS // 4)
    up = rp + N.to(tl.int64) * RS
    uw = rw + N.to(tl.int64) * (RS // 4)
    j = tl.arange(0, 4)
    l32 = tl.arange(0, 32)
    qoff = 16 + j[:, None] * 32 + l32[None, :]
    xoff = j[:, None] * 64 + l32[None, :]
    acc_lo = tl.zeros([RB, BB, 4], tl.float32)
    acc_hi = tl.zeros([RB, BB, 4], tl.float32)
    uacc_lo = tl.zeros([RB, BB, 4], tl.float32)
    uacc_hi = tl.zeros([RB, BB, 4], tl.float32)
    b_first = sid * BB
    b_start = b_first
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 3:
        q, w0, w1, w2, w3 = _bchunk_loads(rp, rw, b_first, NB, BB, qoff)
        if SWIGLU:
            uq, u0, u1, u2, u3 = _bchunk_loads(up, uw, b_first, NB, BB, qoff)
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_wait()
    if MODE == 3:
        x_lo, x_hi = _bx_chunk(x_ptr, b_first, NB, BB, xoff)
        acc_lo, acc_hi = _bchunk_fma(q, w0, w1, w2, w3, j, x_lo, x_hi, acc_lo, acc_hi, MAGIC)
        if SWIGLU:
            uacc_lo, uacc_hi = _bchunk_fma(uq, u0, u1, u2, u3, j, x_lo, x_hi, uacc_lo, uacc_hi, MAGIC)
        b_start = b_first + SPLIT * BB
    for b0 in range(b_start, NB, SPLIT * BB):
        q, w0, w1, w2, w3 = _bchunk_loads(rp, rw, b0, NB, BB, qoff)
        if SWIGLU:
            uq, u0, u1, u2, u3 = _bchunk_loads(up, uw, b0, NB, BB, qoff)
        x_lo, x_hi = _bx_chunk(x_ptr, b0, NB, BB, xoff)
        acc_lo, acc_hi = _bchunk_fma(q, w0, w1, w2, w3, j, x_lo, x_hi, acc_lo, acc_hi, MAGIC)
        if SWIGLU:
            uacc_lo, uacc_hi = _bchunk_fma(uq, u0, u1, u2, u3, j, x_lo, x_hi, uacc_lo, uacc_hi, MAGIC)
    y = tl.sum(tl.sum(acc_lo + acc_hi, axis=2), axis=1)
    if SWIGLU:
        u = tl.sum(tl.sum(uacc_lo + uacc_hi, axis=2), axis=1)
        y = y * tl.sigmoid(y) * u
    if SPLIT > 1:
        tl.atomic_add(out_ptr + rows, y, mask=rmask, sem="relaxed")
    else:
        if ADD:
            y += tl.load(out_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rmask)


def q4k_bytes(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, swiglu: bool,
              add: bool, mode: str, rows: int, blocks: int, split: int, warps: int,
              magic: bool, gdc: bool = True) -> None:
    """Run 228's kernel (``_q4k_bytes``), the arguments as ``q4k_product``'s."""
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    rs = _checked_rows(x, w, out, swiglu, add, split)
    extra = {"launch_pdl": True} if gdc else {}
    _q4k_bytes[(triton.cdiv(n, rows), split)](
        x, w, w.view(torch.int32), out, n, rs, rs // BLOCK_BYTES, SWIGLU=swiglu, ADD=add,
        MODE=MODES[mode], RB=rows, BB=blocks, SPLIT=split, MAGIC=int(magic), GDC=int(gdc),
        num_warps=warps, **extra)


def _checked_rows(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, swiglu: bool,
                  add: bool, split: int) -> int:
    """Bytes a row of ``w``, once the shapes hold Q4_K blocks for ``x`` and a split adds into
    float32 (the atomics' partials)."""
    rs = w.shape[1]
    if rs % BLOCK_BYTES or x.numel() != rs // BLOCK_BYTES * QK_K:
        raise ValueError(f"rows of {rs} bytes do not hold Q4_K blocks for x of {x.numel()}")
    if split > 1 and (swiglu or not add or out.dtype != torch.float32):
        raise ValueError("a split Q4_K product adds into float32 (not SwiGLU)")
    return rs


def nibble_order(x: torch.Tensor) -> torch.Tensor:
    """x [K] as ``_chunk_xp`` reads it: [K / 256, 2 (h), 4 (k), 4 (j), 8 (i)], element
    x[256b + 64j + 32h + 4i + k] (a producer of x could write it so; here torch does, once)."""
    return x.reshape(-1, 4, 2, 8, 4).permute(0, 2, 4, 1, 3).contiguous().reshape(-1)


def q4k_product(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, swiglu: bool,
                add: bool, mode: str, rows: int, blocks: int, split: int, warps: int,
                xp: bool = False, gdc: bool = True) -> None:
    """``w``: uint8 [N (2N for SwiGLU), K / 256 * 144], each row its Q4_K blocks in file order;
    ``x``: float32 [K] (``xp``: in ``nibble_order``); ``blocks`` (a power of two) a program's
    iteration, ``split`` programs a row block (float32 ``out``, ``add`` only)."""
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    rs = _checked_rows(x, w, out, swiglu, add, split)
    extra = {"launch_pdl": True} if gdc else {}
    _q4k_product[(triton.cdiv(n, rows), split)](
        x, w.view(torch.int32), out, n, rs // 4, rs // BLOCK_BYTES, SWIGLU=swiglu, ADD=add,
        MODE=MODES[mode], RB=rows, BB=blocks, SPLIT=split, XP=int(xp), GDC=int(gdc),
        num_warps=warps,
        **extra)


def tiles(swiglu: bool, nb: int) -> list[tuple[int, int, int, int]]:
    """(rows, blocks an iteration, split, warps) swept for a product of ``nb`` blocks a row:
    4 to 16 words of nibbles a thread a matrix an iteration (one to four 16-byte loads), no
    split where a program would have no chunk."""
    out = []
    for r in (1, 2, 4, 8, 16):
        for bb in (1, 2, 4, 8):
            for sp in ((1,) if swiglu else (1, 2, 4)):
                for w in (2, 4, 8):
                    if 4 * w <= r * bb <= 16 * w and sp * bb <= nb and bb <= nb:
                        out.append((r, bb, sp, w))
    return out


def random_blocks(rows: int, k: int, device: str | torch.device,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """uint8 [rows, k / 256 * 144]: random Q4_K blocks, d and dmin small positive float16."""
    nb = k // QK_K
    w = torch.randint(0, 256, (rows, nb, BLOCK_BYTES), dtype=torch.uint8, device=device,
                      generator=generator)
    dd = (torch.rand(rows, nb, 2, device=device, generator=generator) * 2e-4 + 1e-5)
    w[:, :, :4] = dd.to(torch.float16).view(torch.uint8).reshape(rows, nb, 4)
    return w.reshape(rows, nb * BLOCK_BYTES)


def decoded(w: torch.Tensor, k: int) -> torch.Tensor:
    """float32 [rows, k]: dequant.py's decode of the blocks (the backend's own, as at load)."""
    return _q4_k(w.reshape(-1, BLOCK_BYTES)).reshape(w.shape[0], k)


def reference(x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> torch.Tensor:
    y = w.float() @ x.float().reshape(-1)
    if not swiglu:
        return y
    n = w.shape[0] // 2
    return torch.nn.functional.silu(y[:n]) * y[n:]


def checked(launch: Callable[[torch.Tensor, torch.Tensor], None], want: torch.Tensor,
            w: torch.Tensor, out: torch.Tensor, add: bool, what: str) -> float:
    """Relative error of one launch against ``want`` (outputs poisoned, or zeroed to add to)."""
    out.fill_(0.0 if add else float("nan"))
    launch(w, out)
    torch.cuda.synchronize()
    err = float(((out.float().reshape(-1) - want).norm() / want.norm()).item())
    if not err < 2e-2:  # (NaN fails too: an element never written)
        raise SystemExit(f"bench_q4k: {what} is wrong: relative error {err:.3g}")
    return err


def run_product(model: str, name: str, sms: int, log: list[str], variants: set[str],
                reads: bool) -> dict[str, Any]:
    n, k, swiglu = PRODUCTS[(model, name)]
    m = 2 * n if swiglu else n
    b16 = m * k * 2
    b4 = m * k // QK_K * BLOCK_BYTES
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(k, device="cuda", dtype=torch.float32, generator=g)
    add = not swiglu  # the step adds the o- and down projections into the float32 residual
    odt = torch.bfloat16 if swiglu else torch.float32
    res: dict[str, Any] = {"rows": m, "k": k, "bf16_bytes": b16, "q4k_bytes": b4}

    def say(line: str) -> None:
        log.append(f"{model} {name} {line}")
        print(log[-1], flush=True)

    for mode in ("pdl", "pre") if reads else ():
        for label, nbytes in (("read", b16), ("read4", b4)):
            top = best(nbytes, mode, sms, [])
            res[f"{label}_{mode}"] = {"us": top["us"], "tile": top["tile"]}
            say(f"{label} {mode}: {top['us']:.2f} us ({nbytes / top['us'] / 1e3:.0f} GB/s), "
                f"tile {top['tile']}")

    # bf16: today's product on copies of one random matrix
    n_copy = max(8, -(-CHAIN_BYTES // b16))
    w16 = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
           for _ in range(n_copy)]
    outs = [torch.zeros(1, n, device="cuda", dtype=odt) for _ in range(n_copy)]
    cfg = tuned_configs(ARGS[model], 1)[(name, 1)]
    assert isinstance(cfg, K.LinearConfig)
    kmode = K.SWIGLU if swiglu else K.ADD
    want16 = reference(x, w16[0], swiglu)
    for pdl in (1, 2):

        def ours(w: torch.Tensor, o: torch.Tensor, pdl: int = pdl) -> None:
            K.linear(x.reshape(1, k), w, o, mode=kmode, cfg=cfg, pdl=pdl, evict="evict_first")

        checked(ours, want16, w16[0], outs[0], add, f"ours pdl {pdl}")
        us = chain_us(ours, w16, outs)
        res[f"ours_pdl{pdl}"] = us
        say(f"ours pdl {pdl} ({cfg}): {us:.2f} us ({b16 / us / 1e3:.0f} GB/s)")
    del w16, outs
    torch.cuda.empty_cache()

    # Q4_K: the same chain over random blocks
    n_copy = max(8, -(-CHAIN_BYTES // b4))
    w4 = [random_blocks(m, k, "cuda", g) for _ in range(n_copy)]
    outs = [torch.zeros(n, device="cuda", dtype=odt) for _ in range(n_copy)]
    want4 = reference(x, decoded(w4[0], k), swiglu)
    xperm = nibble_order(x)
    for label, mode, xp in (("q4k_pre", "pre", False), ("q4k_pdl", "pdl", False),
                            ("q4kx_pdl", "pdl", True), ("q4kb_pre", "pre", False),
                            ("q4kbm_pre", "pre", True)):
        if label.split("_")[0] not in variants:
            continue
        runs: list[dict[str, Any]] = []
        swept = ([tuple(r["tile"]) for r in res["q4k_pre"][:6]] if label == "q4k_pdl"
                 else tiles(swiglu, k // QK_K))
        for rows, blocks, split, warps in swept:

            def q4(w: torch.Tensor, o: torch.Tensor, rows: int = rows, blocks: int = blocks,
                   split: int = split, warps: int = warps, mode: str = mode,
                   xp: bool = xp, label: str = label) -> None:
                if label.startswith("q4kb"):  # (xp: MAGIC)
                    q4k_bytes(x, w, o, swiglu=swiglu, add=add, mode=mode, rows=rows,
                              blocks=blocks, split=split, warps=warps, magic=xp)
                    return
                q4k_product(xperm if xp else x, w, o, swiglu=swiglu, add=add, mode=mode,
                            rows=rows, blocks=blocks, split=split, warps=warps, xp=xp)

            tile = [rows, blocks, split, warps]
            err = checked(q4, want4, w4[0], outs[0], add, f"{label} {tile}")
            us = chain_us(q4, w4, outs)
            runs.append({"us": us, "tile": tile, "err": err})
        runs.sort(key=lambda r: r["us"])
        res[label] = runs
        top = runs[0]
        say(f"{label}: best {top['us']:.2f} us ({b4 / top['us'] / 1e3:.0f} GB/s of Q4_K, "
            f"{b16 / top['us'] / 1e3:.0f} bf16-equivalent), tile {top['tile']}, err "
            f"{top['err']:.1e}; next " + ", ".join(f"{r['us']:.2f} {r['tile']}" for r in runs[1:4]))
    best16 = min(res["ours_pdl1"], res["ours_pdl2"])
    best4 = min(v[0]["us"] for lb, v in res.items() if lb.startswith("q4k")
                and isinstance(v, list) and v)
    res["ratio_q4k_to_ours"] = round(best4 / best16, 3)
    say(f"q4k / ours: {best4:.2f} / {best16:.2f} us = {res['ratio_q4k_to_ours']:.3f}")
    del w4, outs
    torch.cuda.empty_cache()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("q4k_out"))
    ap.add_argument("--products", default=",".join(f"{m}:{p}" for m, p in PRODUCTS),
                    help="comma-separated model:product, from " + ", ".join(
                        f"{m}:{p}" for m, p in PRODUCTS))
    ap.add_argument("--read-tiles", choices=("quick", "all"), default="quick",
                    help="the pure reads' tiles: bench_read_size's 96, or 24 of them (4 or 8 "
                         "warps, 2, 4 or 8 programs an SM) so that every product fits one device "
                         "call; a ceiling from fewer tiles can only read slower")
    ap.add_argument("--variants", default="q4k,q4kx",
                    help="comma-separated, from q4k, q4kx, q4kb (run 228's kernel), q4kbm (it "
                         "with the nibbles made floats by their bits)")
    ap.add_argument("--no-reads", action="store_true", help="leave out the pure reads")
    args = ap.parse_args(argv)
    variants = set(choices(ap, args.variants, ("q4k", "q4kx", "q4kb", "q4kbm"), "variant"))
    if not variants:
        ap.error("--variants names no Q4_K product: choose from q4k, q4kx, q4kb, q4kbm")
    if args.read_tiles == "quick":
        bench_read_size.TILES = [t for t in bench_read_size.TILES
                                 if t[1] in (4, 8) and t[2] in (2, 4, 8)]
    known = [f"{m}:{p}" for m, p in PRODUCTS]
    picked = choices(ap, args.products, known, "product")
    if not torch.cuda.is_available():
        print("bench_q4k needs a CUDA GPU", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log: list[str] = []
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                           "read_tiles": args.read_tiles}
    for p in picked:
        model, name = p.split(":")
        res[p] = run_product(model, name, sms, log, variants, not args.no_reads)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "q4k.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
