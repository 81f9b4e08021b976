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
    q4kr    (run 231, the default) the blocks repacked once, at load, so that a warp's lanes
            hold different rows at the same columns (``repack``: a permutation, exact), and x
            quantized to int8 a group of 32 (``quantize_x``, as llama.cpp's own GPU products
            do), so that a word of nibbles costs two masks and two ``dp4a`` a row and x is one
            value for the whole warp; ``pre`` swept, its four best ``pdl``
    q6kr    (run 232) the same for Q6_K (``repack6``): three words make four dp4a words
    q32r    (run 237) the same for Q5_0 and Q8_0 (``repack32``), blocks of 32 four to a tile;
            waiting first (its loads and arithmetic are one pass)

Products: the 1.5B's gate/up (SwiGLU over both halves, 2 x 8960 rows of 1536), its down
projection (1536 rows of 8960) in Q4_K and in Q6_K (the file holds each in half the layers), its
o-projection (1536 x 1536), its q, k and v as one stored product (a proxy of the qkv kernel's
bytes) and its output matrix in Q6_K (151,936 x 1536, logits stored); the 0.5B's down projection
in Q4_K and Q6_K, and its Q5_0 gate/up and o-projection and Q8_0 output matrix.
Every product is checked before it is timed (outputs poisoned first): the file-layout forms
against a float32 product over dequant.py's decode of the same blocks, the repacked forms
against what they compute (the decode times the x the int8 words stand for) and, reported, the
float32 product over x itself (the error x's rounding adds: 5e-3 to 8e-3, 1.1e-2 through the
1.5B's SwiGLU). Random blocks:
random bytes, with d and dmin set to small positive float16 values. ``read4`` reads the file's
bytes of the product's type (Q6_K's for the Q6_K products).

``--layers [1.5B] [0.5B]`` (runs 233-237) then chains a model's layer products as a step does,
every layer its own weights, the output projection last, in one CUDA graph: bf16 against the
file's types, each quantized product after a kernel that quantizes its input (``_quantize_x``);
no attention, norms or RoPE in either (so neither is a step), their difference what the
products would save.

``--tprobe T --variants q4km,q4kd,q4kdw,q4kdm`` (session 28, runs 239-) times a verify step's
Q4_K products, T rows of x each with its own output, against today's bf16 verify product at T
(``run_mma``).

