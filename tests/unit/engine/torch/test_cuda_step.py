"""The persistent CUDA step's host side: its compile-time plan, its build, and its refusals.

The kernel itself needs an sm_90 GPU; it is checked against a float32 reference on the lent
H200 by scripts/bench_cuda_step.py (correctness, bit-identical replays). Here: the plan tiles
every matrix exactly once over the blocks and fits shared memory, the source and the plan agree
on the macros, the build works where nvcc is present, and a machine without a GPU gets a clear
error rather than a crash.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from openjarvis.engine.torch import cuda_step as C
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs
from openjarvis.engine.torch.generate import Runner
from openjarvis.engine.torch.model import Transformer
from openjarvis.engine.torch.weights import random_weights

PAIR = [QWEN25_1_5B, QWEN25_0_5B]


def _rows_of(a: ModelArgs, d: dict[str, int], kind: str, u: int) -> list[int]:
    """Matrix rows of unit ``u`` of ``kind``, as the kernel's ``row_of`` walks them."""
    ncw, hd = d["NCW"], d["HD"]
    nr = ncw // d.get(f"WPR_{kind}", 1)
    if kind == "QKV":  # NR NeoX pairs (i, i + hd/2) of one head
        per_head = hd // 2 // nr
        head, i0 = divmod(u, per_head)
        base = head * hd + i0 * nr
        return [base + w + j * hd // 2 for j in range(2) for w in range(nr)]
    if kind == "13":  # NR gate rows and the same up rows
        return [u * nr + w + j * a.n_ff for j in range(2) for w in range(nr)]
    rpw = d[f"RPW_{kind}"]
    return [(u * rpw + j) * nr + w for j in range(rpw) for w in range(nr)]


def _units(d: dict[str, int], kind: str, n_rows: int) -> int:
    rows = d["NCW"] // d.get(f"WPR_{kind}", 1) * d.get(f"RPW_{kind}", 2)
    assert n_rows % rows == 0, f"{kind}: {n_rows} rows do not split into units of {rows}"
    return n_rows // rows


@pytest.mark.parametrize("sms", [132, 114, 78])
@pytest.mark.parametrize("a", PAIR, ids=["1.5B", "0.5B"])
def test_every_row_of_every_matrix_is_computed_exactly_once(a: ModelArgs, sms: int) -> None:
    p = C.plan(a, sms=sms)
    d = p.defines
    for kind, n_rows, k in (("QKV", a.qkv_dim, a.n_embd), ("WO", a.n_embd, a.q_dim),
                            ("13", 2 * a.n_ff, a.n_embd), ("2", a.n_embd, a.n_ff),
                            ("OUT", a.n_vocab, a.n_embd)):
        n_units = _units(d, kind, n_rows)
        seen = torch.zeros(n_rows, dtype=torch.int32)
        for layer in (0, 5):
            seen.zero_()
            for b in range(sms):  # my_units: contiguous ranges, block order rotated by layer
                r = (b + layer * 37) % sms
                for u in range(n_units * r // sms, n_units * (r + 1) // sms):
                    seen[_rows_of(a, d, kind, u)] += 1
            assert bool((seen == 1).all()), f"{kind}: rows computed {seen.unique().tolist()} times"
        rows_per_unit = n_rows // n_units
        unit_bytes = rows_per_unit * (k // d[f"NKC_{kind}"]) * 2
        assert unit_bytes <= d["STAGE_BYTES"], f"{kind}: a stage of {unit_bytes} B overflows"
        assert (k // d[f"NKC_{kind}"]) % 8 == 0  # bulk copies move 16-byte multiples
    assert p.smem <= C.SMEM_LIMIT
    assert d["NSTAGE"] >= 4  # a ring this shallow could not run ahead through a barrier


def test_the_plan_defines_every_macro_the_source_uses() -> None:
    src = C.SOURCE.read_text()
    used = set(re.findall(r"\b((?:NKC|RPW|WPR)_[A-Z0-9]+)\b", src))
    defined_in_source = set(re.findall(r"#define\s+(\w+)", src))
    for a in PAIR:
        d = C.plan(a).defines
        missing = used - set(d) - defined_in_source
        assert not missing, f"the plan does not define {sorted(missing)}"


def test_overrides_are_checked_like_the_defaults() -> None:
    with pytest.raises(C.CudaStepError, match="ATILE=48 must split 256 threads"):
        C.plan(QWEN25_1_5B, extra={"ATILE": 48})
    with pytest.raises(C.CudaStepError, match="40 stages need .* bytes of shared memory"):
        C.plan(QWEN25_1_5B, extra={"NSTAGE": 40})
    with pytest.raises(C.CudaStepError, match="this GPU gives a block 100000"):
        C.plan(QWEN25_1_5B, smem_limit=100_000, nstage=7)
    assert C.plan(QWEN25_1_5B, smem_limit=100_000).defines["NSTAGE"] < 7  # a shallower ring fits
    with pytest.raises(C.CudaStepError, match="INFLIGHT=7 must be below NSTAGE=7"):
        C.plan(QWEN25_1_5B, extra={"INFLIGHT": 7})
    with pytest.raises(C.CudaStepError, match="WPR_QKV=16 does not split 8 warps or a head's pairs"):
        C.plan(QWEN25_1_5B, extra={"WPR_QKV": 16})
    assert C.plan(QWEN25_1_5B, nstage=2).defines["INFLIGHT"] == 1  # capped below the ring


def test_shared_memory_grows_with_what_the_macros_ask_for() -> None:
    base = C.plan(QWEN25_1_5B)
    # 4 rows a warp where warps share rows: the cross-warp sums need twice the room
    wide = C.plan(QWEN25_1_5B, extra={"RPW_WO": 4, "NKC_WO": 2})
    assert wide.defines["WPR_WO"] == 2
    assert C._misc_floats(wide.defines) == 64 + 2 * 8 * 4 * 4
    assert wide.smem - base.smem == (C._misc_floats(wide.defines) - C._misc_floats(base.defines)) * 4
    ub8 = C.plan(QWEN25_1_5B, extra={"UB": 8})  # more units a batch: a bigger misc(), still fits
    assert ub8.smem > base.smem
    with pytest.raises(C.CudaStepError, match="UB=40 must be 1-32"):
        C.plan(QWEN25_1_5B, extra={"UB": 40})
    # a shallower ring set by hand: INFLIGHT follows it unless set by hand too
    assert C.plan(QWEN25_1_5B, extra={"NSTAGE": 2}).defines["INFLIGHT"] == 1
    with pytest.raises(C.CudaStepError, match="INFLIGHT=2 must be below NSTAGE=2"):
        C.plan(QWEN25_1_5B, extra={"NSTAGE": 2, "INFLIGHT": 2})


def test_pair_kinds_copy_whole_rows_where_one_warp_a_pair_cannot() -> None:
    # 1.5B: 8 pairs of 3 KB rows overflow a stage, so 2 warps share a pair and a stage holds
    # whole rows (12 KB contiguous copies, not 1.5 KB row halves); 0.5B rows fit either way
    d = C.plan(QWEN25_1_5B).defines
    assert (d["WPR_QKV"], d["NKC_QKV"], d["WPR_13"], d["NKC_13"]) == (2, 1, 2, 1)
    d = C.plan(QWEN25_0_5B).defines
    assert (d["WPR_QKV"], d["NKC_QKV"], d["WPR_13"], d["NKC_13"]) == (1, 1, 1, 1)


def test_the_host_trace_buffer_matches_the_kernel_trace_points() -> None:
    # a TRACE build writes [layer + head][NTP][block]: the host allocates TRACE_POINTS a layer
    ntp = re.search(r"#define NTP (\d+)", C.SOURCE.read_text())
    assert ntp is not None and int(ntp.group(1)) == C.TRACE_POINTS


def test_the_host_params_match_the_kernel_struct_field_for_field() -> None:
    body = re.search(r"struct Params \{(.*?)\};", C.SOURCE.read_text(), re.S)
    assert body is not None
    fields = re.findall(r"^\s*(u64|long long|float)\s+(\w+);", body.group(1), re.M)
    ctypes_of = {"u64": "c_ulong", "long long": "c_long", "float": "c_float"}
    host = [(name, t.__name__) for name, t in C._Params._fields_]
    assert host == [(name, ctypes_of[t]) for t, name in fields]
    assert C.ctypes.sizeof(C._Params) == 8 * (len(fields) - 2) + 8  # two floats share 8 bytes


def test_an_unsupported_shape_is_refused_with_the_reason() -> None:
    tiny = ModelArgs("qwen2", n_layer=2, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, n_vocab=97)
    with pytest.raises(C.CudaStepError, match="unsupported shape"):
        C.plan(tiny)  # head_dim 16: the value sum gives each lane HD/32 dims


def test_a_stage_too_small_for_a_row_chunk_is_refused() -> None:
    with pytest.raises(C.CudaStepError, match="fits a 64-byte stage"):
        C.plan(QWEN25_0_5B, stage_cap=64)


def test_without_a_gpu_the_runner_refuses_the_cuda_step_clearly() -> None:
    a = ModelArgs("qwen2", n_layer=1, n_embd=128, n_ff=128, n_head=2, n_head_kv=1, n_vocab=64)
    model = Transformer(a, random_weights(a, torch.float32, "cpu", seed=0), n_pos=64)
    runner = Runner(model, 32, kernels="torch", graphs=False)
    with pytest.raises(C.CudaStepError, match="needs a CUDA device"):
        runner.use_cuda_step()
    assert runner.cuda_step is None
    out = runner.logits([1, 2, 3], 0)  # the runner still works as before
    assert out.shape == (3, 64) and bool(torch.isfinite(out).all())
    if not torch.cuda.is_available():
        assert C.available() is False


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@needs_nvcc
def test_nvcc_builds_the_kernel_for_the_real_pair_and_caches_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for a in PAIR:
        p = C.plan(a)
        cubin, how = C.build(p, "sm_90", "nvcc")
        assert cubin[:4] == b"\x7fELF" and how == "nvcc"
        again, how2 = C.build(p, "sm_90", "nvcc")
        assert again == cubin and how2 == "nvcc (cached)"
    assert len(list((tmp_path / "openjarvis" / "cuda").glob("*.cubin"))) == 2
    # another macro or another target is another binary, never the cached one
    other = C.Plan(C.plan(QWEN25_0_5B).defines | {"SPLITS": 16}, 0)
    assert C.build(other, "sm_90", "nvcc")[1] == "nvcc"
    assert C.build(C.plan(QWEN25_0_5B), "sm_100", "nvcc")[1] == "nvcc"
    assert len(list((tmp_path / "openjarvis" / "cuda").glob("*.cubin"))) == 4


@needs_nvcc
def test_a_compile_error_names_the_compiler_and_keeps_no_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bad = C.Plan({"DM": 64}, 0)  # most macros missing: the source cannot compile
    with pytest.raises(C.CudaStepError, match="nvcc could not compile the CUDA step"):
        C.build(bad, "sm_90", "nvcc")
    assert not list(tmp_path.rglob("*.cubin"))
