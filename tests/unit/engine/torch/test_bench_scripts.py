"""The GPU benchmark scripts' variant plumbing, checked on the CPU before device time is spent.

A device run is 30 minutes a session; a typo in a variant's name or settings that only shows
there costs a run. These check what the scripts resolve a variant to, not what it measures.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest


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
