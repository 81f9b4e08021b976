"""The cost-aware choice on synthetic cost tables for a laptop CPU and for a GPU."""

from __future__ import annotations

import pytest

from openjarvis.engine.base import CostModel
from openjarvis.engine.planner import Acceptance, Option, choose, expected_tokens

STEP = 0.0305
# Measured on a 2-core CPU (issue 3): verify(k) / step = 2.0 at k=3, 3.1 at k=5, 6 at k=17.
CPU = CostModel("cpu", {1: STEP, 3: 2.0 * STEP, 5: 3.1 * STEP, 17: 6.0 * STEP})
# A GPU: verifying 8 tokens costs about 1.2x one step.
GPU = CostModel("gpu", {1: 0.010, 2: 0.0102, 4: 0.0108, 8: 0.012, 16: 0.016})
DRAFTER_STEP_CPU = 0.017  # the 0.5B drafter on the same CPU


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_cpu_model_drafter_never_pays_plain_decoding_wins() -> None:
    for alpha in (0.5, 0.8, 0.9):
        plan = choose(CPU, [Option("model", 16, per_token=DRAFTER_STEP_CPU)], {"model": alpha})
        assert (plan.key, plan.k) == (None, 0)


def test_cpu_free_ngram_drafts_pay_when_they_are_accepted() -> None:
    copying = choose(CPU, [Option("ngram:4", 16)], {"ngram:4": 0.95})
    assert copying.key == "ngram:4" and copying.k >= 6
    assert copying.rate > 1.5 * copying.plain_rate
    noisy = choose(CPU, [Option("ngram:2", 16)], {"ngram:2": 0.3})
    assert noisy.key is None


def test_gpu_cheap_verification_makes_the_model_drafter_pay() -> None:
    plan = choose(GPU, [Option("model", 16, per_token=0.002)], {"model": 0.8})
    assert plan.key == "model" and 4 <= plan.k <= 12
    assert plan.rate > 1.5 * plan.plain_rate


def test_short_ngram_continuation_limits_k() -> None:
    plan = choose(GPU, [Option("ngram:4", 3)], {"ngram:4": 0.99})
    assert plan.k == 3


def test_acceptance_tracks_evidence_and_drifts_back_to_prior() -> None:
    acc = Acceptance()
    prior = acc.estimate("model")
    for _ in range(50):
        acc.record("model", drafted=4, accepted=0)
    assert acc.estimate("model") < 0.1
    for _ in range(400):
        acc.decay()
    assert acc.estimate("model") == pytest.approx(prior, abs=0.05)


def test_a_long_copied_match_drafts_from_a_cold_start_even_on_a_costly_verifier() -> None:
    """Session 2 measured verify(4) at 3.0 steps on this VM at a busy moment. With no evidence
    yet, an 8-token match's prior (0.8) does not clear the gain threshold there, so the copy-heavy
    edit was decoded plainly (0.99x) and acceptance never learned; a match reaching 16+ tokens
    back carries a prior that drafts on its own."""
    costly = CostModel("busy-cpu", {1: STEP, 2: 1.8 * STEP, 4: 3.0 * STEP, 9: 5.0 * STEP, 17: 7.5 * STEP})
    cold = Acceptance()
    short = choose(costly, [Option("ngram:8", 16)], cold.table(["ngram:8"]))
    assert short.key is None
    long = choose(costly, [Option("ngram:16", 16)], cold.table(["ngram:16"]))
    assert long.key == "ngram:16" and long.k >= 2
