"""The GPU benchmark scripts' variant plumbing, checked on the CPU before device time is spent.

A device run is 30 minutes a session; a typo in a variant's name or settings that only shows
there costs a run. These check what the scripts resolve a variant to, not what it measures.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest
import torch


@pytest.fixture
def bench_verify() -> ModuleType:
    # Imported when a test runs, not at collection: the scripts import the Triton kernels, and
    # Triton reads TRITON_INTERPRET when it first sees them, which test_torch_kernels.py sets
    # as it is collected (after this file); imported first, every interpreter test lost it.
    import bench_verify

    return bench_verify


@pytest.fixture
def bench_hold() -> ModuleType:
    import bench_hold  # (see bench_verify above)

    return bench_hold


@pytest.fixture
def trace_step() -> ModuleType:
    import trace_step  # (see bench_verify above)

    return trace_step


def test_every_verify_set_can_be_named_on_the_command_line(bench_verify: ModuleType) -> None:
    # ``--set`` offers T1_SETS' names: a verify set missing there could never be run.
    assert set(bench_verify.VERIFY_SETS) <= set(bench_verify.T1_SETS)


def test_a_traced_variant_is_bench_verifys_variant_on_todays_launches(trace_step: ModuleType) -> None:
    from openjarvis.engine.torch import kernels as K
    from openjarvis.engine.torch.tuning import VERIFY_PDL

    assert trace_step.variant_settings("default") == {}
    got = trace_step.variant_settings("trace18:w13e_w2late")
    for width, n_ff in VERIFY_PDL:
        pdl = got["by_width"][str(width)]["verify_pdl"]
        assert pdl == {**VERIFY_PDL[(width, n_ff)], "w13": 1, "w2": 1 + K.PDL_LATE}
    # a set's one-token variants are found as well
    assert trace_step.variant_settings("final17:t1_session16") == {
        "by_width": {"1536": {"combine_cols": {"1": 4}}}}


def test_the_timer_step_is_read_from_the_stamps_in_integers(trace_step: ModuleType) -> None:
    # Stamps near the epoch's 1.8e18 ns: 32 ns apart must read 32, not float64's 256.
    import torch

    base = 1_800_000_000_000_000_000
    stamps = torch.tensor([base, base + 32, base + 96, base + 96, base + 160], dtype=torch.int64)
    assert trace_step.timer_tick(stamps - base) == 32
    assert trace_step.timer_tick(stamps) == 32
    assert trace_step.timer_tick(torch.tensor([base], dtype=torch.int64)) == 0


@pytest.mark.parametrize(("spec", "message"), [
    ("trace18:nope", "set trace18 has no variant 'nope'; it has ['w13aw', 'w13e', 'w13e_w2late']"),
    ("nope:w13e", "SET:NAME with SET one of bench_verify.py's sets, not 'nope:w13e'"),
    ("w13e", "not 'w13e'"),
])
def test_a_variant_that_is_not_there_is_refused_before_anything_runs(
    trace_step: ModuleType, spec: str, message: str
) -> None:
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        trace_step.variant_settings(spec)


def test_a_mistyped_setting_is_refused_rather_than_timing_the_default(bench_verify: ModuleType) -> None:
    with pytest.raises(SystemExit, match=r"unknown variant settings \['verify_pld'\]"):
        runner = SimpleNamespace(args=SimpleNamespace(n_embd=1536))
        bench_verify.configure(runner, {"verify_pld": {}}, {})


def test_hold_variants_always_start_from_the_baseline_and_refuse_typos(
    bench_hold: ModuleType,
) -> None:
    got = bench_hold.parse_variants("l2, 16:12,off,8:0")
    assert [v.name for v in got] == ["off", "l2_default", "hold_16MB_12us", "hold_8MB_0us"]
    with pytest.raises(SystemExit, match="variant '16': use off, l2 or MIB:US"):
        bench_hold.parse_variants("16")
    with pytest.raises(SystemExit, match=r"variant '300:1': MiB in \(0, 64\]"):
        bench_hold.parse_variants("300:1")
    held = bench_hold.parse_variants("held,held:4:2:0")[1:]
    assert [(v.name, v.spread_us, v.timemode, v.sleep_ns) for v in held] == [
        ("held", 0.0, 0, 32), ("held_over4us_time2_sleep0", 4.0, 2, 0)]
    for bad in ("held:4:3", "held:4:1.5", "held:x", "held:4:0:0:1"):
        with pytest.raises(SystemExit, match=f"variant '{bad}': use held or held:SPREAD"):
            bench_hold.parse_variants(bad)


def test_the_hold_kernel_uses_the_cuda_steps_own_copy_code(bench_hold: ModuleType) -> None:
    src = bench_hold.hold_source()
    assert "@PTX_HELPERS@" not in src
    # the bulk copy and the mbarrier wait come from decode_step.cu, defined once
    assert src.count("void bulk_load(") == 1 and src.count("bool mbar_try_wait(") == 1
    assert 'extern "C" __global__ void __launch_bounds__(32) hold_kernel(' in src


@pytest.fixture
def bench_chain() -> ModuleType:
    import bench_chain  # (see bench_verify above)

    return bench_chain


@pytest.mark.parametrize("name", ["1.5B", "0.5B"])
def test_the_step_skeleton_streams_the_models_own_bytes(bench_chain: ModuleType, name: str) -> None:
    # bench_chain.py's "% of the floor" compares its stream with the decode benchmarks' floor,
    # so its phases must read the bf16 matrices a one-token step reads, no more than a stage's
    # rounding a phase over, and dealt so that every byte is read once.
    a = bench_chain.MODELS[name]
    bias_and_norms = a.n_layer * (a.qkv_dim + 2 * a.n_embd) + a.n_embd
    assert bench_chain.weight_bytes(a) == 2 * (a.n_params - bias_and_norms)
    words, streamed = bench_chain.plan_words(a, 132, hops=6, weights=True, trips=True)
    layers, nph = words[:2]
    assert (layers, nph) == (a.n_layer, 6)
    phases = [words[2 + 4 * p: 6 + 4 * p] for p in range(nph + 1)]
    stages = [p[0] for p in phases]
    assert stages[1] == stages[2] == 0  # the attention and its merge read no weights
    assert streamed == bench_chain.STAGE * (layers * sum(stages[:nph]) + stages[nph])
    over = streamed - bench_chain.weight_bytes(a)
    assert 0 <= over < bench_chain.STAGE * (layers * 4 + 1)
    # each phase's input is the length of what the phase before it wrote
    assert [p[1] for p in phases] == [a.n_embd, a.qkv_dim, a.q_dim, a.q_dim, a.n_embd, a.n_ff,
                                      a.n_embd]
    assert [p[3] for p in phases] == [0, bench_chain.ATT_TRIPS, bench_chain.MERGE_TRIPS, 0, 0, 0, 0]
    five, _ = bench_chain.plan_words(a, 132, hops=5, weights=True, trips=False)
    assert five[1] == 5 and all(five[5 + 4 * p] == 0 for p in range(6))
    none, nothing = bench_chain.plan_words(a, 132, hops=6, weights=False, trips=True)
    assert nothing == 0 and all(none[2 + 4 * p] == 0 for p in range(7))
    # three hand-offs: the same bytes, the last two products adding into the whole vector
    three, streamed3 = bench_chain.plan_words(a, 132, hops=3, weights=True, trips=True)
    assert three[1] == 3 and abs(streamed3 - streamed) <= 4 * a.n_layer * bench_chain.STAGE
    assert [three[4 + 4 * p] for p in range(4)] == [
        words[4], bench_chain.REDUCE | a.n_embd, bench_chain.REDUCE | a.n_embd, 1]
    assert [three[3 + 4 * p] for p in range(4)] == [a.n_embd, a.qkv_dim, a.n_embd, a.n_embd]
    assert [three[5 + 4 * p] for p in range(4)] == [
        0, bench_chain.ATT_TRIPS + bench_chain.MERGE_TRIPS, 0, 0]
    # two: the bound, the same bytes again, q, k and v with the o-projection in one phase
    two, streamed2 = bench_chain.plan_words(a, 132, hops=2, weights=True, trips=True)
    assert two[1] == 2 and abs(streamed2 - streamed) <= 4 * a.n_layer * bench_chain.STAGE
    assert [two[3 + 4 * p] for p in range(3)] == [a.n_embd, a.n_embd, a.n_embd]
    assert [two[4 + 4 * p] for p in range(3)] == [
        bench_chain.REDUCE | a.n_embd, bench_chain.REDUCE | a.n_embd, 1]
    with pytest.raises(ValueError, match="6, 5, 3 or 2, not 4"):
        bench_chain.phases(a, 4)


@pytest.mark.parametrize("name", ["1.5B", "0.5B"])
def test_the_verify_skeleton_carries_nine_tokens_and_the_caches_bytes(
    bench_chain: ModuleType, name: str,
) -> None:
    # A verify step (k = 8) reads the weights once for 9 tokens: every input and output is 9
    # vectors, and at position 4096 the attention streams the K/V of 4105 positions.
    a, t, pos = bench_chain.MODELS[name], bench_chain.VERIFY_T, 4096
    assert t == 9
    one, _ = bench_chain.plan_words(a, 132, hops=3, weights=True, trips=True)
    words, streamed = bench_chain.plan_words(a, 132, hops=3, weights=True, trips=True, tokens=t,
                                             position=pos, xmax=bench_chain.XMAX_VERIFY)
    d = a.n_embd
    assert [words[3 + 4 * p] for p in range(4)] == [d * t, a.qkv_dim * t, d * t, d * t]
    assert [words[4 + 4 * p] for p in range(4)] == [
        -(-a.qkv_dim * t // 132), bench_chain.REDUCE | d * t, bench_chain.REDUCE | d * t, 1]
    kv = a.kv_bytes(pos + t)
    assert 0 <= streamed - (bench_chain.weight_bytes(a) + kv) < bench_chain.STAGE * (3 * a.n_layer + 1)
    # the same weight stages as one token's, the attention's phase longer by its K/V
    assert words[2] == one[2] and words[10] == one[10] and words[14] == one[14]
    assert words[6] - one[6] in (kv // a.n_layer // bench_chain.STAGE,
                                 kv // a.n_layer // bench_chain.STAGE + 1)
    # a plan too long for the kernel's vectors is refused, not overrun
    with pytest.raises(ValueError, match="vectors of at most 8960"):
        bench_chain.plan_words(a, 132, hops=3, weights=True, trips=True, tokens=t)
    with pytest.raises(ValueError, match="tokens a step: at least 1, not 0"):
        bench_chain.phases(a, 6, tokens=0)
    # six hand-offs: the down projection's input is the feed-forward's width for each token
    six, _ = bench_chain.plan_words(a, 132, hops=6, weights=True, trips=True, tokens=t,
                                    xmax=bench_chain.XMAX_VERIFY6, stage=16384)
    assert [six[3 + 4 * p] for p in range(7)] == [
        d * t, a.qkv_dim * t, a.q_dim * t, a.q_dim * t, d * t, a.n_ff * t, d * t]
    # the 4-bit super-tiles stream 5/16 of the matrices' bf16 bytes, and the K/V as it is
    q4, streamed_q4 = bench_chain.plan_words(a, 132, hops=3, weights=True, trips=False, tokens=t,
                                             position=pos, xmax=bench_chain.XMAX_VERIFY,
                                             stage=8 * bench_chain.Q4_SUPER, weight_bits=5)
    want = bench_chain.weight_bytes(a) * 5 // 16 + kv
    assert 0 <= streamed_q4 - want < 8 * bench_chain.Q4_SUPER * (3 * a.n_layer + 1)
    variants = {v.name: v for v in bench_chain.variants()}
    q4v = variants["stream_bare_q4_t9"].macros_dict()
    assert q4v["ARITH"] == 3 and q4v["STAGE_BYTES"] % bench_chain.Q4_SUPER == 0
    assert f"#define Q4_SUPER {bench_chain.Q4_SUPER}" in bench_chain.source()
    assert bench_chain.plan_of(variants["stream_bare_q4_t9"], a, 132, pos)[1] == streamed_q4
    # every bare form that prices arithmetic keeps its sums live (ptxas drops unread ones);
    # the wait-only consumers (``_wait``) price none, on purpose
    assert all(v.macros_dict().get("SINK") == 1 for n, v in variants.items()
               if n.startswith("stream_bare_") and n != "stream_bare" and "_wait" not in n)
    assert all("SINK" not in v.macros_dict() for n, v in variants.items() if "_wait" in n)
    assert variants["step3_t9"].tokens == t and variants["step3"].tokens == 1
    assert variants["step3_t9"].macros_dict()["ARITH"] == 2


def test_the_cluster_form_lays_out_what_the_kernel_reads(
    bench_chain: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ctypes

    # the partial and its two mbarriers after the input, as the source places them
    src = bench_chain.source()
    assert "#define PMAX (TOK * 1536)" in src  # bench_chain.pmax's default
    assert "smem + RING_BYTES + 16 * NSTAGE + ((XS_FLOATS + NCW + 1 + 3) / 4) * 16" in src
    assert "return (u64*)(part() + PMAX) + i;" in src  # cbar(0) and cbar(1): 16 bytes
    m = dict(bench_chain.Variant("x", (("CL", 4), ("COPY_BYTES", 3072), ("NCW", 8),
                                       ("NSTAGE", 4), ("STAGE_BYTES", 24576), ("TOK", 9),
                                       ("XMAX", 18432))).macros)
    ring = 4 * (24576 + 16)
    part = ring + -(-(9216 + 8 + 1) // 4) * 16
    assert part % 16 == 0 and bench_chain.smem_bytes(m) == part + 9 * 1536 * 4 + 16
    # the 1.5B's 9 hidden states fill PMAX exactly; a vector over it is refused
    a = bench_chain.MODELS["1.5B"]
    v = next(v for v in bench_chain.variants() if v.name == "step3_t9_cl4")
    bench_chain.plan_of(v, a, 120, 4096)
    small = bench_chain.Variant("small", (*v.macros, ("PMAX", 1024)), hops=3)
    with pytest.raises(ValueError, match="13824 partials, over the clusters' 1024"):
        bench_chain.plan_of(small, a, 120, 4096)
    # CUlaunchAttribute: an id, padding to 8 bytes, the cluster's x, y, z as u32 from byte 8
    attr = bench_chain.cluster_attr(4)
    assert ctypes.sizeof(attr) == 72
    assert tuple((ctypes.c_uint * 3).from_buffer_copy(bytes(attr)[8:20])) == (4, 1, 1)
    assert attr.id == bench_chain.CLUSTER_DIMENSION == 4

    # the grid: whole clusters, as many as the driver says fit at once, or a variant's GRID
    class Driver:
        def cuOccupancyMaxActiveClusters(self, n: object, fn: object, cfg: object) -> int:  # noqa: N802
            ctypes.cast(n, ctypes.POINTER(ctypes.c_int))[0] = 30
            return 0

    k = object.__new__(bench_chain.Kernels)
    k.lib = Driver()
    monkeypatch.setattr(k, "get", lambda macros: (None, 200_000, "test"), raising=False)
    by = {v.name: v for v in bench_chain.variants()}
    assert k.grid(by["step3_t9_cl4"].macros, 132) == 120
    assert k.grid(by["step3_t9_cl2"].macros, 132) == 60  # 30 clusters said to fit
    assert k.grid(by["step3_t9"].macros, 132) == 132
    assert k.grid(by["step3_t9_ns4_g120"].macros, 132) == 120
    # the plan of a grid that leaves SMs idle deals its outputs to the blocks there are
    words, _ = bench_chain.plan_of(by["step3_t9_ns4_g120"], a, 120, 4096)
    assert words[4] == -(-a.qkv_dim * 9 // 120)


def test_the_plan_reaches_the_kernel_as_its_u32_words(bench_chain: ModuleType) -> None:
    # Run 248 lost its 3-hand-off variants to an int32 overflow of the reduce bit.
    words, _ = bench_chain.plan_words(bench_chain.MODELS["1.5B"], 132, hops=3, weights=True,
                                      trips=True)
    got = bench_chain.plan_tensor(words)
    assert [w & 0xFFFFFFFF for w in got.tolist()] == words
    with pytest.raises(ValueError, match="u32"):
        bench_chain.plan_tensor([1 << 32])
    # the host's bit and vector length are the kernel's
    import re

    src = bench_chain.source()
    assert int(re.search(r"#define REDUCE_BIT (0x[0-9a-f]+)u", src).group(1), 16) == bench_chain.REDUCE
    assert f"#define XMAX {bench_chain.XMAX}" in src
    assert "#define XS_FLOATS (TOK == 1 ? XMAX : XMAX / 2)" in src  # bench_chain.xs_floats
    for v in bench_chain.variants():
        m = v.macros_dict()
        assert m["XMAX"] in ((bench_chain.XMAX,) if v.tokens == 1 else (
            bench_chain.XMAX_VERIFY, bench_chain.XMAX_VERIFY6))
        # every model's plan fits the variant's vectors and stages (a plan_words refusal)
        for a in bench_chain.MODELS.values():
            bench_chain.plan_of(v, a, 132, 4096)
        # every block fits an H200 SM's 227 KB of shared memory, or the launch fails
        assert bench_chain.smem_bytes(m) <= 227 * 1024, v.name


def test_the_skeletons_trace_reads_imbalance_and_latency_per_hand_off(
    bench_chain: ModuleType,
) -> None:
    # Three blocks, two phases a layer, four layers; the stamps near the epoch as the timer's.
    import torch

    # Stamps near the epoch as the timer's; block 2 late by a different amount at each layer,
    # so a mean over blocks, all layers or the first phase's end would each read otherwise.
    blocks, nph, layers = 3, 2, 4
    base = 1_800_000_000_000_000_000
    tr = torch.zeros(blocks, layers * nph, 3, dtype=torch.int64)
    t = base
    for h in range(layers * nph):
        lay, p = divmod(h, nph)
        late = (700 if p else 300) + (5000 if lay in (0, layers - 1) else 0)
        arrive = [t, t + 100, t + late]
        last = max(arrive)
        for b in range(blocks):
            tr[b, h, 0] = arrive[b]
            tr[b, h, 1] = last + 400 + 10 * b + 900 * (b == 2)  # the median block: +410 ns,
            tr[b, h, 2] = last + 150 + 10 * b + 900 * (b == 2)  # having seen the count at +160
        t = last + 1000
    got = bench_chain.hop_stats(tr, nph, layers, ["a", "b"])
    assert got["a"] == {"imbalance_us": pytest.approx(0.2), "latency_us": pytest.approx(0.41),
                        "counted_us": pytest.approx(0.16)}
    assert got["b"] == {"imbalance_us": pytest.approx(0.6), "latency_us": pytest.approx(0.41),
                        "counted_us": pytest.approx(0.16)}
    # a middle layer: phase a (300 + 1000) then phase b (700 + 1000), last arrival to last
    # arrival; the first and last layers' late block moves only their own layer times
    assert got["layer_us"] == pytest.approx(3.0)


def test_the_stalls_say_whether_the_ring_covered_the_hand_offs(bench_chain: ModuleType) -> None:
    import torch

    # Two blocks, three hand-offs; stamps near the epoch as the timer's (int64 before floats).
    base = 1_800_000_000_000_000_000
    hops = torch.zeros(2, 3, 3, dtype=torch.int64)  # ns
    for b in range(2):
        for h in range(3):
            hops[b, h, 0] = base + 10_000 * h
            hops[b, h, 1] = base + 10_000 * h + 1_500 + 500 * b  # 1.5 and 2.0 µs a hand-off
    # SM cycles (ring full, starved, the block's) and the block's ns: block 0 at 2 cycles a ns
    stalls = torch.tensor([[8_000, 18_000, 80_000, 40_000],
                           [6_000, 7_000, 50_000, 50_000]], dtype=torch.int64)
    got = bench_chain.stall_stats(stalls, hops)
    assert got == {"ring_full_us": pytest.approx(5.0), "starved_us": pytest.approx(8.0),
                   "handoff_us": pytest.approx(5.25), "block_us": pytest.approx(45.0),
                   "sm_GHz": pytest.approx(1.5)}  # the median of 2 and 1 cycles a ns
    # a stream that never waits has no hand-offs to sum
    assert bench_chain.stall_stats(stalls, None)["handoff_us"] == 0.0
    # the kernel writes its four words where the host reads them: after the trace's
    # blocks x hops x 3 stamps, four a block
    import inspect

    assert "u64* stall = trace + (u64)gridDim.x * nhop * 3 + 4 * blockIdx.x;" in bench_chain.source()
    run = inspect.getsource(bench_chain.run_model)
    assert "torch.zeros(blocks * (nhop * 3 + 4)" in run
    assert "trace[blocks * nhop * 3:].view(blocks, 4)" in run


def test_the_4_bit_controls_stream_what_the_4_bit_consumers_do(bench_chain: ModuleType) -> None:
    by = {v.name: v for v in bench_chain.variants()}
    a = bench_chain.MODELS["1.5B"]
    q4 = bench_chain.plan_of(by["stream_bare_q4"], a, 132, 0)
    # the read-only control: the same plan and bytes, no decode (ARITH 0)
    assert bench_chain.plan_of(by["stream_bare_r4"], a, 132, 0) == q4
    assert by["stream_bare_r4"].macros_dict()["ARITH"] == 0
    # 0.625 bytes a weight: 5/16 of the bf16 stream (no K/V at position 0), rounded up to
    # whole stages a phase
    bf16 = bench_chain.plan_of(by["stream_bare"], a, 132, 0)[1]
    assert 5 / 16 <= q4[1] / bf16 < 5 / 16 * 1.01
    # 16 consumer warps get a super-tile each a stage: the same bytes in stages twice the size
    w16 = by["stream_bare_q4_w16"].macros_dict()
    assert w16["NCW"] == 16 and w16["STAGE_BYTES"] == 16 * bench_chain.Q4_SUPER
    assert bench_chain.plan_of(by["stream_bare_q4_w16"], a, 132, 0)[1] >= q4[1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--models", "7B"], "unknown model '7B': choose from 1.5B, 0.5B"),
    (["--variants", "step,stepp"], "unknown variant 'stepp': choose from stream_bare, "),
    (["--reps", "0"], "--reps must be at least 1, not 0"),
])
def test_the_skeleton_refuses_a_mistyped_name_before_it_looks_for_a_gpu(
    bench_chain: ModuleType, argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.argv", ["bench_chain.py", *argv])
    with pytest.raises(SystemExit):
        bench_chain.main()
    assert message in capsys.readouterr().err


def test_the_skeleton_uses_the_cuda_steps_own_ring_code(bench_chain: ModuleType) -> None:
    src = bench_chain.source()
    assert "@PTX_HELPERS@" not in src
    assert src.count("void bulk_load(") == 1 and src.count("bool mbar_try_wait(") == 1
    # the timer and the watchdog wait are stream_probe.cu's, written once
    assert "@PROBE_HELPERS@" not in src
    assert src.count("void mbar_wait(") == 1 and src.count("u64 globaltimer()") == 1


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc is not installed")
def test_every_skeleton_variant_builds_for_sm_90(bench_chain: ModuleType) -> None:
    from openjarvis.engine.torch.cuda_step import compile_cached

    for v in bench_chain.variants():
        cubin, _ = compile_cached(bench_chain.source(), v.macros_dict(), "sm_90", "nvcc",
                                  "chain_probe")
        assert cubin[:4] == b"\x7fELF", v.name
        if v.name in ("stream_bare_t9", "stream_bare_q4", "stream_bare_q4_w16",
                      "stream_bare_fma", "stream_bare_lean"):
            # a bare stream that prices arithmetic must still hold it after ptxas (run 254's
            # 9-token one held none: nothing read its sums)
            sass = _sass(cubin)
            if sass is not None:
                assert ("HMMA" in sass) if v.macros_dict()["ARITH"] in (2, 3) else (
                    "FFMA" in sass), v.name


def _sass(cubin: bytes) -> str | None:
    """cuobjdump's SASS of ``cubin`` (Triton's bundled cuobjdump), or None where there is none."""
    import subprocess
    import tempfile
    from pathlib import Path as P

    try:
        import triton
    except ImportError:
        return None
    tool = P(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def test_a_greedy_trace_of_an_unknown_step_kind_is_refused_before_anything_runs(
    trace_step: ModuleType,
) -> None:
    assert trace_step.TAILS["screened"] == ("prep", "screen", "rescore", "pick")
    with pytest.raises(SystemExit, match="--greedy takes logits, plain, screened; got 'greedy'"):
        trace_step.main(["--greedy", "plain,greedy"])


def test_bench_screen_refuses_an_unknown_copy_variant_on_any_machine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import bench_screen  # (see bench_verify above)

    assert bench_screen.main(["--copies", "2", "--variants", "plain,screend"]) == 2
    err = capsys.readouterr().err
    assert "variant 'screend' is unknown or does not apply to 1.5B; choose from plain" in err
    # each model's own default prefetch: the 0.5B has none, so its pp / pa need a pf first
    assert bench_screen.main(["--copies", "1", "--models", "0.5B", "--variants",
                              "plain_pp64"]) == 2
    assert "variant 'plain_pp64' is unknown or does not apply to 0.5B" in capsys.readouterr().err
    assert bench_screen.main(["--copies", "1", "--variants", " , "]) == 2
    assert "--variants names none" in capsys.readouterr().err
    if not torch.cuda.is_available():  # spaces are stripped: these pass the names' check
        assert bench_screen.main(["--copies", "1", "--models", "1.5B,0.5B", "--variants",
                                  " plain , screened_pf4_pp64 "]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
    assert bench_screen.main(["--carveout", "0"]) == 2
    assert "--carveout applies to --copies only" in capsys.readouterr().err
    # a variant is a base and any changes: each change sets what it names, and only that
    r = SimpleNamespace(one_token_pdl={"qkv": 1}, l2_prefetch=(8.0, 128, 0))
    bench_screen.apply_variant(r, "screened_pf12_nopdl")
    assert r.screen_out and r.l2_prefetch == (12.0, 128, 0)
    assert r.one_token_pdl == {"qkv": 1, "out": 0}
    assert not hasattr(r, "out_evict")
    bench_screen.apply_variant(r, "screened_pp64_pa2")
    assert r.l2_prefetch == (12.0, 64, 2)
    bench_screen.apply_variant(r, "plain_nopf")
    assert not r.screen_out and r.l2_prefetch is None
    with pytest.raises(ValueError):  # programs or a point of no prefetch
        bench_screen.apply_variant(r, "plain_nopf_pp64")
    bench_screen.apply_variant(r, "plain_nopf_pf4_pa1")
    assert r.l2_prefetch == (4.0, 128, 1)
    for bad in ("screened_pf0", "plain_pf", "plain_nopf_x", "pf12", "plain_pfef", "plain_pa3",
                "plain_pp0"):
        assert bench_screen.main(["--copies", "1", "--variants", bad]) == 2
        assert f"variant {bad!r} is unknown" in capsys.readouterr().err


def test_the_l2_probe_chases_every_line_of_its_buffer_once_and_refuses_bad_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import bench_l2_keep  # (see bench_verify above)

    from openjarvis.engine.torch import cuda_step

    a = bench_l2_keep.chase_buffer(1000 * 128, device="cpu")
    line = bench_l2_keep.LINE
    p, seen = int(a[0]), []
    for _ in range(1000):
        assert p % line == 0  # every load lands on a line's first element
        seen.append(p // line)
        p = int(a[p])
    assert sorted(seen) == list(range(1000)) and p == int(a[0])  # one cycle through all
    with pytest.raises(ValueError, match="set-aside is bytes >= 0, not -1"):
        cuda_step.set_persisting_l2(-1)
    for args, says in ((["--reps", "0"], "--steps and --reps > 0"),
                       (["--flush", "-1"], "--flush and --aside >= 0"),
                       (["--buffer", "0.5"], "0.5 MB holds 3906 lines; a chase of 2 x --steps "
                                             "(8192) and its first load must meet each line once"),
                       (["--buffer", "1", "--steps", "4000"], "holds 7812 lines"),
                       # exactly 2 x steps lines: the first load makes one line too many
                       (["--buffer", "0.256", "--steps", "1000"], "holds 2000 lines"),
                       # the first size past int32 reach (2**31 int32 elements, 8.589934592 GB)
                       (["--flush", "8589.935"], "--flush 8589.93 MB is past what int32 indices"),
                       (["--buffer", "9000"], "--buffer 9000 MB is past what int32"),
                       (["--buffer", "-1"], "--buffer must be > 0"),
                       (["--flush", "inf"], "must be finite numbers"),
                       (["--restream", "50,x"], "--restream takes sizes in MB > 0"),
                       (["--restream", "50,0"], "--restream takes sizes in MB > 0"),
                       (["--restream", "nan"], "--restream takes sizes in MB > 0"),
                       (["--restream", "inf"], "--restream takes sizes in MB > 0"),
                       (["--restream", "9000"], "--restream 9000 MB is past what int32")):
        assert bench_l2_keep.main(args) == 2  # refused before it looks for a GPU
        assert says in capsys.readouterr().err
    if not torch.cuda.is_available():  # the last size within int32 reach passes the checks
        for args in ([], ["--flush", "8589.934"], ["--restream", "1,8589.934"]):
            assert bench_l2_keep.main(args) == 2
            assert "needs a CUDA GPU" in capsys.readouterr().err


def test_ptx_hints_tells_hinted_loads_from_plain_ones_and_copies_from_loads() -> None:
    import ptx_hints  # (see bench_verify above)

    ptx = """
    createpolicy.fractional.L2::evict_first.b64 %rd18, 1.0;
    cp.async.cg.shared.global.L2::cache_hint [ %r26 + 0 ], [ %rd17 + 0 ], 0x10, %r27, %rd18;
    cp.async.cg.shared.global [ %r42 + 0 ], [ %rd26 + 0 ], 0x10, %r44;
    cp.async.ca.shared.global [ %r43 + 0 ], [ %rd27 + 0 ], 0x10, %r44;
    cp.async.commit_group;
    cp.async.wait_group 1;
    @%p10 ld.global.L1::evict_first.L2::cache_hint.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd3 ], %rd9;
    ld.global.L1::no_allocate.L2::evict_first.b32 { %r10 }, [ %rd7 ];
    ld.global.b32 { %r5 }, [ %rd4 + 0 ];
    ld.global.v4.b32 { %r6, %r7, %r8, %r9 }, [ %rd5 + 0 ];
    st.global.b32 [ %rd6 + 0 ], { %r5 };
    """
    assert ptx_hints.count_forms(ptx) == {"ld_hint": 2, "ld_plain": 2, "cp_async_hint": 1,
                                          "cp_async_plain": 2}


def test_a_launchs_trace_figures_come_from_its_stamps_and_the_launch_before(
    trace_step: ModuleType,
) -> None:
    # two launches of two programs: stamps (ns) entry, past the wait, past the loop, done
    import torch

    st = torch.tensor([[[0, 100, 900, 1000], [50, 120, 950, 1100]],
                       [[800, 1300, 2000, 2100], [1200, 1400, 2600, 2700]]], dtype=torch.float64)
    sm = torch.tensor([[3, 4], [3, 3]])
    seen = torch.ones(2, 2, dtype=torch.bool)
    first, last = st.amin(1) / 1e3, st.amax(1) / 1e3
    got = dict(trace_step.launch_figures(first, last, st, sm, seen, 1))
    assert got["release"] == pytest.approx(0.2)  # 1.3 us past its wait, 1.1 the one before done
    assert got["lead"] == pytest.approx(0.5)  # in at 0.8 us
    assert got["wait_spread"] == pytest.approx(0.1)
    assert got["loop"] == pytest.approx(1.3)  # the last past its loop at 2.6
    assert got["tail"] == pytest.approx(0.1)
    assert got["sm_max"] == 2 and got["sm_used"] == 1  # both on SM 3
    assert got["early_n"] == 1  # one entered before the launch before was done (1.1 us)


@pytest.mark.parametrize(("ways", "message"), [
    ("128", "--ways takes W/R pairs"),
    ("128/x", "--ways takes W/R pairs"),
    ("128/0", "--ways needs a wide step of 0 or more tokens and runs of 1 or more"),
])
def test_the_wide_bench_refuses_a_mistyped_way_before_it_looks_for_a_gpu(
    ways: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    import bench_wide  # (see bench_verify above)

    monkeypatch.setattr("sys.argv", ["bench_wide.py", "--ways", ways])
    with pytest.raises(SystemExit):
        bench_wide.main()
    assert message in capsys.readouterr().err
