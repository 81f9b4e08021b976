"""The memory order of the serial norm hand-off, read from the PTX Triton emits for Hopper.

A race between the splits of a column block does not show in the interpreter (it runs programs
one at a time), and on the GPU it shows rarely or never: 3,000 launches on the H200 with the
explicit barrier removed gave no wrong result (session 9's review), because Triton happens to
place a barrier of its own there. So the order is checked where it is decided, in the compiled
code: every thread's partial sums (relaxed atomics), a block barrier, one acq_rel count at gpu
scope, a barrier (Triton's broadcast of the count to the block), then the read-back past L1
(``ld.global.cg``). The compile runs without a GPU, in a subprocess without
``TRITON_INTERPRET`` (the interpreter tests set it for this whole process).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Not imported here: Triton reads TRITON_INTERPRET when first imported, and the interpreter
# tests of this package set it at their import, which may come after this module's.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[4]

_COMPILE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from openjarvis.engine.torch import kernels as K

sig = {"x_ptr": "*fp32", "w_ptr": "*bf16", "g_ptr": "*bf16", "b_ptr": "*bf16",
       "out_ptr": "*fp32", "T": "i32", "N": "i32", "K": "i32", "stride_x": "i32",
       "stride_out": "i32", "eps": "fp32", "g2_ptr": "*bf16", "xg_ptr": "*bf16",
       "ssp_ptr": "*fp32", "stride_xg": "i32", "NP": "i32", "cnt_ptr": "*i32",
       "tr_ptr": "*i64", "tr_base": "i32"}
out = {}
for name, fn in (("unswapped", K._linear_kernel), ("swapped", K._linear_swap_kernel)):
    const = dict(MODE=1, NORM=0, BIAS=False, BLOCK_T=16, BLOCK_N=32, BLOCK_K=128, SPLIT_K=4,
                 PDL=5, EVICT="evict_first", HAND=1, NP_BLOCK=64, SEM="relaxed", TRACE=0,
                 SMEM_FLOOR=0,
                 **({"ROWS": 0, "PREFETCH": 0, "SEG": 1, "LANES": 0}
                    if name == "unswapped" else {}))
    src = ASTSource(fn, {**sig, **{k: "constexpr" for k in const}}, constexprs=const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4, "num_stages": 3}).asm["ptx"]
    out[name] = [line.strip() for line in ptx.splitlines()
                 if re.search(r"\b(atom|red)\.global|\bbar\.sync|\bld\.global\.cg", line)]
# the trace stamps of the one-token kernel (scripts/trace_step.py): entry, past the wait,
# past the main loop (before the late trigger), done
# ("traced_aw": the same with the trigger right after the wait, kernels.PDL_AFTER_WAIT)
for key, pdl in (("traced", 6), ("traced_aw", 10)):
    const = dict(MODE=1, NORM=0, BIAS=False, BLOCK_T=1, BLOCK_N=2, BLOCK_K=2048, SPLIT_K=1,
                 PDL=pdl, EVICT="evict_first", HAND=0, NP_BLOCK=1, SEM="relaxed", TRACE=1024,
                 ROWS=0, PREFETCH=0, SEG=1, SMEM_FLOOR=0, LANES=0)
    src = ASTSource(K._linear_kernel, {**sig, **{k: "constexpr" for k in const}},
                    constexprs=const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 8, "num_stages": 2}).asm["ptx"]
    out[key] = [line.strip() for line in ptx.splitlines()
                if re.search(r"globaltimer|griddepcontrol|st\.global", line)]
# a one-token down projection's loop (a row a warp): default, in the row layout, prefetching;
# and 2 rows x 1024 read as 4 segments of 256 a row ("s": rows wider than a warp's); "p": with
# the weight prologue (PDL mode 6), in the row layout with and without prefetch
# ("c": the weights loaded past L1, ".cg", with a shared-memory floor: Runner.weight_evict and
# Runner.smem_floor, session 20)
for rows, pf, bn, bk, seg, pdl, ev in ((0, 0, 4, 256, 1, 5, ""), (1, 0, 4, 256, 1, 5, ""),
                                       (1, 1, 4, 256, 1, 5, ""), (1, 1, 2, 1024, 4, 5, ""),
                                       (1, 0, 4, 256, 1, 6, ""), (1, 1, 4, 256, 1, 6, ""),
                                       (1, 1, 4, 256, 1, 5, ".cg")):
    const = dict(MODE=1, NORM=0, BIAS=False, BLOCK_T=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=2,
                 PDL=pdl, EVICT=ev or "evict_first", HAND=0, NP_BLOCK=1, SEM="relaxed",
                 TRACE=0, ROWS=rows, PREFETCH=pf, SEG=seg, SMEM_FLOOR=20224 if ev else 0,
                 LANES=0)
    # what the JIT's specialization gives a launch of real shapes: 16-aligned pointers and sizes
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(sig)
               if a.endswith("ptr") or a in ("N", "K", "stride_x", "stride_out")}
    src = ASTSource(K._linear_kernel, {**sig, **{k: "constexpr" for k in const}},
                    constexprs=const, attrs=aligned)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4, "num_stages": 2}).asm["ptx"]
    out[f"loop{rows}{pf}" + ("s" if seg > 1 else "") + ("p" if pdl == 6 else "")
        + ("c" if ev else "")] = [
        line.strip() for line in ptx.splitlines()
        if re.search(r"ld\.global|bar\.sync|griddepcontrol\.wait|Loop Header|\bbra\b", line)]
# the 1.5B's one-token gate/up (8 x 256 in the row layout, on the norm hand-off), its sums
# across a warp's lanes every tile (the default) or a lane at a time (LinearConfig.lanes)
for lanes in (0, 1):
    const = dict(MODE=2, NORM=0, BIAS=False, BLOCK_T=1, BLOCK_N=8, BLOCK_K=256, SPLIT_K=1,
                 PDL=1, EVICT="evict_first", HAND=2, NP_BLOCK=128, SEM="relaxed", TRACE=0,
                 ROWS=1, PREFETCH=0, SEG=1, SMEM_FLOOR=0, LANES=lanes)
    src = ASTSource(K._linear_kernel, {**sig, **{k: "constexpr" for k in const}},
                    constexprs=const, attrs=aligned)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4, "num_stages": 2}).asm["ptx"]
    out[f"lanes{lanes}"] = [
        line.strip() for line in ptx.splitlines()
        if re.search(r"ld\.global|shfl\.sync|bar\.sync|Loop Header|%\.lr\.ph|\bbra\b", line)]
# the L2 prefetch of Runner.l2_prefetch: 4 lines a thread (PER), asked for and nothing else
const = dict(LINE=64, BLOCK=128, PER=4)
src = ASTSource(K._l2_prefetch_kernel, {"w_ptr": "*bf16", "off0": "i64", "off1": "i64",
                                        "n_lines": "i32", **{k: "constexpr" for k in const}},
                constexprs=const)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
out["l2_prefetch"] = [line.strip() for line in ptx.splitlines()
                      if re.search(r"^\s*(@%p\d+ )?(prefetch|ld\.global|st\.global|atom)",
                                   line)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ops() -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines()[-1:] or ["?"])[0][:300]
        # a Triton without its CUDA backend or ptxas cannot compile here; anything else (a
        # CompilationError, a constexpr the harness lacks) is our kernels' or this test's fault
        if re.search(r"No module named|ptxas|backend", err, re.IGNORECASE):
            pytest.skip(f"Triton cannot compile for sm_90 here: {err}")
        pytest.fail(f"compiling the kernels for sm_90 failed: {err}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kernel", ["unswapped", "swapped"])
def test_a_split_k_hand_off_orders_every_partial_before_the_read_back(
        ops: dict[str, list[str]], kernel: str) -> None:
    seq = ops[kernel]
    count = [i for i, op in enumerate(seq) if "atom.global.gpu.acq_rel.add.u32" in op]
    assert len(count) == 1, seq  # one count a program, and at gpu scope with acq_rel
    partials = [i for i, op in enumerate(seq) if ".relaxed.add.f32" in op]
    reads = [i for i, op in enumerate(seq) if "ld.global.cg" in op]
    assert partials and reads, seq
    c = count[0]
    assert max(partials) < c < min(reads), seq
    assert any("bar.sync" in op for op in seq[max(partials) + 1 : c]), seq
    assert any("bar.sync" in op for op in seq[c + 1 : min(reads)]), seq
    # the count is one thread's: predicated, not one atomic per thread
    assert seq[c].startswith("@"), seq[c]


def _stamps_wait_trigger(seq: list[str]) -> tuple[list[int], int, int]:
    """Where a traced kernel's four stamps, its one PDL wait and its one trigger sit."""
    stamps = [i for i, op in enumerate(seq) if "globaltimer" in op]
    wait = [i for i, op in enumerate(seq) if "griddepcontrol.wait" in op]
    trig = [i for i, op in enumerate(seq) if "launch_dependents" in op]
    assert len(stamps) == 4 and len(wait) == 1 and len(trig) == 1, seq
    return stamps, wait[0], trig[0]


