"""Can a persistent step's hand-offs run under a weight stream at full rate? The skeleton of a
one-token step, or of a 9-token verify step (``scripts/chain_probe.cu``), at the default pair's
byte counts, on the lent H200.

Why: issue 7's one-token goals (80 % / 70 % of the floor) are out of reach of separate kernels
(docs/gpu-notes.md, session 21: the 0.5B's product loops alone exceed what its goal leaves a
layer), so what is left is one persistent launch. The one we built (``decode_step.cu``) ran at
0.97x the Triton step, and its trace could not separate what any persistent design pays (a
layer's chain of grid-wide hand-offs while DRAM is saturated by the stream) from what its own
consumers paid per unit. This benchmark times only the first: a producer warp an SM streams
each phase's share of the weights through decode_step.cu's TMA ring, consumer warps wait for
every block to finish the phase before (a counter), load the input vector from L2, multiply the
stages by it (8 FMAs a 16-byte word, the input read from shared memory), store their share of
the output and count themselves done. Per layer: qkv, attention (3 dependent L2 round trips),
merge (1), o-projection, gate/up, down; then the output projection.

Two hand-offs (``HOPS`` in the source): a counter every block adds to with release semantics
and the next phase polls with acquire (decode_step.cu's grid barrier), or flags in the data
(each output one 8-byte store of its value and the hand-off's tag, each reader polling its
input's elements for the tag: NCCL's LL protocol, no fence and no counter). Every input is
loaded 16 bytes at a time, all of a thread's loads issued before any is stored, unless a
variant says otherwise. Variants, per model:

    stream_bare   the stages alone: no inputs, round trips or outputs, and no arithmetic (ptxas
                  drops sums nothing reads); ``stream_bare_fma`` with the one-token FMAs kept
                  (``SINK``), as every bare ``_t9`` and ``_q4`` form keeps its products (since
                  run 258; run 254's ``stream_bare_t9`` had none)
    stream_bare_spin1  (``2``, ``4``) the stream of 3 phases a layer whose consumers (those of
                  ``stream_bare_fma``) idle 1, 2 or 4 µs at the start of each phase after the
                  first: a hand-off's time with none of its traffic, and with no grid-wide
                  wait (each block idles on its own). If the ring covers such a wait, these run
                  as the bare stream; if not, 84 waits (1.5B; 72 for the 0.5B) add their time.
                  A block's shares of the first two phases are a stage or two, so two of its
                  three waits a layer come close together. Each block waits on its own, so
                  its DRAM share goes to the others meanwhile: run 267 found the grid-wide
                  waits of real hand-offs not covered where these were
    stream_bare_spin2_ns2  (``_ns4``, ``_s12``) ``spin2`` with a ring of 2 or 4 stages of 24
                  KB, or 14 of 12 KB (the same 168 KB in smaller stages)
    stream_bare_ns4  (``_s12``) the bare stream in the 4-stage and 12 KB rings, without waits
    stream_bare_c4  (``_c16``) the bare stream with 4 or 16 consumer warps, not 8;
                  ``stream_bare_read``: the stages read, not multiplied (``stream_bare`` itself
                  only waits for each stage and releases it)
    stream_bare_spin2_wait  (``_read``, and ``spin4``) the idling consumers waiting only, or
                  reading the stages: can the ring cover a wait when the consumers have room?
    stream3_read  (``step3_read``, ``step3_read_st``) 3 phases a layer with consumers that read
                  the stages and do no products: the hand-offs with consumers that have room
    *_lean        (``stream_bare_lean``, ``_lean_st``, ``stream_bare_spin2_lean``,
                  ``stream3_lean``, ``step3_lean``, ``step3_lean_st``) the one-token FMAs with
                  each consumer thread's 8 inputs held in registers, two accumulators
                  (``ARITH`` 4): the products without re-reading the input from shared memory
                  for every weight word. No row's sum is reduced across threads, which a real
                  product's would be
    stream        never waiting: every phase's input load, round trips and outputs
                  (``stream_noin``: no input loads or round trips; ``stream_noout``: no
                  outputs), so ``step`` less ``stream`` is what the waits cost
    step          counters: every hand-off (6 a layer) and the attention's round trips
    step5         the merge folded into the attention (5 hand-offs a layer)
    step_t0       ``step`` without the attention's and the merge's extra round trips
    step_in0      each thread's input loads one at a time, load then store (as decode_step.cu's
                  first version did; also ``step3_in0``)
    step_ns4      ``step`` with a 4-stage ring (96 KB) instead of 7 (168 KB)
    step3         3 hand-offs a layer (``phases``): the attention with the o-projection's
                  columns of its heads, gate/up with the down projection's columns of its rows,
                  each block adding its partial of the whole output with float atomics; the
                  merge is a round trip in the phase, not a hand-off, which is optimistic
                  (``stream3`` never waits)
    step2         a bound below any Qwen2 layer: ``step3`` with q, k and v reaching the
                  attention for free (2 hand-offs a layer; ``stream2``, ``chain2``)
    step_ll       flags in the data instead of counters
    *_pf8         one more warp asks L2 for the stages up to 8 (192 KB) ahead of the producer,
                  so DRAM streams on while the ring is full
    chain         ``step`` with no weight bytes: the hand-offs alone (``chain3``, ``chain2``,
                  ``chain_ll``)
    *_t9          a verify step's skeleton (k = 8: 9 tokens; ``stream_bare_t9``, ``stream3_t9``,
                  ``step3_t9``, ``chain3_t9``, ``stream2_t9``, ``step2_t9``; and
                  ``stream3_noin_t9`` and ``stream3_noout_t9`` as ``stream_noin`` and
                  ``stream_noout`` are to ``stream``; ``*_cl2``, ``_cl4``, ``_cl8``: in clusters
                  of that many blocks that sum their split-K partials through distributed
                  shared memory before adding, each its slice; ``step3_cl4`` the one-token
                  form; ``*_ns4`` the 4-stage ring they use): every input and
                  output 9 vectors (the inputs as bf16 in shared memory), each stage multiplied
                  through matrix instructions (per 16 x 16 tile of weights one ldmatrix of them,
                  one of 16 K of the 9 inputs, two m16n8k16 products), the split-K partials of
                  all 9 tokens added. The question: would a persistent verify step reach the
                  goal (k = 8 at most 1.15x the one-token step @4096)?
    stream_t9     (and ``step_t9``) 6 hand-offs a layer at 9 tokens, each block storing its
                  rows' outputs (no partials), with a 48 KB ring (3 stages of 16 KB) so that the
                  down projection's 9 inputs fit; ``step_r48`` one token with that ring
    stream_bare_q4  (and ``_t9``) the stages as 4-bit weights repacked from Q4_K (0.625 bytes
                  a weight: the matrices' bytes x 5/16), made bf16 in the consumers by their
                  bits and one bf16x2 FMA a pair, then the same products: can a warp-
                  specialized consumer keep up with the quantized stream (session 28's open
                  question)? "% of the floor" stays the bf16 floor's; compare GB/s.
                  ``stream_bare_r4``: the same ring and plan read with no decode or products
                  (what the 4-bit consumers' arithmetic costs over the stream as dealt);
                  ``*_w16``: both with 16 consumer warps over 4 stages of 16 super-tiles
    *_st          with ``STALLS`` (below): each a twin's kernel and plan with the instrument
                  (``STALLED``: ``stream_bare_st``'s twin is ``stream_bare_fma``,
                  ``stream_bare_wait_st``'s ``stream_bare``, the others' their name without
                  ``_st``). ``stream3_lean_st`` and ``stream3_read_st`` are the never-waiting
                  controls of ``step3_lean_st`` and ``step3_read_st``: a step whose ring covers
                  its hand-offs starves less than these by about the hand-offs' time. Where a
                  twin ran, the instrumented form was 0-8 % faster (16 of 20 pairs faster, runs
                  262-266): use its stalls, and the twin's time
    *_g120        on 120 blocks, as many as clusters of 4 or 8 leave resident (the control of
                  the cluster variants); the ``stream*`` cluster variants wait on their cluster
                  at each split-K phase, never on a hand-off

Each is timed as ``--reps`` launches queued back to back between two CUDA events (after one
warm-up), in three batches, the best batch's mean: the host's launch path overlaps the GPU's
work as the Triton step's graph replays do. For every variant that waits, the trace of the last
launch: per hand-off kind, the median over the middle layers of the imbalance (the last block's
outputs stored, less the median block's), the latency (the median block with its next input in
shared memory and its phase's extra round trips walked, less the last block's outputs stored)
and of it the part until the median block saw the count (counters only), and the median layer.
And, for the ``_st`` variants (session 31), where each block waited (``STALLS``), each the
median over the blocks: the time its ring was full (its producer waiting for a free slot), its
consumers starved (waiting for a stage to land), in hand-offs, and in all. The question: why a ring of 5 µs of an SM's
share of the stream does not hide hand-offs of 2 µs (session 29: 4 stages and 7 ran a step
alike). If the ring covered them, a step's consumers would starve less than the never-waiting
stream's by about the hand-offs' time.

Then, in the same process, today's default Triton one-token step at ``--position`` (512;
random weights, its CUDA graph replayed; ``--no-triton`` leaves it out), the baseline each
figure is a ratio to, and where ``_t9`` variants ran, its 9-token verify step too.

"% of the floor" is over the floor the decode benchmarks use: the model's bf16 weight bytes
and the K/V of position + 1 positions, over the copy bandwidth measured in the same run. The
skeleton streams each phase rounded up to whole stages (24 KB; 16 KB for the 48 KB ring, 20 KB
for the 4-bit variants: under 0.1 % more bytes than the model's for bf16), the attention's
phase with one layer's K/V of position + tokens positions (since session 30; run 252's
skeleton streamed no K/V; at position 0 none), dealt to the blocks in shares that differ by
one stage at most. Every block has an SM to itself (its shared memory asked for is at least
half an SM's, so no two share one). On the lent H200, about a minute a position:

    python3 scripts/bench_chain.py --out $OUT/chain
    python3 scripts/bench_chain.py --out $OUT/c4096 --position 4096 \
        --variants stream3,step3,stream3_t9,step3_t9
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import functools
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import copy_bandwidth, step_floor_ms  # noqa: E402  # the decode benchmarks' floor

from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.cuda_step import (  # noqa: E402  # the decode step's build path
    _check,
    _driver,
    _LaunchAttr,
    _LaunchConfig,
    compile_cached,
    load_function,
    with_ptx_helpers,
)

SOURCE = Path(__file__).with_name("chain_probe.cu")
STAGE = 24576
NCW = 8
MODELS = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}
#: Dependent L2 round trips the attention phase walks after its input (scores, softmax,
#: values: the three rounds run 42's trace of decode_step.cu's attention shows), and the merge.
ATT_TRIPS = 3
MERGE_TRIPS = 1
T0 = time.monotonic()


def log(*a: object) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


@functools.cache
def source() -> str:
    """chain_probe.cu with decode_step.cu's ring PTX and stream_probe.cu's probe helpers (the
    timer, the watchdog wait, the evict-first policy) in place of its markers: each written once."""
    probe = SOURCE.with_name("stream_probe.cu").read_text()
    start, end = probe.index("// <probe-helpers>"), probe.index("// </probe-helpers>")
    return with_ptx_helpers(SOURCE.read_text()).replace("// @PROBE_HELPERS@\n", probe[start:end], 1)


@dataclass(frozen=True)
class PhaseSpec:
    """One phase of a layer: its weight bytes, input length, output length (floats), and the
    dependent round trips after its input."""

    name: str
    nbytes: int
    xlen: int
    out: int
    trips: int = 0
    reduce: bool = False  # every block adds a partial of all ``out`` outputs (float atomics)


def phases(a: ModelArgs, hops: int = 6, tokens: int = 1, position: int = 0,
           weight_bits: int = 16) -> tuple[list[PhaseSpec], PhaseSpec]:
    """The layer's phases in step order and the output projection, at bf16 byte counts, for a
    step of ``tokens`` tokens (1 decodes; k + 1 verifies k drafted tokens: every input and
    output ``tokens`` vectors, the weights read once) whose attention reads the K/V of
    ``position + tokens`` positions (streamed as its phase's bytes; 0: none, the weights only),
    the matrices at ``weight_bits`` a weight (16: bf16; 5: the 4-bit super-tiles' 0.625 bytes).

    ``hops`` a layer: 6 as the Triton step's kernels (qkv, attention, merge, o-projection,
    gate/up, down); 5 with the merge folded into the attention; 3 where a block's own outputs
    are the next product's K slice, so that product needs no hand-off before it: the
    attention's heads and the o-projection's columns of those heads, gate/up's rows and the
    down projection's columns of those rows, each block adding its partial of the whole output
    vector with float atomics (the split-K form; the weights read the same); 2, a bound below
    any Qwen2 layer, as 3 with q, k and v reaching the attention's blocks with no hand-off."""
    if hops not in (6, 5, 3, 2):
        raise ValueError(f"hand-offs a layer: 6, 5, 3 or 2, not {hops}")
    if tokens < 1:
        raise ValueError(f"tokens a step: at least 1, not {tokens}")
    d, f, t = a.n_embd, a.n_ff, tokens

    def w(n: int) -> int:  # bytes of n weights
        return n * weight_bits // 8

    kv = a.kv_bytes(position + t) // a.n_layer if position else 0  # one layer's K and V
    qkv = PhaseSpec("qkv", w(a.qkv_dim * d), d * t, a.qkv_dim * t)
    out = PhaseSpec("output", w(a.n_vocab * d), d * t, t)  # (the argmax of each token)
    if hops == 2:  # a bound, not a Qwen2 layer: q, k and v handed to the attention for free
        layer = [PhaseSpec("qkv+attention+o", w((a.qkv_dim + a.q_dim) * d) + kv, d * t, d * t,
                           ATT_TRIPS + MERGE_TRIPS, reduce=True),
                 PhaseSpec("gate/up+down", w(3 * f * d), d * t, d * t, reduce=True)]
        return layer, out
    if hops == 3:
        layer = [qkv, PhaseSpec("attention+o", w(a.q_dim * d) + kv, a.qkv_dim * t, d * t,
                                ATT_TRIPS + MERGE_TRIPS, reduce=True),
                 PhaseSpec("gate/up+down", w(3 * f * d), d * t, d * t, reduce=True)]
        return layer, out
    att = [PhaseSpec("attention", kv, a.qkv_dim * t, a.q_dim * t, ATT_TRIPS)]
    if hops == 6:
        att.append(PhaseSpec("merge", 0, a.q_dim * t, a.q_dim * t, MERGE_TRIPS))
    layer = [qkv, *att,
             PhaseSpec("o", w(a.q_dim * d), a.q_dim * t, d * t),
             PhaseSpec("gate/up", w(2 * f * d), d * t, f * t),
             PhaseSpec("down", w(f * d), f * t, d * t)]
    return layer, out


def weight_bytes(a: ModelArgs) -> int:
    """The bf16 bytes a one-token step reads: every layer matrix and the output matrix."""
    layer, out = phases(a)
    return a.n_layer * sum(p.nbytes for p in layer) + out.nbytes


#: The source's Q4_SUPER (16 rows x 256 k of 4-bit weights with their scales), and a ring of
#: 8 stages of 8 of them (160 KB), for the 4-bit variants.
Q4_SUPER = 2560
RING_Q4 = {"NSTAGE": 8, "STAGE_BYTES": 8 * Q4_SUPER, "COPY_BYTES": Q4_SUPER}
#: The same 160 KB as 4 stages of 16 super-tiles, for 16 consumer warps (one each a stage).
RING_Q4W = {"NSTAGE": 4, "STAGE_BYTES": 16 * Q4_SUPER, "COPY_BYTES": Q4_SUPER}

#: ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``: the value is the cluster's shape (x, y, z).
CLUSTER_DIMENSION = 4

#: A ring of 3 stages of 16 KB (48 KB), for the variants whose inputs need the room.
RING48 = {"NSTAGE": 3, "STAGE_BYTES": 16384, "COPY_BYTES": 2048}

#: The plan's output word: the outputs a block stores, or (this bit set: the kernel's
#: REDUCE_BIT) the length of the vector every block adds a partial of. One word, so the kernel
#: reads a phase's whole description in one place.
REDUCE = 1 << 31
#: The kernel's XMAX: the longest input or output vector (the 1.5B's feed-forward width).
XMAX = 8960
#: The verify step the issue's goal names (k = 8 drafted tokens), and its XMAX: the longest
#: input of a 3-hand-off layer, the 1.5B's q, k and v, for each token.
VERIFY_T = 9
XMAX_VERIFY = VERIFY_T * QWEN25_1_5B.qkv_dim
#: With 6 hand-offs a layer, the longest is the down projection's (the 1.5B's 8,960) for each
#: token: 161 KB as bf16 in shared memory, beside a ring of 3 stages of 16 KB.
XMAX_VERIFY6 = VERIFY_T * XMAX


def plan_words(a: ModelArgs, blocks: int, hops: int, weights: bool, trips: bool,
               tokens: int = 1, position: int = 0, xmax: int = XMAX,
               stage: int = STAGE, weight_bits: int = 16) -> tuple[list[int], int]:
    """The kernel's plan (see the source) and the bytes it streams. Stages are rounded up, so
    every weight byte of the model (and the K/V of ``position``) is streamed, and under a stage
    more a phase."""
    layer, out = phases(a, hops, tokens, position, weight_bits)
    words = [a.n_layer, len(layer)]
    streamed = 0
    for i, p in enumerate([*layer, out]):
        if max(p.xlen, p.out) > xmax or (p.reduce and p.out % 4):
            raise ValueError(f"{p.name}: vectors of at most {xmax} (a multiple of 4 where added)")
        stages = math.ceil(p.nbytes / stage) if weights else 0
        outs = REDUCE | p.out if p.reduce else math.ceil(p.out / blocks)
        words += [stages, p.xlen, outs, p.trips if trips else 0]
        streamed += stages * stage * (a.n_layer if i < len(layer) else 1)
    return words, streamed


def plan_tensor(words: list[int]) -> torch.Tensor:
    """The plan as the kernel reads it, u32 words; torch has no u32 tensors to build from
    Python ints, so words with the top bit set go in as the int32 of the same bits."""
    if any(not 0 <= w < 1 << 32 for w in words):
        raise ValueError("plan words are u32")
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


@dataclass(frozen=True)
class Variant:
    """One timed skeleton: the kernel's macros and the plan's shape (hand-offs a layer, weight
    bytes or none, the attention's round trips or none)."""

    name: str
    macros: tuple[tuple[str, int], ...]
    hops: int = 6
    weights: bool = True
    trips: bool = True
    bits: int = 16  # bits a weight of the matrices streamed (5: the 4-bit super-tiles' bytes)

    @property
    def tokens(self) -> int:
        return self.macros_dict().get("TOK", 1)

    def macros_dict(self) -> dict[str, int]:
        return dict(self.macros)


#: Each instrumented variant (``_st``) and its uninstrumented twin.
STALLED = {
    "stream_bare_st": "stream_bare_fma", "stream_bare_spin2_st": "stream_bare_spin2",
    "stream3_st": "stream3", "step3_st": "step3", "stream_bare_c4_st": "stream_bare_c4",
    "stream_bare_c16_st": "stream_bare_c16", "stream_bare_read_st": "stream_bare_read",
    "stream_bare_wait_st": "stream_bare", "stream_bare_lean_st": "stream_bare_lean",
    "step3_lean_st": "step3_lean", "stream3_lean_st": "stream3_lean",
    "stream3_read_st": "stream3_read", "step3_read_st": "step3_read",
}


def variants() -> list[Variant]:
    """Every variant ``--variants`` can name (the docstring says what each prices). Hand-offs
    as flags in the data cannot add split-K partials, so no 3-hand-off variant uses them."""
    def m(**kw: int) -> tuple[tuple[str, int], ...]:
        base = dict(NCW=NCW, NSTAGE=7, STAGE_BYTES=STAGE, COPY_BYTES=3072, HOPS=1, ARITH=1,
                    INLOAD=2, XMAX=XMAX)
        return tuple(sorted({**base, **kw}.items()))

    out = [
        Variant("stream_bare", m(HOPS=0, BARE=1), trips=False),
        Variant("stream_bare_fma", m(HOPS=0, BARE=1, SINK=1), trips=False),
        # the consumers idle 1, 2 or 4 µs at each of 3 phases a layer, with no traffic
        *(Variant(f"stream_bare_spin{us}", m(HOPS=0, BARE=1, SINK=1, SPIN_NS=1000 * us), hops=3,
                  trips=False) for us in (1, 2, 4)),
        # what a wait of 2 µs costs with other rings: 2 or 4 stages of 24 KB, 14 of 12 KB; and
        # the bare stream with half or twice the consumer warps (is it the consumers' pace?)
        *(Variant(f"stream_bare_spin2_{tag}", m(HOPS=0, BARE=1, SINK=1, SPIN_NS=2000, **ring),
                  hops=3, trips=False)
          for tag, ring in (("ns2", {"NSTAGE": 2}), ("ns4", {"NSTAGE": 4}),
                            ("s12", {"NSTAGE": 14, "STAGE_BYTES": 12288, "COPY_BYTES": 3072}))),
        Variant("stream_bare_ns4", m(HOPS=0, BARE=1, SINK=1, NSTAGE=4), trips=False),
        Variant("stream_bare_s12", m(HOPS=0, BARE=1, SINK=1, NSTAGE=14, STAGE_BYTES=12288),
                trips=False),
        Variant("stream_bare_c4", m(HOPS=0, BARE=1, SINK=1, NCW=4), trips=False),
        Variant("stream_bare_c16", m(HOPS=0, BARE=1, SINK=1, NCW=16), trips=False),
        Variant("stream_bare_read", m(HOPS=0, BARE=1, SINK=1, ARITH=0), trips=False),
        # the waits again with consumers that have room (the FMA consumer reads its input
        # from shared memory twice a weight word: its loop is busy ~90 % of the stream)
        *(Variant(f"stream_bare_spin{us}_{tag}", m(HOPS=0, BARE=1, SPIN_NS=1000 * us, **kw),
                  hops=3, trips=False)
          for us in (2, 4) for tag, kw in (("wait", {}), ("read", {"SINK": 1, "ARITH": 0}))),
        # the FMAs with each thread's inputs in registers (ARITH 4): products with room?
        Variant("stream_bare_lean", m(HOPS=0, BARE=1, SINK=1, ARITH=4), trips=False),
        Variant("stream_bare_spin2_lean", m(HOPS=0, BARE=1, SINK=1, ARITH=4, SPIN_NS=2000),
                hops=3, trips=False),
        Variant("stream3_lean", m(HOPS=0, ARITH=4), hops=3),
        Variant("step3_lean", m(ARITH=4), hops=3),
        Variant("stream3_read", m(HOPS=0, ARITH=0), hops=3),
        Variant("step3_read", m(ARITH=0), hops=3),
        Variant("stream", m(HOPS=0)),
        Variant("stream_noin", m(HOPS=0, INPUT=0)),
        Variant("stream_noout", m(HOPS=0, OUTPUT=0)),
        Variant("step", m()),
        Variant("step5", m(), hops=5),
        Variant("step_t0", m(), trips=False),
        Variant("step_in0", m(INLOAD=0)),
        Variant("step_ns4", m(NSTAGE=4)),
        Variant("stream3", m(HOPS=0), hops=3),
        Variant("step3", m(), hops=3),
        Variant("step3_in0", m(INLOAD=0), hops=3),
        Variant("stream2", m(HOPS=0), hops=2),
        Variant("step2", m(), hops=2),
        Variant("step_ll", m(HOPS=2)),
        Variant("stream_pf8", m(HOPS=0, PF=8)),
        Variant("step_pf8", m(PF=8)),
        Variant("chain", m(), weights=False),
        Variant("chain3", m(), hops=3, weights=False),
        Variant("chain2", m(), hops=2, weights=False),
        Variant("chain_ll", m(HOPS=2), weights=False),
    ]
    # a verify step's skeleton (``_t9``): 9 tokens through matrix instructions
    def m9(**kw: int) -> tuple[tuple[str, int], ...]:
        return m(**{"TOK": VERIFY_T, "ARITH": 2, "XMAX": XMAX_VERIFY, **kw})

    out += [
        Variant("stream_bare_t9", m9(HOPS=0, BARE=1, SINK=1), hops=3, trips=False),
        Variant("stream3_t9", m9(HOPS=0), hops=3),
        Variant("stream3_noin_t9", m9(HOPS=0, INPUT=0), hops=3),
        Variant("stream3_noout_t9", m9(HOPS=0, OUTPUT=0), hops=3),
        Variant("step3_t9", m9(), hops=3),
        Variant("chain3_t9", m9(), hops=3, weights=False),
        Variant("stream2_t9", m9(HOPS=0), hops=2),
        Variant("step2_t9", m9(), hops=2),
        # 6 hand-offs a layer, each block its rows' outputs (no split-K partials), with the
        # ring cut to 48 KB so that the down projection's 9 inputs fit; its one-token control
        Variant("stream_t9", m9(HOPS=0, XMAX=XMAX_VERIFY6, **RING48)),
        Variant("step_t9", m9(XMAX=XMAX_VERIFY6, **RING48)),
        Variant("step_r48", m(**RING48)),
        # clusters of CL blocks summing their split-K partials through distributed shared
        # memory before adding (CL times fewer atomics), beside a 4-stage ring for the room
        Variant("step3_t9_ns4", m9(NSTAGE=4), hops=3),
        Variant("stream3_t9_cl4", m9(HOPS=0, NSTAGE=4, CL=4), hops=3),
        Variant("stream3_noin_t9_cl4", m9(HOPS=0, INPUT=0, NSTAGE=4, CL=4), hops=3),
        Variant("step3_t9_cl2", m9(NSTAGE=4, CL=2), hops=3),
        Variant("step3_t9_cl4", m9(NSTAGE=4, CL=4), hops=3),
        Variant("step3_t9_cl8", m9(NSTAGE=4, CL=8), hops=3),
        Variant("step3_cl4", m(CL=4), hops=3),
        # their controls on the 120 blocks that clusters of 4 or 8 leave resident
        Variant("step3_t9_ns4_g120", m9(NSTAGE=4, GRID=120), hops=3),
        Variant("stream3_noin_t9_ns4", m9(HOPS=0, INPUT=0, NSTAGE=4), hops=3),
        Variant("stream3_noin_t9_ns4_g120", m9(HOPS=0, INPUT=0, NSTAGE=4, GRID=120), hops=3),
        Variant("step3_g120", m(GRID=120), hops=3),
        # the stream of 4-bit super-tiles, made bf16 in the consumers for the products
        Variant("stream_bare_q4", m(HOPS=0, BARE=1, SINK=1, ARITH=3, **RING_Q4), trips=False,
                bits=5),
        Variant("stream_bare_q4_t9", m9(HOPS=0, BARE=1, SINK=1, ARITH=3, **RING_Q4), hops=3,
                trips=False, bits=5),
        # the same ring and plan read without the decode or the products (their control), and
        # both with 16 consumer warps over stages of 16 super-tiles (a warp each a stage)
        Variant("stream_bare_r4", m(HOPS=0, BARE=1, SINK=1, ARITH=0, **RING_Q4), trips=False,
                bits=5),
        Variant("stream_bare_q4_w16", m(HOPS=0, BARE=1, SINK=1, ARITH=3, NCW=16, **RING_Q4W),
                trips=False, bits=5),
        Variant("stream_bare_r4_w16", m(HOPS=0, BARE=1, SINK=1, ARITH=0, NCW=16, **RING_Q4W),
                trips=False, bits=5),
    ]
    # where each block waited (``STALLS``): each instrumented variant is its twin's macros
    # and plan with STALLS set, so the two time the same kernel but for the instrument
    by = {v.name: v for v in out}
    out += [dataclasses.replace(by[twin], name=name,
                                macros=tuple(sorted({**by[twin].macros_dict(), "STALLS": 1}.items())))
            for name, twin in STALLED.items()]
    assert not any(v.hops < 5 and v.macros_dict()["HOPS"] == 2 for v in out)
    assert all(v.bits == 5 for v in out if v.macros_dict()["ARITH"] == 3)
    return out


def xs_floats(m: dict[str, int]) -> int:
    """The kernel's XS_FLOATS: the input in shared memory, as float32 for one token and as
    bf16 for more (the source's layout), in 4-byte words."""
    return m["XMAX"] if m.get("TOK", 1) == 1 else m["XMAX"] // 2


#: Shared memory a launch asks for at least: over half an SM's 227 KB, so that no two blocks
#: share an SM (the skeleton is one block an SM; a block laying out less, as the 48 KB ring's
#: 85 KB, could otherwise be placed beside another and leave an SM idle).
ONE_AN_SM = 116 * 1024


def pmax(m: dict[str, int]) -> int:
    """The kernel's PMAX: the longest vector a cluster's blocks sum in shared memory."""
    return m.get("PMAX", m.get("TOK", 1) * 1536)


def smem_bytes(m: dict[str, int]) -> int:
    """Shared memory a block lays out: the ring and its barriers, the input, one float a
    consumer warp and the producer's progress word (the source's xs(), red(), produced()),
    and in clusters the block's partial and two mbarriers (part(), cbar())."""
    ring = m["NSTAGE"] * (m["STAGE_BYTES"] + 16)
    words = xs_floats(m) + m["NCW"] + 1
    if m.get("CL", 1) == 1:
        return ring + words * 4
    return ring + -(-words // 4) * 16 + pmax(m) * 4 + 16  # part() 16-byte aligned, two cbar()


def threads(m: dict[str, int]) -> int:
    """A block's threads: the consumers, the producer, and the prefetch warp where PF > 0."""
    return (m["NCW"] + 1 + (m.get("PF", 0) > 0)) * 32


def cluster_attr(cluster: int) -> _LaunchAttr:
    """The launch attribute asking for clusters of ``cluster`` x 1 x 1 blocks: the union's
    first three u32 words (``value`` and the first 8 bytes of ``rest``)."""
    attr = _LaunchAttr(id=CLUSTER_DIMENSION, value=cluster)
    ctypes.memmove(ctypes.addressof(attr) + _LaunchAttr.rest.offset, (ctypes.c_uint * 2)(1, 1), 8)
    return attr


class Kernels:
    """Builds (NVRTC, else nvcc; cached) and launches chain_step per macro set."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.lib = _driver()
        self.fns: dict[tuple[tuple[str, int], ...], tuple[ctypes.c_void_p, int, str]] = {}

    def get(self, macros: tuple[tuple[str, int], ...]) -> tuple[ctypes.c_void_p, int, str]:
        """The kernel of ``macros``, the shared memory it lays out, and how it was built; every
        block must fit an SM alone, or the hand-offs would wait on blocks never started."""
        if macros not in self.fns:
            m = dict(macros)
            cubin, how = compile_cached(source(), m, self.arch, name="chain_probe")
            mod = ctypes.c_void_p()
            _check(self.lib, self.lib.cuModuleLoadData(ctypes.byref(mod), cubin), "loading")
            smem = max(smem_bytes(m), ONE_AN_SM)
            fn, occ = load_function(self.lib, mod, "chain_step", smem, threads(m), carveout=100)
            if occ != 1:
                raise RuntimeError(f"{occ} blocks of chain_step fit an SM with {smem} B, not 1")
            self.fns[macros] = (fn, smem, how)
        return self.fns[macros]

    def config(self, grid: int, nthreads: int, smem: int, cluster: int,
               stream: ctypes.c_void_p) -> _LaunchConfig:
        """``cuLaunchKernelEx``'s configuration with clusters of ``cluster`` blocks."""
        self._attr = cluster_attr(cluster)  # kept alive while the configuration may be read
        return _LaunchConfig(grid, 1, 1, nthreads, 1, 1, smem, stream,
                             ctypes.pointer(self._attr), 1)

    def grid(self, macros: tuple[tuple[str, int], ...], sms: int) -> int:
        """Blocks of a launch: one an SM, or in clusters as many whole clusters as the GPU
        holds at once (every block must be resident, or the hand-offs wait on blocks never
        started; a cluster lives in one GPC, so some SMs may stay idle)."""
        m = dict(macros)
        cl = m.get("CL", 1)
        if cl == 1:
            return min(sms, m.get("GRID", sms))
        fn, smem, _ = self.get(macros)
        n = ctypes.c_int()
        cfg = self.config(cl * (sms // cl), threads(m), smem, cl, ctypes.c_void_p())
        _check(self.lib, self.lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn,
                                                               ctypes.byref(cfg)),
               "reading the clusters that fit")
        if n.value < 1:
            raise RuntimeError(f"no cluster of {cl} blocks of {smem} B fits")
        return cl * min(n.value, sms // cl, m.get("GRID", sms) // cl)

    def launch(self, fn: ctypes.c_void_p, grid: int, smem: int, args: list[int],
               nthreads: int, cluster: int = 1) -> None:
        """One launch on PyTorch's stream; ``args`` are 64-bit words (the driver reads as many
        bytes of each as the parameter has, so the u32 ones take the low half)."""
        vals = [ctypes.c_uint64(x) for x in args]
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        if cluster > 1:
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            cfg = self.config(grid, nthreads, smem, cluster, stream)
            _check(self.lib, self.lib.cuLaunchKernelEx(ctypes.byref(cfg), fn, argv, None),
                   "launching")
            return
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(self.lib, self.lib.cuLaunchKernel(fn, grid, 1, 1, nthreads, 1, 1, smem,
                                                 stream, argv, None), "launching")


def hop_stats(tr: torch.Tensor, nph: int, layers: int,
              names: list[str]) -> dict[str, Any]:
    """From the trace [blocks, hops, 3] (ns; see the source): per hand-off kind, the medians
    over the middle layers of the imbalance, the latency and, of the latency, the part until
    the count was seen (µs), and the median layer (µs)."""
    t = tr.to(torch.int64)
    t = t - t[:, :, 0].min()  # int64 before any float: the timer is ns since the epoch
    arrive, ready, seen = (t[:, :, i].double() for i in range(3))
    last = arrive.max(dim=0).values
    imbalance = last - arrive.median(dim=0).values
    latency = ready.median(dim=0).values - last
    counted = seen.median(dim=0).values - last
    mid = range(1, layers - 1)
    out: dict[str, Any] = {}
    for p, name in enumerate(names):
        hs = [lay * nph + p for lay in mid]
        out[name] = {"imbalance_us": statistics.median(imbalance[hs].tolist()) / 1e3,
                     "latency_us": statistics.median(latency[hs].tolist()) / 1e3,
                     "counted_us": statistics.median(counted[hs].tolist()) / 1e3}
    ends = [last[(lay + 1) * nph - 1].item() for lay in range(layers)]
    out["layer_us"] = statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False)) / 1e3
    return out


def stall_stats(st: torch.Tensor, hops: torch.Tensor | None) -> dict[str, float]:
    """From the stalls [blocks, 4] (SM cycles, and the block's ns; see the source) and, for
    counters, the trace [blocks, hops, 3] (ns), each field's median over the blocks (so the
    fields need not add up): the time a block's ring was full (its producer waiting for a
    slot), its consumers starved (thread 0 waiting for a stage to land), in hand-offs (from its
    outputs stored to its next input in shared memory with the phase's extra round trips
    walked, summed over the step: the input load and round trips that a never-waiting stream
    pays too are inside it) and in all, µs (cycles at each block's own cycles a ns), and the SM
    clock those imply (GHz). Where the ring covers the hand-offs, the consumers starve less by
    about the hand-offs' time than the same stream never waiting does; where it does not, they
    starve as much and the hand-offs add."""
    t = st.to(torch.int64)
    ns_per_cycle = t[:, 3].double() / t[:, 2].clamp(min=1).double()
    handoff = (hops[:, :, 1] - hops[:, :, 0]).to(torch.int64).sum(dim=1) if hops is not None \
        else torch.zeros(t.shape[0], dtype=torch.int64)

    def med(x: torch.Tensor) -> float:
        return statistics.median(x.double().tolist()) / 1e3

    return {"ring_full_us": med(t[:, 0] * ns_per_cycle), "starved_us": med(t[:, 1] * ns_per_cycle),
            "handoff_us": med(handoff), "block_us": med(t[:, 3]),
            "sm_GHz": statistics.median((1 / ns_per_cycle).tolist())}


#: Batches of back-to-back launches a variant; its time is the best batch's mean, as the Triton
#: step's baseline is the best of three means of replays (``bench_gpu.time_ms``).
BATCHES = 3


def time_variant(k: Kernels, v: Variant, blocks: int, reps: int, args: list[int],
                 ctr: torch.Tensor, tag: int, nhop: int) -> tuple[list[float], int]:
    """Per batch, the mean ms of ``reps`` launches queued back to back (after one warm-up), so
    that the host's launch path overlaps the GPU's work as a graph replay's does; and the next
    unused tag. The counters are zeroed once a batch, each launch waiting on its own epoch."""
    fn, smem, _ = k.get(v.macros)
    nthreads = threads(v.macros_dict())
    cluster = v.macros_dict().get("CL", 1)
    means = []
    for _ in range(BATCHES):
        ctr.zero_()
        e0 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        e1 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        for epoch in range(1, reps + 2):
            if epoch == 2:
                e0.record()
            k.launch(fn, blocks, smem, [*args, tag, epoch], nthreads, cluster)
            tag += nhop + 1  # no element of this launch matches the next one's tags
        e1.record()
        e1.synchronize()
        means.append(e0.elapsed_time(e1) / reps)
    return means, tag


def plan_of(v: Variant, a: ModelArgs, blocks: int, position: int) -> tuple[list[int], int]:
    """``plan_words`` for variant ``v`` at ``position``: its hand-offs, tokens and XMAX."""
    m = v.macros_dict()
    if m.get("CL", 1) > 1:
        for p in phases(a, v.hops, v.tokens)[0]:
            if p.reduce and p.out > pmax(m):
                raise ValueError(f"{p.name}: {p.out} partials, over the clusters' {pmax(m)}")
    return plan_words(a, blocks, v.hops, v.weights, v.trips, v.tokens, position, m["XMAX"],
                      m["STAGE_BYTES"], v.bits)


def run_model(k: Kernels, name: str, sms: int, copy_Bps: float, reps: int,
              res: dict[str, Any], triton: bool, chosen: list[str], position: int) -> None:
    """Every chosen variant for one model, then today's Triton steps as the baseline; results
    into ``res[name]`` as they come, so a fault part-way keeps what ran."""
    a = MODELS[name]
    floor = step_floor_ms(weight_bytes(a), a, position, copy_Bps)
    res[name] = {"floor_ms": floor, "position": position, "variants": {}}
    log(f"{name}: floor {floor:.3f} ms @{position} ({weight_bytes(a) / 1e9:.3f} GB of weights, "
        f"{a.kv_bytes(position + 1) / 1e6:.1f} MB of K/V)")
    todo = [v for v in variants() if v.name in chosen]
    total = max(plan_of(v, a, sms, position)[1] for v in todo)
    buf = torch.randint(1, 255, (total,), dtype=torch.uint8, device="cuda")
    act = torch.zeros(2 * max(v.macros_dict()["XMAX"] for v in todo), dtype=torch.int64,
                      device="cuda")
    tag = 1
    for v in todo:
        r: dict[str, Any] = {}
        res[name]["variants"][v.name] = r
        try:
            blocks = k.grid(v.macros, sms)
            words, streamed = plan_of(v, a, blocks, position)
            nph = words[1]
            nhop = a.n_layer * nph + 1
            plan = plan_tensor(words).cuda()
            ctr = torch.zeros(nhop, dtype=torch.int32, device="cuda")
            trace = torch.zeros(blocks * (nhop * 3 + 4), dtype=torch.int64, device="cuda")
            args = [buf.data_ptr(), plan.data_ptr(), act.data_ptr(), ctr.data_ptr(),
                    trace.data_ptr()]
            means, tag = time_variant(k, v, blocks, reps, args, ctr, tag, nhop)
            best = min(means)
            r.update(ms=best, ms_batches=means, streamed_bytes=streamed, blocks=blocks,
                     compiler=k.get(v.macros)[2], pct_floor=100 * floor / best,
                     stream_GBps=streamed / (best * 1e-3) / 1e9 if streamed else None)
            names = [p.name for p in phases(a, v.hops, v.tokens)[0]]
            hops_tr = None  # the hand-offs' stamps, copied only where a variant waits
            if v.macros_dict()["HOPS"]:
                hops_tr = trace[: blocks * nhop * 3].view(blocks, nhop, 3)[:, : nhop - 1].cpu()
                r["trace"] = hop_stats(hops_tr, nph, a.n_layer, names)
            if v.macros_dict().get("STALLS"):  # a hand-off's span is counters' (HOPS 1) only
                r["stalls"] = stall_stats(trace[blocks * nhop * 3:].view(blocks, 4).cpu(),
                                          hops_tr if v.macros_dict()["HOPS"] == 1 else None)
            bw = f"{r['stream_GBps']:6.0f} GB/s" if streamed else " " * 11
            lay = f"layer {r['trace']['layer_us']:6.2f} µs" if "trace" in r else ""
            grid = f"  ({blocks} blocks)" if blocks != sms else ""
            log(f"  {v.name:12s} {best:8.4f} ms  {r['pct_floor']:5.1f} % of the floor  {bw}  {lay}"
                f"{grid}")
            if "stalls" in r:
                st = r["stalls"]
                log(f"    stalls (median block, µs): ring full {st['ring_full_us']:.1f}, "
                    f"consumers starved {st['starved_us']:.1f}, hand-offs "
                    f"{st['handoff_us']:.1f}, block {st['block_us']:.1f}; SM clock "
                    f"{st['sm_GHz']:.2f} GHz")
            if "trace" in r:
                log("    " + "; ".join(
                    f"{n} {s['imbalance_us']:.2f}+{s['latency_us']:.2f} "
                    f"(counted {s['counted_us']:.2f})"
                    for n, s in r["trace"].items() if n != "layer_us"))
        except Exception:  # noqa: BLE001
            r["error"] = traceback.format_exc(limit=3)
            log(f"  {v.name}: failed: {r['error'].strip().splitlines()[-1]}")
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                log("the CUDA context is lost: stopping")
                raise
    del buf
    if triton:
        from bench_gpu import time_ms
        from bench_verify import runner_for

        torch.cuda.empty_cache()
        runner, _ = runner_for(a, position + 64)
        tri: dict[int, float] = {}
        for t in sorted({1, *(v.tokens for v in todo)}):
            runner.step(list(range(100, 100 + t)), position)
            tri[t] = min(time_ms(functools.partial(runner.replay, t)) for _ in range(BATCHES))
            log(f"  triton default {t}-token step @{position}: {tri[t]:.4f} ms "
                f"({tri[t] / tri[1]:.3f}x one token, {100 * floor / tri[t]:.1f} % of the floor)")
        t1 = tri[1]
        res[name]["triton_ms"] = t1
        res[name]["triton_ms_by_tokens"] = tri
        by_name = {v.name: v for v in todo}
        for v_name, rv in res[name]["variants"].items():
            if "ms" in rv:
                t = by_name[v_name].tokens
                rv["ratio_to_triton"] = rv["ms"] / t1
                rv["ratio_to_triton_same_tokens"] = rv["ms"] / tri[t]
                log(f"    {v_name:14s} {rv['ms'] / t1:.3f}x the Triton one-token step, "
                    f"{rv['ms'] / tri[t]:.3f}x its {t}-token step")
        del runner
        torch.cuda.empty_cache()


def main() -> int:
    """Parse, refuse what cannot run (before looking for a GPU), then each model in turn."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="1.5B,0.5B")
    ap.add_argument("--reps", type=int, default=20,
                    help=f"launches a batch, back to back ({BATCHES} batches a variant)")
    ap.add_argument("--variants", default="",
                    help="comma-separated names of the variants to run (default: all)")
    ap.add_argument("--position", type=int, default=512,
                    help="the step's position: its attention streams the K/V of this many "
                         "positions and the step's own tokens (none at 0), and the floor and "
                         "the Triton steps are taken there")
    ap.add_argument("--no-triton", action="store_true",
                    help="leave out the Triton steps (the baselines)")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error(f"--reps must be at least 1, not {args.reps}")
    if not 0 <= args.position <= 32768:
        ap.error(f"--position must be 0 to 32768, not {args.position}")
    for m in args.models.split(","):
        if m not in MODELS:
            ap.error(f"unknown model {m!r}: choose from {', '.join(MODELS)}")
    names = [v.name for v in variants()]
    chosen = [v for v in args.variants.split(",") if v]
    for v in chosen:
        if v not in names:
            ap.error(f"unknown variant {v!r}: choose from {', '.join(names)}")
    if not torch.cuda.is_available():
        ap.error("no CUDA device: run this on the lent H200 (the device tool)")
    args.out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    cap = torch.cuda.get_device_capability(0)
    res: dict[str, Any] = {"device": props.name, "sms": props.multi_processor_count,
                           "date": time.strftime("%Y-%m-%d %H:%M")}
    copy_Bps = copy_bandwidth()
    res["copy_GBps"] = copy_Bps / 1e9
    log(f"{props.name}, {props.multi_processor_count} SMs; copy bandwidth {copy_Bps / 1e9:.0f} GB/s")
    torch.cuda.current_stream().synchronize()
    k = Kernels(f"sm_{cap[0]}{cap[1]}")
    path = args.out / "chain.json"
    for m in args.models.split(","):
        run_model(k, m, props.multi_processor_count, copy_Bps, args.reps, res,
                  not args.no_triton, chosen or names, args.position)
        path.write_text(json.dumps(res, indent=1, default=str))
    log("done ->", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