An instrument, not a backend: a chain of one kernel does not show what its neighbours in a step
would take from it (session 21; ``--layers`` is the closer look). Run on the lent GPU:
``python3 scripts/bench_q4k.py --out DIR [--products ...] [--variants
q4kr,q6kr,q32r,q4k,q4kx,q4kb,q4kbm,q4km,q4kd,q4kdw,q4kdm] [--layers [MODEL ...]] [--tprobe
T]`` (DIR/q4k.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_read_size  # noqa: E402
from bench_gateup import chain_us  # noqa: E402
from bench_gpu import graph_us  # noqa: E402
from bench_read_size import CHAIN_BYTES, best, choices  # noqa: E402

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B  # noqa: E402
from openjarvis.engine.torch.dequant import (  # noqa: E402
    QK_K,
    _q4_k,
    _q5_0,
    _q6_k,
    _q8_0,
    _scale_min_k4,
)
from openjarvis.engine.torch.tuning import tuned_configs  # noqa: E402

BLOCK_BYTES = 144  # a Q4_K block: 256 weights
Q6_BYTES = 210  # a Q6_K block: 256 weights (ql 128, qh 64, 16 int8 scales, f16 d)
Q8_BYTES, Q5_BYTES = 34, 22  # Q8_0 and Q5_0 blocks: 32 weights


class Product(NamedTuple):
    n: int  # rows (SwiGLU: of each half)
    k: int
    swiglu: bool
    add: bool  # added into the float32 residual (else stored, outputs poisoned first)
    fmt: str  # "q4k", "q6k", "q5_0" or "q8_0": the file's type for this matrix
    tile: str  # whose tuned one-token tile ``ours`` uses (tuning.TUNED's names)


#: (model, product) -> Product. The 1.5B file holds q, k, the o-projection, gate and up as
#: Q4_K, v and the down projection as Q4_K in half the layers and Q6_K in the other half, and
#: the output matrix as Q6_K; the 0.5B's down projection likewise (its others are Q5_0 / Q8_0).
PRODUCTS: dict[tuple[str, str], Product] = {
    ("1.5B", "w13"): Product(QWEN25_1_5B.n_ff, QWEN25_1_5B.n_embd, True, False, "q4k", "w13"),
    ("1.5B", "w2"): Product(QWEN25_1_5B.n_embd, QWEN25_1_5B.n_ff, False, True, "q4k", "w2"),
    ("1.5B", "wo"): Product(QWEN25_1_5B.n_embd, QWEN25_1_5B.n_embd, False, True, "q4k", "wo"),
    ("0.5B", "w2"): Product(QWEN25_0_5B.n_embd, QWEN25_0_5B.n_ff, False, True, "q4k", "w2"),
    # q, k and v as one product (no bias, RoPE or cache write: a proxy of the qkv kernel's
    # bytes), against bf16 ``linear`` with the o-projection's tile (the same K)
    ("1.5B", "qkv"): Product(QWEN25_1_5B.qkv_dim, QWEN25_1_5B.n_embd, False, False, "q4k", "wo"),
    ("1.5B", "w2q6"): Product(QWEN25_1_5B.n_embd, QWEN25_1_5B.n_ff, False, True, "q6k", "w2"),
    # the output matrix, logits stored (not the greedy argmax)
    ("1.5B", "outq6"): Product(QWEN25_1_5B.n_vocab, QWEN25_1_5B.n_embd, False, False, "q6k",
                               "out"),
    # the 0.5B's own types (run 237): Q5_0 gate/up and o-projection, Q6_K half its down
    # projections, Q8_0 its output matrix
    ("0.5B", "w13q5"): Product(QWEN25_0_5B.n_ff, QWEN25_0_5B.n_embd, True, False, "q5_0",
                               "w13"),
    ("0.5B", "woq5"): Product(QWEN25_0_5B.n_embd, QWEN25_0_5B.n_embd, False, True, "q5_0",
                              "wo"),
    ("0.5B", "w2q6"): Product(QWEN25_0_5B.n_embd, QWEN25_0_5B.n_ff, False, True, "q6k", "w2"),
    ("0.5B", "outq8"): Product(QWEN25_0_5B.n_vocab, QWEN25_0_5B.n_embd, False, False, "q8_0",
                               "out"),
}
FILE_BYTES = {"q4k": (256, BLOCK_BYTES), "q6k": (256, Q6_BYTES), "q5_0": (32, Q5_BYTES),
              "q8_0": (32, Q8_BYTES)}  # elements, bytes a block
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


# Run 231's form: the blocks repacked at load so that a warp's lanes hold different rows at the
# same columns, and x quantized to int8 words once a step (llama.cpp's own GPU products do the
# same: Q8_1 x, dp4a), so that a word of nibbles costs two masks and two dp4a a row.
#   nib [NB, 32, M] int32: memory position p = 4i + j of block b holds the row's nibble word
#       8j + i (bytes 32j + 4i .. + 3: weights 64j + 4i + c low, 64j + 32 + 4i + c high), so a
#       thread's 8 words (i, for its j) are one sub-block pair and sum without leaving it
#   hdr [NB, 5, M] int32: word 0 d | dmin << 16 as the file's; word 1 + j the pair's four 6-bit
#       values as bytes (scale 2j, scale 2j + 1, min 2j, min 2j + 1): 148 bytes a block, not 144
# SwiGLU products interleave gate and up rows (gate r at 2r, up r at 2r + 1): a thread's four
# consecutive rows hold two whole pairs.
WORD_OF = [8 * (p % 4) + p // 4 for p in range(32)]  # memory position -> the file's word
REPACK_BYTES = 148


def repack(w: torch.Tensor, swiglu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [M, NB * 144] rows of file-order Q4_K blocks -> (nib, hdr) above (exact: a
    permutation of the nibble words and the 6-bit values unpacked to bytes)."""
    m, rs = w.shape
    nb = rs // BLOCK_BYTES
    if swiglu:
        w = interleaved(w)
    blk = w.contiguous().reshape(m, nb, BLOCK_BYTES)
    words = blk.view(torch.int32)  # [M, NB, 36]
    nib = words[:, :, 4:][:, :, WORD_OF].permute(1, 2, 0).contiguous()
    sc, mn = _scale_min_k4(blk[:, :, 4:16].reshape(-1, 12))
    pairs = torch.cat([sc.reshape(m, nb, 4, 2), mn.reshape(m, nb, 4, 2)], dim=-1).contiguous()
    hdr = torch.cat([words[:, :, :1], pairs.view(torch.int32).reshape(m, nb, 4)], dim=-1)
    return nib, hdr.permute(1, 2, 0).contiguous()


XQ = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def quantize_x(x: torch.Tensor) -> XQ:
    """x float32 [K] -> (int8 x as int32 words [K / 4], scale a group of 32 [K / 32], the
    group's float32 sum [K / 32], the int8 values' sum a group of 16 [K / 16]): round(x / s),
    s = max |x| / 127. Q4_K's min term uses the exact float sum, so only its q . x half sees
    the rounding; Q6_K's offset of 32 uses the int8 sums (it is part of q . x)."""
    g = x.float().reshape(-1, 32)
    amax = g.abs().amax(dim=1, keepdim=True)
    s = amax / torch.full_like(amax, 127.0)  # (a tensor divisor: torch on a GPU multiplies
    # by the reciprocal of a scalar one, which differs from IEEE division in the last bit)
    q = torch.where(s > 0, torch.round(g / torch.where(s > 0, s, 1.0)), 0.0)
    q8 = q.clamp(-127, 127).to(torch.int8).reshape(-1)
    s16 = q8.reshape(-1, 16).sum(dim=1, dtype=torch.int32)
    return q8.view(torch.int32), s.reshape(-1), g.sum(dim=1), s16


def x_words(xq: XQ) -> torch.Tensor:
    """The float32 x that ``quantize_x``'s int8 words and scales stand for (what the repacked
    products multiply by)."""
    return (xq[0].view(torch.int8).float().reshape(-1, 32) * xq[1][:, None]).reshape(-1)


def interleaved(w: torch.Tensor) -> torch.Tensor:
    """Rows [gate; up] as gate 0, up 0, gate 1, ...: a thread's four rows hold two pairs."""
    m = w.shape[0]
    return torch.stack([w[: m // 2], w[m // 2 :]], dim=1).reshape(w.shape)


def d_words(blk: torch.Tensor, at: int) -> torch.Tensor:
    """Each block's f16 d (bytes ``at``, ``at`` + 1 of [M, NB, bytes]) padded to an int32 word
    [M, NB]: low half d's bits, high half zero."""
    d = torch.zeros(*blk.shape[:2], 4, dtype=torch.uint8, device=blk.device)
    d[:, :, :2] = blk[:, :, at : at + 2]
    return d.view(torch.int32).reshape(blk.shape[:2])


def reference_q(xq: XQ, x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> torch.Tensor:
    """What ``_q4kr_product`` computes, in float32 torch: the blocks' d * scale * q part times
    the x ``quantize_x``'s words stand for, their dmin * min part times x itself."""
    k = x.numel()
    xd = x_words(xq)
    parts = []
    for zero in (slice(2, 4), slice(0, 2)):  # dmin zeroed: the scale part; d zeroed: the mins
        wz = w.reshape(w.shape[0], -1, BLOCK_BYTES).clone()
        wz[:, :, zero] = 0
        parts.append(decoded(wz.reshape(w.shape), k))
    y = parts[0].float() @ xd + parts[1].float() @ x.float()
    if not swiglu:
        return y
    n = w.shape[0] // 2
    return torch.nn.functional.silu(y[:n]) * y[n:]


@triton.jit
def _dp4a(a, b, c, DP4A: tl.constexpr):
    """c + the four signed byte products of int32 words a and b: the PTX instruction, or
    (DP4A 0, Triton's interpreter) the same integers by shifts."""
    b = tl.broadcast_to(b, a.shape)
    if DP4A:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        for k in tl.static_range(4):
            c += ((a << (24 - 8 * k)) >> 24) * ((b << (24 - 8 * k)) >> 24)
        return c


@triton.jit
def _words4(p, M, bm):
    """Four positions' words (memory positions p, p + 4, p + 8, p + 12 of a block, rows M
    apart) as a tuple: the repacked forms load a block's words as such tuples, one load a word,
    so that x's loads can be small enough to take the words' layout (``_rchunk_loads``)."""
    return (tl.load(p, mask=bm, other=0, eviction_policy="evict_first"),
            tl.load(p + 4 * M, mask=bm, other=0, eviction_policy="evict_first"),
            tl.load(p + 8 * M, mask=bm, other=0, eviction_policy="evict_first"),
            tl.load(p + 12 * M, mask=bm, other=0, eviction_policy="evict_first"))


@triton.jit
def _rheaders(hdr_ptr, b4, M, rr, jj, bm):
    """``hdr [NB, 5, M]``'s word 0 and the four groups' words of blocks ``b4`` ([BB, 1, 1, 1])
    for rows ``rr``, each as [BB, 1, 4, RB] (word 0 repeated over the groups: the nibbles'
    layout, so nothing meets it through shared memory)."""
    r4 = rr[None, None, None, :]
    h0 = tl.load(hdr_ptr + b4 * 5 * M + 0 * jj[None, None, :, None] + r4, mask=bm, other=0,
                 eviction_policy="evict_first")
    hs = tl.load(hdr_ptr + (b4 * 5 + 1 + jj[None, None, :, None]) * M + r4, mask=bm, other=0,
                 eviction_policy="evict_first")
    return h0, hs


@triton.jit
def _rchunk_loads(nib_ptr, hdr_ptr, b0, NB, M, rr, rmask, jj, BB: tl.constexpr):
    """Blocks b0 .. b0 + BB - 1 of rows ``rr`` (past ``NB`` or ``rmask`` masked to zero): the
    nibble words as eight [BB, 1, 4 (j), RB] loads, one an i (a load of all eight as one
    [BB, 8, 4, RB] tensor made x's loads [BB, 8, 4, 1], which Triton lays out on their own and
    meets through shared memory), then header word 0 and the pairs' words, each as
    [BB, 1, 4, RB]."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NB)[:, None, None, None] & rmask[None, None, None, :]
    b4 = bb[:, None, None, None]
    p = nib_ptr + (b4 * 32 + jj[None, None, :, None]) * M + rr[None, None, None, :]
    q = (_words4(p, M, bm), _words4(p + 16 * M, M, bm))
    h0, hs = _rheaders(hdr_ptr, b4, M, rr, jj, bm)
    return q, h0, hs


@triton.jit
def _rchunk_fma(q, h0, hs, xw_ptr, xs_ptr, xsum_ptr, b0, NB, jj, BB: tl.constexpr,
                DP4A: tl.constexpr, acc, TOK: tl.constexpr = 1):
    """acc [BB, 1, 4, RB] += each sub-block pair's d * (scale * s_x * (q . x8)) - dmin * min *
    sum(x), low and high nibbles: two dp4a a word, chained over a pair's 8 words inside the
    thread (``WORD_OF``), the scales applied once a sub-block. x is loaded a word an i as
    [BB, 1, 4, 1], fewer elements than threads, which Triton loads in the nibbles' layout (a
    broadcast across the thread's rows, no copy). TOK > 1 (``--tprobe``): the same for each of
    TOK rows of x, all added into acc, so a verify step's integer work on the same bytes is
    timed without its TOK accumulators."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NB)[:, None, None, None]
    b4 = bb[:, None, None, None]
    d, dmin = _d_dmin(h0)
    sc_lo = (hs & 0xFF).to(tl.float32)
    sc_hi = ((hs >> 8) & 0xFF).to(tl.float32)
    mn_lo = ((hs >> 16) & 0xFF).to(tl.float32)
    mn_hi = ((hs >> 24) & 0xFF).to(tl.float32)
    for t in tl.static_range(TOK):
        xp = xw_ptr + t * NB * 64 + b4 * 64 + 16 * jj[None, None, :, None]  # pair j's words
        s_lo = tl.zeros(q[0][0].shape, tl.int32)
        s_hi = tl.zeros(q[0][0].shape, tl.int32)
        for i in tl.static_range(8):
            x_lo = tl.load(xp + i, mask=bm, other=0)
            x_hi = tl.load(xp + 8 + i, mask=bm, other=0)
            w = q[i // 4][i % 4]
            s_lo = _dp4a(w & 0x0F0F0F0F, x_lo, s_lo, DP4A)
            s_hi = _dp4a((w >> 4) & 0x0F0F0F0F, x_hi, s_hi, DP4A)
        gi = t * NB * 8 + b4 * 8 + 2 * jj[None, None, :, None]  # sub-block 2j of block b
        sx_lo = tl.load(xs_ptr + gi, mask=bm, other=0.0)
        sx_hi = tl.load(xs_ptr + gi + 1, mask=bm, other=0.0)
        m_lo = tl.load(xsum_ptr + gi, mask=bm, other=0.0)
        m_hi = tl.load(xsum_ptr + gi + 1, mask=bm, other=0.0)
        acc += d * (sc_lo * sx_lo * s_lo.to(tl.float32) + sc_hi * sx_hi * s_hi.to(tl.float32))
        acc -= dmin * (mn_lo * m_lo + mn_hi * m_hi)
    return acc


@triton.jit
def _rtile(M, RB: tl.constexpr, BB: tl.constexpr):
    """A repacked product's program: its ids, its ``RB`` rows and their mask (masks, not a
    clamp of the rows, keep their contiguity for 16-byte loads), the four pairs or groups
    ``jj`` and a zeroed [BB, 1, 4, RB] accumulator."""
    pid = tl.program_id(0)
    rr = pid * RB + tl.arange(0, RB)
    return (pid, tl.program_id(1), rr, rr < M, tl.arange(0, 4),
            tl.zeros([BB, 1, 4, RB], tl.float32))


@triton.jit
def _q4kr_product(xw_ptr, xs_ptr, xsum_ptr, nib_ptr, hdr_ptr, out_ptr, qw_ptr, qs_ptr,
                  qsum_ptr, q16_ptr, M, NB, SWIGLU: tl.constexpr, ADD: tl.constexpr,
                  MODE: tl.constexpr, RB: tl.constexpr, BB: tl.constexpr, SPLIT: tl.constexpr,
                  QOUT: tl.constexpr = 0, DP4A: tl.constexpr = 1, GDC: tl.constexpr = 1,
                  TOK: tl.constexpr = 1):
    """out (+)= W . x over ``repack``'s blocks (``M`` rows in memory, interleaved for SWIGLU,
    whose out has M / 2) and ``quantize_x``'s x; ``RB`` rows a program (4 a thread, its lanes
    on rows: x the same for the whole warp), ``BB`` blocks an iteration, ``SPLIT`` as
    ``_q4k_product``'s. MODE 3 loads its first chunk's weights before the wait. QOUT (SwiGLU,
    64 rows: a program's 32 outputs one group) also writes its outputs quantized, as
    ``quantize_x``, into ``q*_ptr``: the next product's input with no quantizing kernel
    between."""
    pid, sid, rr, rmask, jj, acc = _rtile(M, RB, BB)
    b_first = sid * BB
    b_start = b_first
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 3:
        q, h0, hs = _rchunk_loads(nib_ptr, hdr_ptr, b_first, NB, M, rr, rmask, jj, BB)
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_wait()
    if MODE == 3:
        acc = _rchunk_fma(q, h0, hs, xw_ptr, xs_ptr, xsum_ptr, b_first, NB, jj, BB, DP4A, acc,
                          TOK)
        b_start = b_first + SPLIT * BB
    for b0 in range(b_start, NB, SPLIT * BB):
        q, h0, hs = _rchunk_loads(nib_ptr, hdr_ptr, b0, NB, M, rr, rmask, jj, BB)
        acc = _rchunk_fma(q, h0, hs, xw_ptr, xs_ptr, xsum_ptr, b0, NB, jj, BB, DP4A, acc,
                          TOK)
    _r_epilogue(acc, pid, rmask, out_ptr, qw_ptr, qs_ptr, qsum_ptr, q16_ptr, M, SWIGLU, ADD,
                RB, SPLIT, QOUT)


@triton.jit
def _r_epilogue(acc, pid, rmask, out_ptr, qw_ptr, qs_ptr, qsum_ptr, q16_ptr, M,
                SWIGLU: tl.constexpr, ADD: tl.constexpr, RB: tl.constexpr,
                SPLIT: tl.constexpr, QOUT: tl.constexpr):
    """The repacked products' end: acc [BB, 1, 4, RB] summed to a row each; SwiGLU over the
    interleaved pairs (and, QOUT, the outputs quantized as one group of 32), or stored, added,
    or added atomically (a split)."""
    y = tl.sum(tl.sum(tl.sum(acc, axis=2), axis=1), axis=0)  # [RB]
    if SWIGLU:
        gate, up = tl.split(tl.reshape(y, [RB // 2, 2]))
        o = pid * (RB // 2) + tl.arange(0, RB // 2)
        om = o < M // 2
        act = gate * tl.sigmoid(gate) * up
        tl.store(out_ptr + o, act.to(out_ptr.dtype.element_ty), mask=om)
        if QOUT:
            grp = pid + tl.arange(0, 1)
            _quantize_groups(tl.reshape(act, [1, 32]), qw_ptr, qs_ptr, qsum_ptr, q16_ptr, grp,
                             grp < M // 64, 1)
    else:
        o = pid * RB + tl.arange(0, RB)
        if SPLIT > 1:
            tl.atomic_add(out_ptr + o, y, mask=rmask, sem="relaxed")
        else:
            if ADD:
                y += tl.load(out_ptr + o, mask=rmask, other=0.0).to(tl.float32)
            tl.store(out_ptr + o, y.to(out_ptr.dtype.element_ty), mask=rmask)


def q4kr_product(xq: XQ, w: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor, *,
                 swiglu: bool, add: bool, mode: str, rows: int, blocks: int, split: int,
                 warps: int, qout: XQ | None = None, gdc: bool = True, tokens: int = 1) -> None:
    """``w``: ``repack``'s (nib, hdr); ``xq``: ``quantize_x``'s; the rest as ``q4k_product``'s
    (``rows`` a multiple of 4; ``split`` > 1 adds into float32, not SwiGLU); ``qout``: buffers
    (``empty_xq``) for the SwiGLU output quantized too (64 rows a program); ``tokens`` > 1:
    ``xq`` holds that many rows of x (``quantize_rows``), whose products are added into one
    (``--tprobe``: a verify step's arithmetic on one step's bytes). ``gdc`` False is for
    Triton's interpreter: no PDL calls, and dp4a emulated by shifts (the repacked wrappers
    alike)."""
    nib, hdr = w
    nb, _, m = nib.shape
    if qout is not None and not (swiglu and rows == 64 and m % 64 == 0):
        raise ValueError("a quantized output needs SwiGLU, 64 rows a program and whole groups")
    if xq[0].numel() * 4 != tokens * nb * QK_K or hdr.shape != (nb, 5, m):
        raise ValueError(f"repacked blocks [{nb}, 32, {m}] do not match x of "
                         f"{xq[0].numel() * 4} ({tokens} rows)")
    if split > 1 and (swiglu or not add or out.dtype != torch.float32):
        raise ValueError("a split Q4_K product adds into float32 (not SwiGLU)")
    extra = {"launch_pdl": True} if gdc else {}
    _q4kr_product[(triton.cdiv(m, rows), split)](
        *xq[:3], nib, hdr, out, *(qout if qout is not None else xq), m, nb, SWIGLU=swiglu,
        ADD=add, MODE=MODES[mode], RB=rows, BB=blocks, SPLIT=split, QOUT=int(qout is not None),
        DP4A=int(gdc), GDC=int(gdc), TOK=tokens, num_warps=warps, **extra)


def quantize_rows(x: torch.Tensor) -> XQ:
    """``quantize_x`` of each row of x [T, K], the rows' buffers laid end to end."""
    parts = [quantize_x(r) for r in x]
    return (torch.cat([q[0] for q in parts]), torch.cat([q[1] for q in parts]),
            torch.cat([q[2] for q in parts]), torch.cat([q[3] for q in parts]))


# Session 28's verify forms: T rows of x against the same Q4_K blocks with matrix
# instructions. ``q4km`` is llama.cpp's MMQ arithmetic in Triton: each sub-block of 32 is one
# [rows, 32] x [32, T] int8 product (wgmma or mma.sync, as Triton picks), its int32 sums scaled
# by d * scale (the row's) and x's scale (the token's), less dmin * min * the token's float sum.
# ``q4kd`` (``q4kdw``, ``q4kdm``) decodes the weights in registers to bf16 for bf16 products.
#   qs  [NB, 4, M, 32] uint8: chunk c of every row's block b, the file's bytes (low nibbles
#       sub-block 2c, high 2c + 1), 32 contiguous a row: a K-major operand as the file has it
#   hdr ``repack``'s [NB, 5, M] (148 bytes a block with the nibbles, as q4kr)
# x: ``quantize_cols``: int8 [BT, K] (token rows, padded with zeros to BT), scales and float
# sums [BT, K / 32].


def repack_mma(w: torch.Tensor, swiglu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [M, NB * 144] file-order Q4_K rows -> (qs, hdr) above (exact: the nibble bytes
    moved, the headers as ``repack``'s); SwiGLU rows interleaved as ``repack``'s."""
    m, rs = w.shape
    nb = rs // BLOCK_BYTES
    wi = interleaved(w) if swiglu else w
    qs = wi.reshape(m, nb, BLOCK_BYTES)[:, :, 16:].reshape(m, nb, 4, 32)
    return qs.permute(1, 2, 0, 3).contiguous(), repack(w, swiglu)[1]


XM = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def quantize_cols(x: torch.Tensor, bt: int = 16) -> XM:
    """x float32 [T, K] -> ``quantize_x`` of each row, laid out for ``_q4km_product``: int8
    [bt, K], scales [bt, K / 32], float sums [bt, K / 32], rows past T zero."""
    t, k = x.shape
    if not 0 < t <= bt:
        raise ValueError(f"{t} rows of x do not fit a tile of {bt}")
    xq8 = torch.zeros(bt, k, dtype=torch.int8, device=x.device)
    xs = torch.zeros(bt, k // 32, device=x.device)
    xsum = torch.zeros(bt, k // 32, device=x.device)
    for i, r in enumerate(x):
        q = quantize_x(r)
        xq8[i], xs[i], xsum[i] = q[0].view(torch.int8), q[1], q[2]
    return xq8, xs, xsum


def bf16_cols(x: torch.Tensor, bt: int = 16, nibble: bool = False) -> XM:
    """x float32 [T, K] -> bf16 [bt, K] (rows past T zero) for ``q4kd`` (its scale and sum
    buffers unused: the same empty tensor); ``nibble``: each block's 256 values in
    ``_block_dot``'s order (position 64c + 2i + h holds x[64c + 32h + i])."""
    t, k = x.shape
    if not 0 < t <= bt:
        raise ValueError(f"{t} rows of x do not fit a tile of {bt}")
    xb = torch.zeros(bt, k, dtype=torch.bfloat16, device=x.device)
    xb[:t] = x
    if nibble:
        xb = xb.reshape(bt, k // 64, 2, 32).transpose(2, 3).reshape(bt, k).contiguous()
    none = torch.empty(0, device=x.device)
    return xb, none, none


def reference_d(x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> torch.Tensor:
    """What ``q4kd`` computes for each row of x [T, K], in float32 torch: the bf16 weights
    load-time decoding gives times bf16 x."""
    dec = decoded(w, x.shape[1]).to(torch.bfloat16).float()
    return torch.stack([reference(r, dec, swiglu) for r in x.to(torch.bfloat16).float()])


@triton.jit
def _bf16_dot(w, x, acc, GPU: tl.constexpr):
    """acc + bf16(w) . x (x bf16): the matrix instruction, or (GPU 0, Triton's interpreter,
    whose bf16 dot multiplies the raw bits and whose float32 -> bf16 truncates) the same
    rounding to nearest even by the bits and a float32 product."""
    if GPU:
        return tl.dot(w.to(tl.bfloat16), x, acc)
    else:
        bits = w.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return tl.dot(bits.to(tl.float32, bitcast=True), x.to(tl.float32), acc,
                      input_precision="ieee")


@triton.jit
def _nib_f32(q, BITS: tl.constexpr):
    """Nibbles (uint8 0-15) as float32: a conversion instruction (quarter rate on sm_90), or
    (BITS, ``q4kdm``) by their bits, 2^23 + q less 2^23 (an or and an add, full rate): the
    same values exactly."""
    if BITS:
        return (q.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    else:
        return q.to(tl.float32)


@triton.jit
def _block_dot(xq_ptr, qs_ptr, hdr_ptr, b, M, rr, rmask, tt, k, d, dmin, acc,
               GPU: tl.constexpr):
    """``q4kd`` with one product a block (DEQ 2): the block's 256 weights a row decoded to bf16
    as [rows, 4 (chunk), 32, 2 (low, high nibble)], one [rows, 256] x [256, T] ``tl.dot``
    against x in that order (``bf16_cols(..., nibble=True)``), so that the matrix unit runs
    16 instructions before one wait, not 2 before each of 8."""
    cc = tl.arange(0, 4)
    hs = tl.load(hdr_ptr + (b * 5 + 1 + cc[None, :]) * M + rr[:, None], mask=rmask[:, None],
                 other=0, eviction_policy="evict_first")  # [BM, 4]
    byt = tl.load(qs_ptr + ((b * 4 + cc[None, :, None]) * M + rr[:, None, None]) * 32
                  + tl.arange(0, 32)[None, None, :], mask=rmask[:, None, None], other=0,
                  eviction_policy="evict_first")  # [BM, 4, 32]
    dd = d[:, None]
    dm = dmin[:, None]
    w_lo = ((dd * (hs & 0xFF).to(tl.float32))[:, :, None] * (byt & 15).to(tl.float32)
            - (dm * ((hs >> 16) & 0xFF).to(tl.float32))[:, :, None])
    w_hi = ((dd * ((hs >> 8) & 0xFF).to(tl.float32))[:, :, None] * (byt >> 4).to(tl.float32)
            - (dm * ((hs >> 24) & 0xFF).to(tl.float32))[:, :, None])
    w = tl.reshape(tl.join(w_lo, w_hi), [w_lo.shape[0], 256])
    x = tl.load(xq_ptr + tt[None, :] * k + b * 256 + tl.arange(0, 256)[:, None])
    return _bf16_dot(w, x, acc, GPU)


@triton.jit
def _q4km_product(xq_ptr, xs_ptr, xsum_ptr, qs_ptr, hdr_ptr, out_ptr, M, NB, T,
                  SWIGLU: tl.constexpr, ADD: tl.constexpr, BM: tl.constexpr,
                  BT: tl.constexpr, SPLIT: tl.constexpr, GDC: tl.constexpr = 1,
                  DEQ: tl.constexpr = 0):
    """out [T, rows] (+)= W . x for T rows of x: ``BM`` rows a program, blocks sid, sid +
    SPLIT, ... (a split adds atomically into float32). Waits first, as today's verify
    products do (their weight prologue lost, session 6). DEQ 1 (``q4kd``): each sub-block's
    weights decoded in registers to the bf16 values load-time decoding gives (dequant.py's
    d * scale * q - dmin * min, rounded once) and multiplied with bf16 x (``xq_ptr`` bf16
    [BT, K]) by bf16 ``tl.dot``: today's verify arithmetic on the file's bytes. DEQ 2
    (``q4kdw``): the same with one product a block (``_block_dot``). DEQ 3 (``q4kdm``): DEQ 1
    with the nibbles made floats by their bits (``_nib_f32``)."""
    pid = tl.program_id(0)
    sid = tl.program_id(1)
    rr = pid * BM + tl.arange(0, BM)
    rmask = rr < M
    tt = tl.arange(0, BT)
    ii = tl.arange(0, 32)
    k = NB * 256
    acc = tl.zeros([BM, BT], tl.float32)
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    for b in range(sid, NB, SPLIT):
        d, dmin = _d_dmin(tl.load(hdr_ptr + b * 5 * M + rr, mask=rmask, other=0,
                                  eviction_policy="evict_first"))
        if DEQ == 2:
            acc = _block_dot(xq_ptr, qs_ptr, hdr_ptr, b, M, rr, rmask, tt, k, d, dmin, acc, GDC)
        for c in tl.static_range(4 if DEQ != 2 else 0):
            hs = tl.load(hdr_ptr + (b * 5 + 1 + c) * M + rr, mask=rmask, other=0,
                         eviction_policy="evict_first")
            byt = tl.load(qs_ptr + ((b * 4 + c) * M + rr[:, None]) * 32 + ii[None, :],
                          mask=rmask[:, None], other=0, eviction_policy="evict_first")
            g = b * 8 + 2 * c  # sub-blocks g (low nibbles) and g + 1 (high)
            xp = xq_ptr + tt[None, :] * k + g * 32 + ii[:, None]  # x [32, BT], K-major
            sc_lo = (hs & 0xFF).to(tl.float32)
            sc_hi = ((hs >> 8) & 0xFF).to(tl.float32)
            mn_lo = ((hs >> 16) & 0xFF).to(tl.float32)
            mn_hi = ((hs >> 24) & 0xFF).to(tl.float32)
            if DEQ:
                w_lo = (d * sc_lo)[:, None] * _nib_f32(byt & 15, DEQ == 3) - (dmin * mn_lo)[:, None]
                w_hi = (d * sc_hi)[:, None] * _nib_f32(byt >> 4, DEQ == 3) - (dmin * mn_hi)[:, None]
                acc = _bf16_dot(w_lo, tl.load(xp), acc, GDC)
                acc = _bf16_dot(w_hi, tl.load(xp + 32), acc, GDC)
            else:
                s_lo = tl.dot((byt & 15).to(tl.int8), tl.load(xp), out_dtype=tl.int32)
                s_hi = tl.dot((byt >> 4).to(tl.int8), tl.load(xp + 32), out_dtype=tl.int32)
                gx = tt * (NB * 8) + g
                acc += d[:, None] * (sc_lo[:, None] * tl.load(xs_ptr + gx)[None, :]
                                     * s_lo.to(tl.float32)
                                     + sc_hi[:, None] * tl.load(xs_ptr + gx + 1)[None, :]
                                     * s_hi.to(tl.float32))
                acc -= dmin[:, None] * (mn_lo[:, None] * tl.load(xsum_ptr + gx)[None, :]
                                        + mn_hi[:, None] * tl.load(xsum_ptr + gx + 1)[None, :])
    tmask = tt < T
    if SWIGLU:  # interleaved rows: a program's BM rows are BM / 2 (gate, up) pairs
        gate, up = tl.split(tl.reshape(tl.permute(acc, (1, 0)), [BT, BM // 2, 2]))
        o = pid * (BM // 2) + tl.arange(0, BM // 2)
        act = gate * tl.sigmoid(gate) * up
        tl.store(out_ptr + tt[:, None] * (M // 2) + o[None, :],
                 act.to(out_ptr.dtype.element_ty),
                 mask=tmask[:, None] & (o < M // 2)[None, :])
    else:
        at = out_ptr + tt[None, :] * M + rr[:, None]
        om = tmask[None, :] & rmask[:, None]
        if SPLIT > 1:
            tl.atomic_add(at, acc, mask=om, sem="relaxed")
        else:
            if ADD:
                acc += tl.load(at, mask=om, other=0.0).to(tl.float32)
            tl.store(at, acc.to(out_ptr.dtype.element_ty), mask=om)


def q4km_product(xm: XM, w: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor, *,
                 tokens: int, swiglu: bool, add: bool, rows: int, split: int, warps: int,
                 gdc: bool = True, whole: bool = False, bits: bool = False) -> None:
    """``w``: ``repack_mma``'s (qs, hdr); ``xm``: ``quantize_cols``'s (int8 x: ``q4km``) or
    ``bf16_cols``'s (bf16 x, the weights decoded to bf16 in registers: ``q4kd``; ``whole``:
    one product a block, x from ``bf16_cols(..., nibble=True)``; ``bits``: the nibbles made
    floats by their bits, ``q4kdm``); out
    [tokens or more, rows] (SwiGLU: [.., rows / 2]); ``rows`` a power of two of at least 16;
    ``split`` > 1 adds into float32 (not SwiGLU). ``gdc`` False: Triton's interpreter (no
    PDL calls, and the bf16 product emulated: a GPU run with it times the emulation, as the
    dp4a forms' ``gdc`` does)."""
    qs, hdr = w
    nb, _, m, _ = qs.shape
    bt = xm[0].shape[0]
    if xm[0].shape[1] != nb * QK_K or hdr.shape != (nb, 5, m) or not 0 < tokens <= bt:
        raise ValueError(f"blocks [{nb}, 4, {m}, 32] do not match x {list(xm[0].shape)} "
                         f"of {tokens} rows")
    n_out = m // 2 if swiglu else m
    if out.dim() != 2 or out.shape[0] < tokens or out.shape[1] != n_out:
        raise ValueError(f"out {list(out.shape)} does not hold [{tokens}, {n_out}]")
    if rows < 16 or rows & (rows - 1) or (gdc and bt < 16):
        raise ValueError(f"a tile of {rows} rows and {bt} tokens: the matrix instructions "
                         "need powers of two, at least 16 of each")
    if split > 1 and (swiglu or not add or out.dtype != torch.float32):
        raise ValueError("a split Q4_K product adds into float32 (not SwiGLU)")
    deq = (2 if whole else 3 if bits else 1) if xm[0].dtype == torch.bfloat16 else 0
    if (whole or bits) and not deq:
        raise ValueError("a bf16 form (whole, bits) needs bf16 x (bf16_cols)")
    if whole and bits:
        raise ValueError("the nibbles by their bits (bits) are q4kd's, one sub-block a product")
    extra = {"launch_pdl": True} if gdc else {}
    _q4km_product[(triton.cdiv(m, rows), split)](
        *xm, qs, hdr, out, m, nb, tokens, SWIGLU=swiglu, ADD=add, BM=rows, BT=bt,
        SPLIT=split, GDC=int(gdc), DEQ=deq, num_warps=warps, **extra)


# Run 232's Q6_K form, as run 231's: a block's 256 weights are 16 sub-blocks of 16, each an
# int8 scale, q in 0-63 less 32: four bits in ql (128 bytes), two in qh (64 bytes). In each half
# of the block (h), qh word t (bytes 4t .. 4t + 3) and ql words t and t + 8 hold weights
# 128h + 4t + c + 32s for s = 0-3 (ql low nibbles for s 0 and 1, high for 2 and 3; qh bits
# 2s, 2s + 1), so three words make four dp4a words: one a sub-block, sub-block 8h + t // 4 + 2s.
# A group g = 2h + t // 4 (four t) owns sub-blocks 8h + t // 4 + {0, 2, 4, 6}.
#   nib [NB, 48, M] int32: memory position 4u + g holds unit u of group g: u 0-3 ql word
#       16h + 4 (t // 4) + u, u 4-7 ql word 16h + 8 + 4 (t // 4) + u - 4, u 8-11 qh word
#       8h + 4 (t // 4) + u - 8
#   hdr [NB, 5, M] int32: word 0 the f16 d's bits; word 1 + g the group's four int8 scales
Q6_REPACK_BYTES = 212


def repack6(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [M, NB * 210] rows of file-order Q6_K blocks -> (nib, hdr) above (exact)."""
    m, rs = w.shape
    nb = rs // Q6_BYTES
    blk = w.contiguous().reshape(m, nb, Q6_BYTES)
    ql = blk[:, :, :128].contiguous().view(torch.int32)  # [M, NB, 32]
    qh = blk[:, :, 128:192].contiguous().view(torch.int32)  # [M, NB, 16]
    units = []
    for u in range(12):
        for g in range(4):
            h, i = divmod(g, 2)
            if u < 4:
                units.append(ql[:, :, 16 * h + 4 * i + u])
            elif u < 8:
                units.append(ql[:, :, 16 * h + 8 + 4 * i + u - 4])
            else:
                units.append(qh[:, :, 8 * h + 4 * i + u - 8])
    nib = torch.stack(units, dim=0).permute(2, 0, 1).contiguous()  # [NB, 48, M]
    sc = blk[:, :, 192:208]  # int8 bits
    groups = [sc[:, :, [8 * (g // 2) + g % 2 + 2 * s for s in range(4)]] for g in range(4)]
    words = torch.stack(groups, dim=2).contiguous().view(torch.int32).reshape(m, nb, 4)
    hdr = torch.cat([d_words(blk, 208)[:, :, None], words], dim=-1)
    return nib, hdr.permute(1, 2, 0).contiguous()


@triton.jit
def _r6chunk_loads(nib_ptr, hdr_ptr, b0, NB, M, rr, rmask, jj, BB: tl.constexpr):
    """Blocks b0 .. b0 + BB - 1 of rows ``rr`` (past ``NB`` or ``rmask`` zero): the 12 units
    as [BB, 1, 4 (g), RB] loads, then d's word and the groups' scale words, as
    ``_rchunk_loads``."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NB)[:, None, None, None] & rmask[None, None, None, :]
    b4 = bb[:, None, None, None]
    p = nib_ptr + (b4 * 48 + jj[None, None, :, None]) * M + rr[None, None, None, :]
    q = (_words4(p, M, bm), _words4(p + 16 * M, M, bm), _words4(p + 32 * M, M, bm))
    h0, hs = _rheaders(hdr_ptr, b4, M, rr, jj, bm)
    return q, h0, hs


@triton.jit
def _r6_sub(s: tl.constexpr, hs, xs_ptr, s16_ptr, b4, hh, ii, bm, acc_s):
    """Sub-block s's d-less part: scale * s_x * (q . x8 - 32 * sum(x8))."""
    sc = ((hs << (24 - 8 * s)) >> 24).to(tl.float32)  # int8 scale s of the group's word
    sx = tl.load(xs_ptr + b4 * 8 + 4 * hh + s, mask=bm, other=0.0)
    x16 = tl.load(s16_ptr + b4 * 16 + 8 * hh + 2 * s + ii, mask=bm, other=0)
    return sc * sx * (acc_s - 32 * x16).to(tl.float32)


@triton.jit
def _r6chunk_fma(q, h0, hs, xw_ptr, xs_ptr, s16_ptr, b0, NB, jj, BB: tl.constexpr,
                 DP4A: tl.constexpr, acc):
    """acc [BB, 1, 4, RB] += d * sum over the group's four sub-blocks of scale * s_x *
    (q . x8 - 32 * sum(x8)): four dp4a for three words, the sums inside the thread."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NB)[:, None, None, None]
    b4 = bb[:, None, None, None]
    g = jj[None, None, :, None]
    hh = g // 2
    ii = g % 2
    xp = xw_ptr + b4 * 64 + 32 * hh + 4 * ii  # [BB, 1, 4, 1]: word of weight 128h + 4t, t = 4i
    a0 = tl.zeros(q[0][0].shape, tl.int32)
    a1 = tl.zeros(q[0][0].shape, tl.int32)
    a2 = tl.zeros(q[0][0].shape, tl.int32)
    a3 = tl.zeros(q[0][0].shape, tl.int32)
    for u in tl.static_range(4):
        la = q[0][u]
        lb = q[1][u]
        hq = q[2][u]
        a0 = _dp4a((la & 0x0F0F0F0F) | ((hq << 4) & 0x30303030),
                   tl.load(xp + u, mask=bm, other=0), a0, DP4A)
        a1 = _dp4a((lb & 0x0F0F0F0F) | ((hq << 2) & 0x30303030),
                   tl.load(xp + 8 + u, mask=bm, other=0), a1, DP4A)
        a2 = _dp4a(((la >> 4) & 0x0F0F0F0F) | (hq & 0x30303030),
                   tl.load(xp + 16 + u, mask=bm, other=0), a2, DP4A)
        a3 = _dp4a(((lb >> 4) & 0x0F0F0F0F) | ((hq >> 2) & 0x30303030),
                   tl.load(xp + 24 + u, mask=bm, other=0), a3, DP4A)
    d, _ = _d_dmin(h0)  # (its high half is zero)
    part = _r6_sub(0, hs, xs_ptr, s16_ptr, b4, hh, ii, bm, a0)
    part += _r6_sub(1, hs, xs_ptr, s16_ptr, b4, hh, ii, bm, a1)
    part += _r6_sub(2, hs, xs_ptr, s16_ptr, b4, hh, ii, bm, a2)
    part += _r6_sub(3, hs, xs_ptr, s16_ptr, b4, hh, ii, bm, a3)
    acc += d * part
    return acc


@triton.jit
def _q6kr_product(xw_ptr, xs_ptr, s16_ptr, nib_ptr, hdr_ptr, out_ptr, M, NB,
                  ADD: tl.constexpr, MODE: tl.constexpr, RB: tl.constexpr, BB: tl.constexpr,
                  SPLIT: tl.constexpr, DP4A: tl.constexpr = 1, GDC: tl.constexpr = 1):
    """out (+)= W . x over ``repack6``'s blocks and ``quantize_x``'s x, as ``_q4kr_product``
    (no SwiGLU: the file's Q6_K matrices are down projections, v and the output matrix)."""
    pid, sid, rr, rmask, jj, acc = _rtile(M, RB, BB)
    b_first = sid * BB
    b_start = b_first
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 3:
        q, h0, hs = _r6chunk_loads(nib_ptr, hdr_ptr, b_first, NB, M, rr, rmask, jj, BB)
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_wait()
    if MODE == 3:
        acc = _r6chunk_fma(q, h0, hs, xw_ptr, xs_ptr, s16_ptr, b_first, NB, jj, BB, DP4A, acc)
        b_start = b_first + SPLIT * BB
    for b0 in range(b_start, NB, SPLIT * BB):
        q, h0, hs = _r6chunk_loads(nib_ptr, hdr_ptr, b0, NB, M, rr, rmask, jj, BB)
        acc = _r6chunk_fma(q, h0, hs, xw_ptr, xs_ptr, s16_ptr, b0, NB, jj, BB, DP4A, acc)
    _r_epilogue(acc, pid, rmask, out_ptr, out_ptr, out_ptr, out_ptr, out_ptr, M, 0, ADD, RB,
                SPLIT, 0)


def q6kr_product(xq: XQ, w: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor, *,
                 add: bool, mode: str, rows: int, blocks: int, split: int, warps: int,
                 gdc: bool = True) -> None:
    """``w``: ``repack6``'s (nib, hdr); the rest as ``q4kr_product``'s."""
    nib, hdr = w
    nb, _, m = nib.shape
    if xq[0].numel() * 4 != nb * QK_K or hdr.shape != (nb, 5, m):
        raise ValueError(f"repacked blocks [{nb}, 48, {m}] do not match x of "
                         f"{xq[0].numel() * 4}")
    if split > 1 and (not add or out.dtype != torch.float32):
        raise ValueError("a split Q6_K product adds into float32")
    extra = {"launch_pdl": True} if gdc else {}
    _q6kr_product[(triton.cdiv(m, rows), split)](
        xq[0], xq[1], xq[3], nib, hdr, out, m, nb, ADD=add, MODE=MODES[mode], RB=rows,
        BB=blocks, SPLIT=split, DP4A=int(gdc), GDC=int(gdc), num_warps=warps, **extra)


def reference6(xq: XQ, w: torch.Tensor) -> torch.Tensor:
    """What ``_q6kr_product`` computes, in float32 torch: the file's decode (dequant.py) times
    the x ``quantize_x``'s words stand for."""
    xd = x_words(xq)
    k = xd.numel()
    return _q6_k(w.reshape(-1, Q6_BYTES)).reshape(w.shape[0], k) @ xd


def random_blocks6(rows: int, k: int, device: str | torch.device,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """uint8 [rows, k / 256 * 210]: random Q6_K blocks, d a small positive float16."""
    nb = k // QK_K
    w = torch.randint(0, 256, (rows, nb, Q6_BYTES), dtype=torch.uint8, device=device,
                      generator=generator)
    d = torch.rand(rows, nb, 1, device=device, generator=generator) * 2e-4 + 1e-5
    w[:, :, 208:210] = d.to(torch.float16).view(torch.uint8).reshape(rows, nb, 2)
    return w.reshape(rows, nb * Q6_BYTES)


# Run 237's forms for the 0.5B's file (Q5_0 for q, k, o, gate, up and half of v; Q8_0 for the
# other half of v and the output matrix): blocks of 32 weights, one f16 scale d each, grouped
# four to a "superblock" of 128 so that the tile is the Q4_K form's [BB, 1, 4, RB] with the
# four a superblock's blocks (a thread holds one block's words for its four rows):
#   Q8_0 (34 bytes: d, 32 int8): qs [NS, 32, M], position 4i + j word i (bytes 4i .. 4i + 3)
#        of block j; hdr [NS, 4, M] d's bits (36 bytes a block)
#   Q5_0 (22 bytes: d, qh: bit l the fifth bit of weight l, 16 bytes of nibbles: byte l weight
#        l low, l + 16 high; q - 16): qs [NS, 16, M] as Q8_0's (i = 0-3); hdr [NS, 2, 4, M]:
#        qh rearranged so that word i's fifth bits sit at bit 8c + i (its low nibbles' weights
#        4i + c) and 8c + 4 + i (its high nibbles'), then d's bits (24 bytes a block)


def repack32(w: torch.Tensor, fmt: str, swiglu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [M, K / 32 * bytes] rows of file-order Q8_0 or Q5_0 blocks -> (qs, hdr) above
    (SwiGLU: gate and up rows interleaved, as ``repack``)."""
    size = Q8_BYTES if fmt == "q8_0" else Q5_BYTES
    m, rs = w.shape
    if swiglu:
        w = interleaved(w)
    nb = rs // size
    ns = nb // 4
    blk = w.contiguous().reshape(m, nb, size)
    dw = d_words(blk, 0).reshape(m, ns, 4)  # [M, NS, 4 (j)]
    q = blk[:, :, (2 if fmt == "q8_0" else 6):].contiguous().view(torch.int32)  # [M, NB, NW]
    nw = q.shape[2]
    qs = q.reshape(m, ns, 4, nw).permute(1, 3, 2, 0).reshape(ns, nw * 4, m).contiguous()
    if fmt == "q8_0":
        return qs, dw.permute(1, 2, 0).contiguous()
    qh = blk[:, :, 2:6].contiguous().view(torch.int32).reshape(m, nb)
    bits = torch.arange(32, device=w.device, dtype=torch.int32)
    src = (qh[:, :, None] >> bits) & 1  # [M, NB, 32]: bit l of qh
    c, lo_hi, i = bits // 8, (bits % 8) // 4, bits % 4  # destination bit 8c + 4 * lo_hi + i
    fifth = src[:, :, 16 * lo_hi + 4 * i + c]  # the weight whose fifth bit lands there
    qh2 = (fifth.to(torch.int64) << bits.to(torch.int64)).sum(dim=2)  # 0 .. 2^32 - 1
    qh2 = torch.where(qh2 >= 2**31, qh2 - 2**32, qh2).to(torch.int32).reshape(m, ns, 4)
    hdr = torch.stack([qh2, dw], dim=2)  # [M, NS, 2, 4]
    return qs, hdr.permute(1, 2, 3, 0).contiguous()


@triton.jit
def _q32_fma(qs_ptr, hdr_ptr, xw_ptr, xs_ptr, s16_ptr, b0, NS, M, rr, rmask, jj,
             BB: tl.constexpr, Q5: tl.constexpr, DP4A: tl.constexpr, acc):
    """acc [BB, 1, 4, RB] += superblocks b0 .. b0 + BB - 1: each block's d * s_x * (q . x8,
    less 16 * sum(x8) for Q5_0), its words' dp4a chained in the thread."""
    bb = b0 + tl.arange(0, BB)
    bm = (bb < NS)[:, None, None, None] & rmask[None, None, None, :]
    xm = (bb < NS)[:, None, None, None]
    b4 = bb[:, None, None, None]
    j4 = jj[None, None, :, None]
    r4 = rr[None, None, None, :]
    blk = b4 * 4 + j4  # [BB, 1, 4, 1]: the block of 32 (and x's group)
    xp = xw_ptr + blk * 8
    s = tl.zeros([BB, 1, 4, 1], tl.int32) + tl.zeros_like(r4)
    if Q5:
        p = qs_ptr + (b4 * 16 + j4) * M + r4
        hp = hdr_ptr + (b4 * 8 + j4) * M + r4
        qh = tl.load(hp, mask=bm, other=0, eviction_policy="evict_first")
        d = tl.load(hp + 4 * M, mask=bm, other=0, eviction_policy="evict_first")
        for i in tl.static_range(4):
            w = tl.load(p + 4 * i * M, mask=bm, other=0, eviction_policy="evict_first")
            lo = (w & 0x0F0F0F0F) | (((qh >> i) << 4) & 0x10101010)
            hi = ((w >> 4) & 0x0F0F0F0F) | ((qh >> i) & 0x10101010)
            s = _dp4a(lo, tl.load(xp + i, mask=xm, other=0), s, DP4A)
            s = _dp4a(hi, tl.load(xp + 4 + i, mask=xm, other=0), s, DP4A)
        x16 = (tl.load(s16_ptr + 2 * blk, mask=xm, other=0)
               + tl.load(s16_ptr + 2 * blk + 1, mask=xm, other=0))
        s = s - 16 * x16
    else:
        p = qs_ptr + (b4 * 32 + j4) * M + r4
        d = tl.load(hdr_ptr + (b4 * 4 + j4) * M + r4, mask=bm, other=0,
                    eviction_policy="evict_first")
        for i in tl.static_range(8):
            w = tl.load(p + 4 * i * M, mask=bm, other=0, eviction_policy="evict_first")
            s = _dp4a(w, tl.load(xp + i, mask=xm, other=0), s, DP4A)
    df, _ = _d_dmin(d)  # (its high half: Q5_0's and Q8_0's d words hold d alone)
    sx = tl.load(xs_ptr + blk, mask=xm, other=0.0)
    acc += df * sx * s.to(tl.float32)
    return acc


@triton.jit
def _q32r_product(xw_ptr, xs_ptr, s16_ptr, qs_ptr, hdr_ptr, out_ptr, qw_ptr, qs2_ptr,
                  qsum_ptr, q16_ptr, M, NS, Q5: tl.constexpr, SWIGLU: tl.constexpr,
                  ADD: tl.constexpr, MODE: tl.constexpr, RB: tl.constexpr, BB: tl.constexpr,
                  SPLIT: tl.constexpr, QOUT: tl.constexpr = 0, DP4A: tl.constexpr = 1,
                  GDC: tl.constexpr = 1):
    """out (+)= W . x over ``repack32``'s blocks (``NS`` superblocks of 128) and
    ``quantize_x``'s x, as ``_q4kr_product``, but waiting first (MODE 1 only: a superblock's
    loads and arithmetic are one pass here)."""
    pid, sid, rr, rmask, jj, acc = _rtile(M, RB, BB)
    if MODE != 0 and GDC:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    for b0 in range(sid * BB, NS, SPLIT * BB):
        acc = _q32_fma(qs_ptr, hdr_ptr, xw_ptr, xs_ptr, s16_ptr, b0, NS, M, rr, rmask, jj, BB,
                       Q5, DP4A, acc)
    _r_epilogue(acc, pid, rmask, out_ptr, qw_ptr, qs2_ptr, qsum_ptr, q16_ptr, M, SWIGLU, ADD,
                RB, SPLIT, QOUT)


def q32r_product(xq: XQ, w: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor, *, fmt: str,
                 swiglu: bool, add: bool, rows: int, blocks: int, split: int, warps: int,
                 qout: XQ | None = None, gdc: bool = True) -> None:
    """``w``: ``repack32``'s (qs, hdr) of ``fmt`` ("q8_0" or "q5_0"); the rest as
    ``q4kr_product``'s (waiting first: the loads and their arithmetic are one pass)."""
    qs, hdr = w
    ns, _, m = qs.shape
    if xq[0].numel() * 4 != ns * 128:
        raise ValueError(f"repacked blocks [{ns}, {qs.shape[1]}, {m}] do not match x of "
                         f"{xq[0].numel() * 4}")
    if split > 1 and (swiglu or not add or out.dtype != torch.float32):
        raise ValueError("a split product adds into float32 (not SwiGLU)")
    if qout is not None and not (swiglu and rows == 64 and m % 64 == 0):
        raise ValueError("a quantized output needs SwiGLU, 64 rows a program and whole groups")
    extra = {"launch_pdl": True} if gdc else {}
    _q32r_product[(triton.cdiv(m, rows), split)](
        xq[0], xq[1], xq[3], qs, hdr, out, *(qout if qout is not None else xq), m, ns,
        Q5=int(fmt == "q5_0"), SWIGLU=swiglu, ADD=add, MODE=1, RB=rows, BB=blocks,
        SPLIT=split, QOUT=int(qout is not None), DP4A=int(gdc), GDC=int(gdc),
        num_warps=warps, **extra)


def random_blocks32(rows: int, k: int, fmt: str, device: str | torch.device,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """uint8 [rows, k / 32 * bytes]: random Q8_0 or Q5_0 blocks, d a small positive float16."""
    size = Q8_BYTES if fmt == "q8_0" else Q5_BYTES
    nb = k // 32
    w = torch.randint(0, 256, (rows, nb, size), dtype=torch.uint8, device=device,
                      generator=generator)
    d = torch.rand(rows, nb, 1, device=device, generator=generator) * 2e-3 + 1e-4
    w[:, :, :2] = d.to(torch.float16).view(torch.uint8).reshape(rows, nb, 2)
    return w.reshape(rows, nb * size)


def decoded32(w: torch.Tensor, k: int, fmt: str) -> torch.Tensor:
    """float32 [rows, k]: dequant.py's decode of the blocks."""
    if fmt == "q8_0":
        return _q8_0(w.reshape(-1, Q8_BYTES)).reshape(w.shape[0], k)
    return _q5_0(w.reshape(-1, Q5_BYTES)).reshape(w.shape[0], k)


def rtiles(swiglu: bool, nb: int, add: bool = True,
           blocks: tuple[int, ...] = (1, 2)) -> list[tuple[int, int, int, int]]:
    """(rows, blocks, split, warps) swept for the repacked forms: 16-256 rows (four a thread,
    lanes on rows, the warps beyond a row's lanes on the four pairs or groups), ``blocks`` an
    iteration (``nb`` of them a row), split over K (atomics: products that add) in up to 16
    (run 231's down projections were best at its largest split then, 8; run 233's o-projection,
    6 blocks a row, at 6)."""
    out = []
    for r, w in ((16, 1), (32, 1), (64, 2), (128, 4), (256, 8)):
        for bb in blocks:
            for sp in ((1, 2, 3, 4, 6, 8, 16) if add and not swiglu else (1,)):
                if sp * bb <= nb:
                    out.append((r, bb, sp, w))
    return out


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


def checked(launch: Callable[[Any, torch.Tensor], None], want: torch.Tensor, w: Any,
            out: torch.Tensor, add: bool, what: str, tol: float = 2e-2) -> float:
    """Relative error of one launch against ``want`` (outputs poisoned, or zeroed to add to)."""
    out.fill_(0.0 if add else float("nan"))
    launch(w, out)
    torch.cuda.synchronize()
    err = float(((out.float().reshape(-1) - want).norm() / want.norm()).item())
    if not err < tol:  # (NaN fails too: an element never written)
        raise SystemExit(f"bench_q4k: {what} is wrong: relative error {err:.3g}")
    return err


def run_product(model: str, name: str, sms: int, log: list[str], variants: set[str],
                reads: bool, tprobe: int = 1) -> dict[str, Any]:
    prod = PRODUCTS[(model, name)]
    n, k, swiglu, add = prod.n, prod.k, prod.swiglu, prod.add
    m = 2 * n if swiglu else n
    b16 = m * k * 2
    per, size = FILE_BYTES[prod.fmt]
    bq = m * k // per * size  # the file's bytes
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(k, device="cuda", dtype=torch.float32, generator=g)
    odt = torch.bfloat16 if swiglu else torch.float32
    res: dict[str, Any] = {"rows": m, "k": k, "fmt": prod.fmt, "bf16_bytes": b16,
                           "q4k_bytes": bq}

    def say(line: str) -> None:
        log.append(f"{model} {name} {line}")
        print(log[-1], flush=True)

    for mode in ("pdl", "pre") if reads else ():
        for label, nbytes in (("read", b16), ("read4", bq)):
            top = best(nbytes, mode, sms, [])
            res[f"{label}_{mode}"] = {"us": top["us"], "tile": top["tile"]}
            say(f"{label} {mode}: {top['us']:.2f} us ({nbytes / top['us'] / 1e3:.0f} GB/s), "
                f"tile {top['tile']}")

    # bf16: today's product on copies of one random matrix
    n_copy = max(8, -(-CHAIN_BYTES // b16))
    w16 = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
           for _ in range(n_copy)]
    outs = [torch.zeros(1, n, device="cuda", dtype=odt) for _ in range(n_copy)]
    cfg = tuned_configs(ARGS[model], 1)[(prod.tile, 1)]
    assert isinstance(cfg, K.LinearConfig)
    kmode = K.SWIGLU if swiglu else K.ADD if add else K.STORE
    want16 = reference(x, w16[0], swiglu)
    for pdl in (1, 2):

        def ours(w: torch.Tensor, o: torch.Tensor, pdl: int = pdl) -> None:
            K.linear(x.reshape(1, k), w, o, mode=kmode, cfg=cfg, pdl=pdl, evict="evict_first")

        checked(ours, want16, w16[0], outs[0], add, f"ours pdl {pdl}")
        us = chain_us(ours, w16, outs)
        res[f"ours_pdl{pdl}"] = us
        say(f"ours pdl {pdl} ({cfg}): {us:.2f} us ({b16 / us / 1e3:.0f} GB/s)")
    if tprobe > 1:  # today's verify product (its tuned T > 1 tile) over the same copies
        xt = torch.randn(tprobe, k, device="cuda", generator=g)
        outs_t = [torch.zeros(tprobe, n, device="cuda", dtype=odt) for _ in range(n_copy)]
        cfg_t = tuned_configs(ARGS[model], tprobe)[(prod.tile, tprobe)]
        assert isinstance(cfg_t, K.LinearConfig)
        want_t = torch.stack([reference(r, w16[0], swiglu) for r in xt])
        # a split tile adds (the qkv proxy's stores: the step's split-K qkv adds into zeroed
        # sums the same way, its RoPE kernel after)
        add_t = add or cfg_t.split_k > 1
        kmode_t = K.ADD if add_t and not swiglu else kmode
        for pdl in (1, 2):

            def ours_t(w: torch.Tensor, o: torch.Tensor, pdl: int = pdl) -> None:
                K.linear(xt, w, o, mode=kmode_t, cfg=cfg_t, pdl=pdl, evict="evict_first")

            checked(ours_t, want_t.reshape(-1), w16[0], outs_t[0], add_t, f"ours T={tprobe}")
            us = chain_us(ours_t, w16, outs_t)
            res[f"ours_t{tprobe}_pdl{pdl}"] = us
            say(f"ours T = {tprobe} pdl {pdl} ({cfg_t}): {us:.2f} us")
        del outs_t
    del w16, outs
    torch.cuda.empty_cache()

    # the file's type: the same chain over random blocks
    n_copy = max(8, -(-CHAIN_BYTES // bq))
    outs = [torch.zeros(n, device="cuda", dtype=odt) for _ in range(n_copy)]
    if prod.fmt == "q6k":
        w6 = [random_blocks6(m, k, "cuda", g) for _ in range(n_copy)]
        if "q6kr" in variants:
            run_repacked6(res, x, w6, outs, add, k, say)
        del w6
    elif prod.fmt in ("q5_0", "q8_0"):
        w32 = [random_blocks32(m, k, prod.fmt, "cuda", g) for _ in range(n_copy)]
        if "q32r" in variants:
            run_repacked32(res, x, w32, outs, prod.fmt, swiglu, add, k, say)
        del w32
    else:
        w4 = [random_blocks(m, k, "cuda", g) for _ in range(n_copy)]
        run_q4k_forms(res, x, w4, outs, swiglu, add, k, variants, say)
        if "q4kr" in variants:
            run_repacked(res, x, w4, outs, swiglu, add, k, say, tprobe)
        for form in ("q4km", "q4kd", "q4kdw", "q4kdm"):
            if form in variants and tprobe > 1:
                run_mma(res, form, w4, n, swiglu, add, k, tprobe, say)
        del w4
    best16 = min(res["ours_pdl1"], res["ours_pdl2"])
    tops = [v[0]["us"] for lb, v in res.items() if lb.startswith("q") and isinstance(v, list)
            and v and "_t" not in lb and "_lin" not in lb]  # (one-token forms only)
    if tops:
        res["ratio_q4k_to_ours"] = round(min(tops) / best16, 3)
        say(f"{prod.fmt} / ours: {min(tops):.2f} / {best16:.2f} us = "
            f"{res['ratio_q4k_to_ours']:.3f}")
    del outs
    torch.cuda.empty_cache()
    return res


def run_q4k_forms(res: dict[str, Any], x: torch.Tensor, w4: list[torch.Tensor],
                  outs: list[torch.Tensor], swiglu: bool, add: bool, k: int,
                  variants: set[str], say: Callable[[str], None]) -> None:
    """Runs 227-230's forms on the file's own layout (``--variants`` q4k, q4kx, q4kb,
    q4kbm)."""
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
        b4 = res["q4k_bytes"]
        say(f"{label}: best {top['us']:.2f} us ({b4 / top['us'] / 1e3:.0f} GB/s of Q4_K, "
            f"{res['bf16_bytes'] / top['us'] / 1e3:.0f} bf16-equivalent), tile {top['tile']}, "
            f"err {top['err']:.1e}; next "
            + ", ".join(f"{r['us']:.2f} {r['tile']}" for r in runs[1:4]))


def run_repacked(res: dict[str, Any], x: torch.Tensor, w4: list[torch.Tensor],
                 outs: list[torch.Tensor], swiglu: bool, add: bool, k: int,
                 say: Callable[[str], None], tprobe: int = 1) -> None:
    """``q4kr``: ``sweep_repacked`` over ``repack``'s copies of the same blocks, checked against
    what the kernel computes (``reference_q``: a bf16 SwiGLU output rounds at ~4e-3) and
    reported against the float32 product over x itself (the error x's int8 rounding adds)."""
    xq = quantize_x(x)
    ws = [repack(w, swiglu) for w in w4]
    want = reference_q(xq, x, w4[0], swiglu)
    exact = reference(x, decoded(w4[0], k), swiglu)

    def launch(w: Any, o: torch.Tensor, tile: tuple[int, int, int, int], mode: str) -> None:
        rows, blocks, split, warps = tile
        q4kr_product(xq, w, o, swiglu=swiglu, add=add, mode=mode, rows=rows, blocks=blocks,
                     split=split, warps=warps)

    sweep_repacked(res, "q4kr", launch, ws, outs, want, exact, add,
                   rtiles(swiglu, k // QK_K, add),
                   res["q4k_bytes"] * REPACK_BYTES // BLOCK_BYTES, say)
    if tprobe < 2:
        return
    # --tprobe: the best four tiles again with T rows of x added into one product (each row's
    # integer work on the same bytes: a verify step's arithmetic without its T accumulators)
    xt = torch.randn(tprobe, k, device=x.device)
    xqt = quantize_rows(xt)
    lin = sum(reference_q(quantize_x(r), r, w4[0], False) for r in xt)
    n = lin.numel() // 2
    want_t = torch.nn.functional.silu(lin[:n]) * lin[n:] if swiglu else lin
    runs: list[dict[str, Any]] = []
    for tile in [tuple(r["tile"]) for r in res["q4kr_pre"][:4]]:
        rows, blocks, split, warps = tile

        def one(w: Any, o: torch.Tensor, rows: int = rows, blocks: int = blocks,
                split: int = split, warps: int = warps) -> None:
            q4kr_product(xqt, w, o, swiglu=swiglu, add=add, mode="pre", rows=rows,
                         blocks=blocks, split=split, warps=warps, tokens=tprobe)

        err = checked(one, want_t, ws[0], outs[0], add, f"q4kr T={tprobe} {list(tile)}",
                      tol=1e-2)
        runs.append({"us": chain_us(one, ws, outs), "tile": list(tile), "err": err})
    runs.sort(key=lambda r: r["us"])
    res[f"q4kr_t{tprobe}"] = runs
    say(f"q4kr T = {tprobe} (rows added): best {runs[0]['us']:.2f} us, tile {runs[0]['tile']}, "
        f"err {runs[0]['err']:.1e}; T = 1 {res['q4kr_pre'][0]['us']:.2f}")


def mtiles(swiglu: bool, add: bool, nb: int) -> list[tuple[int, int, int]]:
    """(rows, split, warps) swept for the verify forms: 16-128 rows a program on 1 or 4
    warps (fewer than 64 rows compile to mma.sync, 64 and more to wgmma for sm_90; run 239's
    128 rows were slower on 8 warps than on 4), split over K (atomics) where the product adds
    and a program would still have a block."""
    out = []
    for r, ws in ((16, (1,)), (32, (1, 4)), (64, (4,)), (128, (4,))):
        for sp in ((1, 2, 3, 4, 6, 8, 16) if add and not swiglu else (1,)):
            if sp <= nb:
                out.extend((r, sp, w) for w in ws)
    return out


def run_mma(res: dict[str, Any], form: str, w4: list[torch.Tensor], n: int, swiglu: bool,
            add: bool, k: int, tokens: int, say: Callable[[str], None]) -> None:
    """``q4km`` / ``q4kd`` / ``q4kdw`` / ``q4kdm`` (``--tprobe T``): a verify step's product,
    T rows of x each with its own output, over ``repack_mma``'s copies of the same blocks; each
    tile
    checked against what it computes (``reference_q`` a row; ``reference_d``) and, reported,
    against the float32 product over x itself, then its chain timed, beside today's bf16
    verify product at the same T (``ours_t*``). ``q4km``'s quantizing kernel is not in its
    time (the one-token forms' is not either; ``--layers`` adds it there), nor is ``q4kdw``'s
    reordering of x into the nibbles' order (a step would have its producer write it so).
    A SwiGLU product, which cannot split (its rows are whole), is also timed as
    ``{form}_lin``: its interleaved
    rows as a plain product split over K into float32 pre-activations (SwiGLU left to the
    product that reads them: not built)."""
    g = torch.Generator(device=w4[0].device).manual_seed(1)
    xt = torch.randn(tokens, k, device=w4[0].device, generator=g)
    ws = [repack_mma(w, swiglu) for w in w4]
    wl = interleaved(w4[0]) if swiglu else w4[0]  # the rows as packed
    if form == "q4km":
        xm = quantize_cols(xt)
    else:
        xm = bf16_cols(xt, nibble=form == "q4kdw")

    def want_of(act: bool) -> torch.Tensor:
        if form == "q4km":
            return torch.stack([reference_q(quantize_x(r), r, w4[0] if act else wl, act)
                                for r in xt]).reshape(-1)
        return reference_d(xt, w4[0] if act else wl, act).reshape(-1)

    best16 = min(res.get(f"ours_t{tokens}_pdl1", float("inf")),
                 res.get(f"ours_t{tokens}_pdl2", float("inf")))
    # a stored product (the qkv proxy) is timed adding into zeroed sums, split as the bf16
    # verify tile it is compared with may be (``run_product``)
    for label, act, add_ in ((form, swiglu, add or not swiglu), (f"{form}_lin", False, True)):
        if label != form and not swiglu:
            continue
        dec = decoded(w4[0] if act else wl, k)
        exact = torch.stack([reference(r, dec, act) for r in xt]).reshape(-1)
        want = want_of(act)
        odt = torch.bfloat16 if act else torch.float32
        rows_out = n if act or not swiglu else 2 * n
        outs = [torch.zeros(tokens, rows_out, device=w4[0].device, dtype=odt) for _ in ws]
        runs: list[dict[str, Any]] = []
        for tile in mtiles(act, add_, k // QK_K):
            rows, split, warps = tile

            def one(w: Any, o: torch.Tensor, rows: int = rows, split: int = split,
                    warps: int = warps, act: bool = act, add_: bool = add_) -> None:
                q4km_product(xm, w, o, tokens=tokens, swiglu=act, add=add_, rows=rows,
                             split=split, warps=warps, whole=form == "q4kdw",
                             bits=form == "q4kdm")

            what = f"{label} T={tokens} {list(tile)}"
            err = checked(one, want, ws[0], outs[0], add_, what, tol=1e-2)
            err_x = checked(one, exact, ws[0], outs[0], add_, f"{what} (x)", tol=1e-1)
            runs.append({"us": chain_us(one, ws, outs), "tile": list(tile), "err": err,
                         "err_x": err_x})
        runs.sort(key=lambda r: r["us"])
        res[f"{label}_t{tokens}"] = runs
        top = runs[0]
        res[f"ratio_{label}_t{tokens}_to_ours"] = round(top["us"] / best16, 3)
        say(f"{label} T = {tokens}: best {top['us']:.2f} us (bf16 verify {best16:.2f}: "
            f"{top['us'] / best16:.3f}x), tile {top['tile']}, err {top['err']:.1e} (against x "
            f"itself {top['err_x']:.1e}); next "
            + ", ".join(f"{r['us']:.2f} {r['tile']}" for r in runs[1:4]))
        del outs


def run_repacked6(res: dict[str, Any], x: torch.Tensor, w6: list[torch.Tensor],
                  outs: list[torch.Tensor], add: bool, k: int,
                  say: Callable[[str], None]) -> None:
    """``q6kr``: as ``run_repacked``, over ``repack6``'s copies of Q6_K blocks."""
    xq = quantize_x(x)
    ws = [repack6(w) for w in w6]
    want = reference6(xq, w6[0])
    exact = _q6_k(w6[0].reshape(-1, Q6_BYTES)).reshape(w6[0].shape[0], k) @ x

    def launch(w: Any, o: torch.Tensor, tile: tuple[int, int, int, int], mode: str) -> None:
        rows, blocks, split, warps = tile
        q6kr_product(xq, w, o, add=add, mode=mode, rows=rows, blocks=blocks, split=split,
                     warps=warps)

    sweep_repacked(res, "q6kr", launch, ws, outs, want, exact, add,
                   rtiles(False, k // QK_K, add),
                   res["q4k_bytes"] * Q6_REPACK_BYTES // Q6_BYTES, say)


def run_repacked32(res: dict[str, Any], x: torch.Tensor, w32: list[torch.Tensor],
                   outs: list[torch.Tensor], fmt: str, swiglu: bool, add: bool, k: int,
                   say: Callable[[str], None]) -> None:
    """``q32r``: as ``run_repacked``, over ``repack32``'s copies of Q5_0 or Q8_0 blocks, every
    tile timed once, waiting first (``q32r_pdl``; run 237 timed each twice, as ``_pre`` too)."""
    xq = quantize_x(x)
    ws = [repack32(w, fmt, swiglu) for w in w32]
    xd = x_words(xq)
    want = reference(xd, decoded32(w32[0], k, fmt), swiglu)
    exact = reference(x, decoded32(w32[0], k, fmt), swiglu)

    def launch(w: Any, o: torch.Tensor, tile: tuple[int, int, int, int], mode: str) -> None:
        rows, blocks, split, warps = tile
        q32r_product(xq, w, o, fmt=fmt, swiglu=swiglu, add=add, rows=rows, blocks=blocks,
                     split=split, warps=warps)

    size = FILE_BYTES[fmt][1]
    sweep_repacked(res, "q32r", launch, ws, outs, want, exact, add,
                   rtiles(swiglu, k // 128, add, (1, 2, 4)),
                   res["q4k_bytes"] * (size + 2) // size, say)  # (d padded to a word)


def sweep_repacked(res: dict[str, Any], name: str,
                   launch: Callable[[Any, torch.Tensor, tuple[int, int, int, int], str], None],
                   ws: list[Any], outs: list[torch.Tensor], want: torch.Tensor,
                   exact: torch.Tensor, add: bool, swept: list[tuple[int, int, int, int]],
                   nbytes: int, say: Callable[[str], None]) -> None:
    """Every tile with its first chunk before the wait (``pre``), then the best four waiting
    first (``pdl``): each checked (poisoned outputs) before its chain is timed."""
    for mode in ("pre", "pdl") if name != "q32r" else ("pdl",):  # (q32r always waits first)
        label = f"{name}_{mode}"
        tiles_ = (swept if mode == "pre" or name == "q32r"
                  else [tuple(r["tile"]) for r in res[f"{name}_pre"][:4]])
        runs: list[dict[str, Any]] = []
        for tile in tiles_:

            def one(w: Any, o: torch.Tensor, tile: Any = tile, mode: str = mode) -> None:
                launch(w, o, tile, mode)

            err = checked(one, want, ws[0], outs[0], add, f"{label} {list(tile)}", tol=1e-2)
            err_x = checked(one, exact, ws[0], outs[0], add, f"{label} {list(tile)} (x)",
                            tol=1e-1)  # (reported: x's rounding, ~1e-2 through SwiGLU)
            us = chain_us(one, ws, outs)
            runs.append({"us": us, "tile": list(tile), "err": err, "err_x": err_x})
        runs.sort(key=lambda r: r["us"])
        res[label] = runs
        top = runs[0]
        say(f"{label}: best {top['us']:.2f} us ({nbytes / top['us'] / 1e3:.0f} GB/s of its "
            f"bytes, {res['bf16_bytes'] / top['us'] / 1e3:.0f} bf16-equivalent), tile "
            f"{top['tile']}, err {top['err']:.1e} (against x itself {top['err_x']:.1e}); next "
            + ", ".join(f"{r['us']:.2f} {r['tile']}" for r in runs[1:4]))


@triton.jit
def _quantize_x(x_ptr, xw_ptr, xs_ptr, xsum_ptr, s16_ptr, NG, G: tl.constexpr,
                GDC: tl.constexpr = 1):
    """``quantize_x`` on the GPU, ``G`` groups of 32 a program (``NG`` groups): what a step
    reading quantized blocks launches before each product whose input it does not already
    hold as int8 (``--layers``). Rounds half to even, as torch.round (by 1.5 * 2^23)."""
    pid = tl.program_id(0)
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    g = pid * G + tl.arange(0, G)
    gm = g < NG
    x = tl.load(x_ptr + g[:, None] * 32 + tl.arange(0, 32)[None, :], mask=gm[:, None],
                other=0.0).to(tl.float32)
    _quantize_groups(x, xw_ptr, xs_ptr, xsum_ptr, s16_ptr, g, gm, G)


@triton.jit
def _quantize_groups(x, xw_ptr, xs_ptr, xsum_ptr, s16_ptr, g, gm, G: tl.constexpr):
    """Groups ``g`` (masked by ``gm``) of x [G, 32] float32 quantized as ``quantize_x`` and
    stored into its four buffers."""
    amax = tl.max(tl.abs(x), axis=1)
    s = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    v = tl.math.div_rn(x, tl.where(s > 0, s, 1.0)[:, None])  # (IEEE, as torch: not div.full)
    q = ((v + 12582912.0) - 12582912.0).to(tl.int32)  # (|v| <= 127: exact round to even)
    q = tl.minimum(tl.maximum(q, -127), 127)
    sh = (tl.arange(0, 4) * 8)[None, None, :]
    words = tl.sum((tl.reshape(q, [G, 8, 4]) & 0xFF) << sh, axis=2)  # (disjoint bytes: an or)
    tl.store(xw_ptr + g[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=gm[:, None])
    tl.store(xs_ptr + g, s, mask=gm)
    tl.store(xsum_ptr + g, tl.sum(x, axis=1), mask=gm)
    s16 = tl.sum(tl.reshape(q, [G, 2, 16]), axis=2)
    tl.store(s16_ptr + g[:, None] * 2 + tl.arange(0, 2)[None, :], s16, mask=gm[:, None])


def quantize_into(x: torch.Tensor, xq: XQ, groups: int = 8, gdc: bool = True) -> None:
    """``_quantize_x`` of ``x`` ([K] or [1, K], any float dtype) into ``xq``'s buffers."""
    ng = x.numel() // 32
    extra = {"launch_pdl": True} if gdc else {}
    _quantize_x[(triton.cdiv(ng, groups),)](x, *xq, ng, G=groups, GDC=int(gdc), num_warps=1,
                                            **extra)


def empty_xq(k: int, device: str | torch.device) -> XQ:
    return (torch.empty(k // 4, dtype=torch.int32, device=device),
            torch.empty(k // 32, dtype=torch.float32, device=device),
            torch.empty(k // 32, dtype=torch.float32, device=device),
            torch.empty(k // 16, dtype=torch.int32, device=device))


def pick(swept: dict[str, Any], key: str, default: tuple[int, ...],
         rows: int = 0) -> tuple[int, ...]:
    """The best tile (of ``rows`` rows, if given) this run's sweep of product ``key`` found
    (``pre``; q32r only waits first), else ``default``."""
    for label, runs in swept.get(key, {}).items():
        if label in ("q4kr_pre", "q6kr_pre", "q32r_pdl"):
            for r in runs:
                if not rows or r["tile"][0] == rows:
                    return tuple(r["tile"])
    return default


def run_layers(model: str, log: list[str], swept: dict[str, Any]) -> dict[str, Any]:
    """A model's one-token layer products chained as a step chains them, every layer its own
    weights (past L2), the output projection last, in one CUDA graph: bf16 (``kernels.linear``,
    the tuned tiles) against the file's types read by the repacked forms (tiles from ``swept``,
    this run's product results, where it has them), each quantized product after a
    ``_quantize_x`` of its input; the q, k and v product bf16 in both (a stand-in: the step's
    qkv kernel). No attention, norms or RoPE in either, so neither is a step; their difference
    is what the products would save a step, boundaries and the quantizing kernels included."""
    a = ARGS[model]
    d, f, nl = a.n_embd, a.n_ff, a.n_layer
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    cfg = tuned_configs(a, 1)

    def rnd(rows: int, k: int) -> torch.Tensor:
        return torch.randn(rows, k, device=dev, dtype=torch.bfloat16, generator=g) * 0.01

    h = torch.randn(1, d, device=dev, generator=g)
    attn = torch.randn(1, d, device=dev, generator=g).to(torch.bfloat16)
    act = torch.empty(1, f, device=dev, dtype=torch.bfloat16)
    qkv = torch.empty(1, a.qkv_dim, device=dev)
    logits = torch.empty(1, a.n_vocab, device=dev)
    wqkv = [rnd(a.qkv_dim, d) for _ in range(nl)]
    res: dict[str, Any] = {"model": model, "layers": nl}

    def say(line: str) -> None:
        log.append(f"{model} layers {line}")
        print(log[-1], flush=True)

    def lin(x: torch.Tensor, w: torch.Tensor, o: torch.Tensor, mode: int, name: str,
            pdl: int) -> None:
        c = cfg[(name, 1)]
        assert isinstance(c, K.LinearConfig)
        K.linear(x, w, o, mode=mode, cfg=c, pdl=pdl, evict="evict_first")

    def time16() -> float:
        """bf16: the graph's µs (its weights freed on return)."""
        w16 = [(rnd(d, d), rnd(2 * f, d), rnd(d, f)) for _ in range(nl)]
        out16 = rnd(a.n_vocab, d)

        def step16() -> None:
            for i in range(nl):
                wo, w13, w2 = w16[i]
                lin(attn, wo, h, K.ADD, "wo", 2)
                lin(h, w13, act, K.SWIGLU, "w13", 1)
                lin(act, w2, h, K.ADD, "w2", 2)
                lin(h, wqkv[i], qkv, K.STORE, "wo", 2)
            lin(h, out16, logits, K.STORE, "out", 1)

        return round(graph_us(step16, 1), 2)

    res["bf16_us"] = time16()
    say(f"bf16 chain: {res['bf16_us']:.1f} us")
    torch.cuda.empty_cache()

    # the file's types, tiles from this run's sweeps where it swept them, else runs 231-236's:
    # 1.5B Q4_K o-projection and gate/up, 0.5B Q5_0; both Q4_K / Q6_K down projections in
    # alternate layers; the output matrix Q6_K (1.5B) or Q8_0 (0.5B)
    small = model == "0.5B"
    t_wo = pick(swept, f"{model}:{'woq5' if small else 'wo'}", (32, 1, 6, 1))
    t_w13 = pick(swept, f"{model}:{'w13q5' if small else 'w13'}", (32, 2, 1, 1))
    # (QOUT needs 64 rows a program: run 237 took the best tile's blocks an iteration for it,
    # one, where 64 rows want four for the 0.5B: 11.93 µs against 6.00)
    t_fused = pick(swept, f"{model}:{'w13q5' if small else 'w13'}", (64, 2, 1, 2), rows=64)
    t_w2 = pick(swept, f"{model}:w2", (32, 2, 16, 1))
    t_w2q6 = pick(swept, f"{model}:w2q6", (32, 2, 16, 1))
    t_out = pick(swept, f"{model}:{'outq8' if small else 'outq6'}", (64, 2, 1, 2))
    res["tiles"] = {"wo": t_wo, "w13": t_w13, "fused": t_fused, "w2": t_w2, "w2q6": t_w2q6,
                    "out": t_out}
    say(f"tiles {res['tiles']}")

    def mat(rows: int, k: int, fmt: str, swiglu: bool = False) -> tuple[torch.Tensor, ...]:
        if fmt == "q4k":
            return repack(random_blocks(rows, k, dev, g), swiglu)
        if fmt == "q6k":
            return repack6(random_blocks6(rows, k, dev, g))
        return repack32(random_blocks32(rows, k, fmt, dev, g), fmt, swiglu)

    def prod(xq: XQ, w: Any, o: torch.Tensor, fmt: str, tile: tuple[int, ...], *,
             swiglu: bool = False, add: bool = True, qout: XQ | None = None) -> None:
        rows, blocks, split, warps = tile
        if fmt == "q4k":
            q4kr_product(xq, w, o.view(-1), swiglu=swiglu, add=add, mode="pre", rows=rows,
                         blocks=blocks, split=split, warps=warps, qout=qout)
        elif fmt == "q6k":
            q6kr_product(xq, w, o.view(-1), add=add, mode="pre", rows=rows, blocks=blocks,
                         split=split, warps=warps)
        else:
            q32r_product(xq, w, o.view(-1), fmt=fmt, swiglu=swiglu, add=add, rows=rows,
                         blocks=blocks, split=split, warps=warps, qout=qout)

    f_in = "q5_0" if small else "q4k"  # the o-projection's and gate/up's type
    f_out = "q8_0" if small else "q6k"
    wq = [(mat(d, d, f_in), mat(2 * f, d, f_in, True), mat(d, f, "q4k" if i % 2 else "q6k"))
          for i in range(nl)]
    outq = mat(a.n_vocab, d, f_out)
    xa, xh, xf = empty_xq(d, dev), empty_xq(d, dev), empty_xq(f, dev)
    probe = torch.randn(f, device=dev, generator=g)  # (h itself has grown past float range)
    quantize_into(probe, xf)  # the GPU's quantizer against quantize_x's
    torch.cuda.synchronize()
    want = quantize_x(probe)
    bad = int((xf[0] != want[0]).sum()) + int((xf[1] != want[1]).sum())
    res["quantize_mismatches"] = bad
    if bad:
        raise SystemExit(f"bench_q4k: _quantize_x disagrees with quantize_x on the GPU: {bad} "
                         "words or scales differ")
    wo16 = [rnd(d, d) for _ in range(nl)]

    def stepq(bf16_wo: bool = False, fused: bool = False) -> None:
        for i in range(nl):
            wo, w13, w2 = wq[i]
            if bf16_wo:
                lin(attn, wo16[i], h, K.ADD, "wo", 2)
            else:
                quantize_into(attn, xa)
                prod(xa, wo, h, f_in, t_wo)
            quantize_into(h, xh)
            if fused:
                prod(xh, w13, act, f_in, t_fused, swiglu=True, add=False,
                     qout=xf)
            else:
                prod(xh, w13, act, f_in, t_w13, swiglu=True, add=False)
                quantize_into(act, xf)
            prod(xf, w2, h, "q4k" if i % 2 else "q6k", t_w2 if i % 2 else t_w2q6)
            lin(h, wqkv[i], qkv, K.STORE, "wo", 2)
        quantize_into(h, xh)
        prod(xh, outq, logits, f_out, t_out, add=False)

    res["quant_us"] = round(graph_us(stepq, 1), 2)
    res["ratio"] = round(res["quant_us"] / res["bf16_us"], 3)
    say(f"quantized chain: {res['quant_us']:.1f} us ({res['ratio']:.3f} of bf16's)")
    res["quant_wo16_us"] = round(graph_us(lambda: stepq(True), 1), 2)
    say(f"quantized, the o-projection bf16: {res['quant_wo16_us']:.1f} us "
        f"({res['quant_wo16_us'] / res['bf16_us']:.3f} of bf16's)")
    res["quant_fused_us"] = round(graph_us(lambda: stepq(True, True), 1), 2)
    say(f"quantized, the o-projection bf16, gate/up quantizing its output: "
        f"{res['quant_fused_us']:.1f} us ({res['quant_fused_us'] / res['bf16_us']:.3f} of "
        "bf16's)")
    res["bf16_again_us"] = time16()  # (an A/A: the bf16 chain after the others)
    say(f"bf16 chain again: {res['bf16_again_us']:.1f} us")
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
    ap.add_argument("--variants", default="q4kr,q6kr,q32r",
                    help="comma-separated, from q4k, q4kx, q4kb (run 228's kernel), q4kbm (it "
                         "with the nibbles made floats by their bits), q4kr (run 231's: the "
                         "blocks repacked rows-contiguous, x as int8, dp4a), q6kr (the same "
                         "for Q6_K, the only form for the Q6_K products), q32r (the same "
                         "for Q5_0 and Q8_0), q4km (session 28's verify form: T rows of x "
                         "through int8 matrix instructions; only with --tprobe), q4kd (the "
                         "same bytes decoded to bf16 in registers, bf16 matrix instructions; "
                         "only with --tprobe), q4kdw (q4kd with one product a block), q4kdm "
                         "(q4kd with the nibbles made floats by their bits)")
    ap.add_argument("--no-reads", action="store_true", help="leave out the pure reads")
    ap.add_argument("--tprobe", type=int, default=1, metavar="T",
                    help="T > 1 (at most 16): also today's bf16 product at T rows (its verify "
                         "tile), the Q4_K repacked form's best tiles with T rows of x added "
                         "into one product (a verify step's arithmetic on one step's bytes) "
                         "and, with the q4km, q4kd, q4kdw or q4kdm variants, those verify "
                         "forms (T outputs)")
    ap.add_argument("--layers", nargs="*", choices=("1.5B", "0.5B"), metavar="MODEL",
                    help="after the products, each named model's (1.5B, 0.5B; none named: the "
                         "1.5B) layer products "
                         "chained as a step (run_layers): bf16 against the file's types, with "
                         "the tiles this run's products found")
    args = ap.parse_args(argv)
    if not 1 <= args.tprobe <= 16:
        ap.error(f"--tprobe {args.tprobe}: choose 1 to 16 rows of x (a verify step of k <= 15)")
    forms = ("q4k", "q4kx", "q4kb", "q4kbm", "q4kr", "q6kr", "q32r", "q4km", "q4kd",
             "q4kdw", "q4kdm")
    variants = set(choices(ap, args.variants, forms, "variant"))
    if not variants:
        ap.error("--variants names no form: choose from " + ", ".join(forms))
    if variants & {"q4km", "q4kd", "q4kdw", "q4kdm"} and args.tprobe < 2:
        ap.error("the verify forms (q4km, q4kd, q4kdw, q4kdm) time T rows of x: give "
                 "--tprobe T, 2 to 16")
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
        res[p] = run_product(model, name, sms, log, variants, not args.no_reads, args.tprobe)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "q4k.json").write_text(json.dumps(res, indent=1))
    for model in (args.layers or ["1.5B"]) if args.layers is not None else []:
        res[f"layers {model}"] = run_layers(model, log, res)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "q4k.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