def test_the_trace_stamps_bracket_the_pdl_wait_and_the_late_trigger(
        ops: dict[str, list[str]]) -> None:
    """A one-token kernel traced (``kernels._stamp``): its entry stamp before the PDL wait, the
    second after it, the third before the late trigger, the fourth after the last store."""
    stamps, wait, late = _stamps_wait_trigger(ops["traced"])
    assert stamps[0] < wait < stamps[1] < stamps[2] < late < stamps[3], ops["traced"]


def test_after_the_wait_the_trigger_follows_the_wait_and_precedes_the_loop(
        ops: dict[str, list[str]]) -> None:
    """``kernels.PDL_AFTER_WAIT`` (mode 10: the weight prologue, then the trigger right after
    the wait): one trigger, after the wait and before the stamp past the wait, so the next
    kernel launches as this one's main loop starts; none after the loop."""
    stamps, wait, trig = _stamps_wait_trigger(ops["traced_aw"])
    assert stamps[0] < wait < trig < stamps[1] < stamps[2] < stamps[3], ops["traced_aw"]


@pytest.mark.parametrize("variant", ["00", "10", "11", "11s", "10p", "11p"])
def test_the_row_layout_loop_has_no_barrier_and_a_prefetch_asks_a_tile_ahead(
        ops: dict[str, list[str]], variant: str) -> None:
    """``LinearConfig.rows`` with a row a warp: the K loop of the one-token product has no
    block barrier (the default loop's x and sums go through shared memory behind one every
    tile: the check that tells them apart). ``prefetch``: the first tile's weights are asked
    for after the wait and before the loop, and each tile's again in the loop before its
    reduction: two tiles in flight. Without it, no weights are loaded before the loop. With
    ``segments`` (2 rows x 1024 as 8 rows of 256), rows wider than a warp's too. With the
    weight prologue (PDL mode 6) the first tile is asked for before the wait instead, with
    or without prefetch, and nothing between the wait and the loop."""
    seq = ops[f"loop{variant}"]
    rows, prefetch = variant != "00", variant.startswith("11")
    wait = [i for i, op in enumerate(seq) if "griddepcontrol.wait" in op]
    head = [i for i, op in enumerate(seq) if "Loop Header" in op]
    assert len(wait) == 1 and len(head) == 1, seq
    back = next(i for i, op in enumerate(seq) if i > head[0] and "bra" in op)
    weights = [i for i, op in enumerate(seq) if "ld.global" in op and "evict_first" in op]
    loop_bars = [i for i in range(head[0], back) if "bar.sync" in seq[i]]
    assert bool(loop_bars) != rows, seq
    early = [i for i in weights if i < wait[0]]
    before = [i for i in weights if wait[0] < i < head[0]]
    # one 16-byte weight vector a thread (4 rows x 256 over 128 threads) each time; two
    # where segmented (2 x 1024)
    n = 2 if variant == "11s" else 1
    if variant.endswith("p"):
        assert len(early) == n and not before, seq
    else:
        assert not early and len(before) == (n if prefetch else 0), seq
    assert len([i for i in weights if head[0] < i < back]) == n, seq


