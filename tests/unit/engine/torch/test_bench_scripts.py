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