def test_the_weights_past_l1_are_cg_loads_and_the_loop_is_otherwise_the_same(
        ops: dict[str, list[str]]) -> None:
    """``Runner.weight_evict = ".cg"`` (session 20) turns the weight loads into ``ld.global.cg``
    (no L1 line, no L2 hint) and leaves the loop's shape alone; the kernel compiles with a
    shared-memory floor's constexpr (``SMEM_FLOOR``, not read in the body)."""
    hinted, past_l1 = ops["loop11"], ops["loop11c"]
    assert any("L1::evict_first" in op for op in hinted)
    assert any("ld.global.cg" in op for op in past_l1)
    assert not any("evict_first" in op for op in past_l1), past_l1
    shape = [re.sub(r"ld\.global\S*", "ld", op.split()[0]) for op in hinted]
    assert [re.sub(r"ld\.global\S*", "ld", op.split()[0]) for op in past_l1] == shape


def test_the_l2_prefetch_asks_for_each_line_and_loads_nothing(ops: dict[str, list[str]]) -> None:
    """``kernels.l2_prefetch``: one ``prefetch.global.L2`` a line a thread (the inline assembly
    is not pure, so the compiler keeps every one though nothing reads its result), and no load
    or store that would make the program wait for the lines."""
    seq = ops["l2_prefetch"]
    assert len(seq) == 4 and all(op.startswith("prefetch.global.L2 [") for op in seq), seq


def test_lanes_take_the_shuffles_out_of_the_loop(ops: dict[str, list[str]]) -> None:
    """``LinearConfig.lanes`` (the 1.5B's one-token gate/up tile): the default loop sums each
    tile across the warp's lanes (shuffles every tile, 20 for 8 rows of gate and up on 4
    warps); with lanes the loop keeps a partial a lane and has no shuffle and no barrier, the
    lanes summed once after it, and it loads the same weights and x."""
    loops = {}
    for lanes in (0, 1):
        seq = ops[f"lanes{lanes}"]
        head = next(i for i, op in enumerate(seq) if "Loop Header" in op or "%.lr.ph" in op)
        back = next(i for i, op in enumerate(seq) if i > head and "bra" in op)
        body = seq[head:back]
        loops[lanes] = body
        after = seq[back:]
        if lanes:
            assert not [op for op in body if "shfl" in op or "bar.sync" in op], body
            assert any("shfl" in op for op in after), after
        else:
            assert [op for op in body if "shfl" in op], body
    def loads(body: list[str]) -> list[str]:
        return [op for op in body if "ld.global" in op]
    assert len(loads(loops[1])) == len(loads(loops[0])) > 0
