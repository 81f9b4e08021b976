"""Sampling math: the distribution transforms and the speculative accept/reject rule."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from stats_helpers import chi_square_p

from openjarvis.engine.sampling import (
    SamplingParams,
    accept_draft,
    distribution,
    greedy,
    sample,
    top2_gap,
)

ROW = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 3.0 - 1e-3], dtype=np.float32)


def test_greedy_and_gap() -> None:
    assert greedy(ROW) == 3
    assert top2_gap(ROW) == pytest.approx(1e-3, abs=1e-5)
    assert distribution(ROW, SamplingParams()).tolist() == [0, 0, 0, 1, 0, 0]


def test_temperature_top_k_top_p() -> None:
    p = distribution(ROW, SamplingParams(temperature=1.0))
    expected = np.exp(ROW - ROW.max()) / np.exp(ROW - ROW.max()).sum()
    np.testing.assert_allclose(p, expected, rtol=1e-6)
    p2 = distribution(ROW, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(p2)) == {3, 5}
    p3 = distribution(ROW, SamplingParams(temperature=1.0, top_p=0.5))
    assert set(np.flatnonzero(p3)) == {3, 5}  # the two tokens at ~0.35 each reach 0.5
    assert p3.sum() == pytest.approx(1.0)
    cold = distribution(ROW, SamplingParams(temperature=0.01))
    assert cold[3] > 0.4 and cold[0] < 1e-6


@pytest.mark.parametrize("drafter_q", ["model", "deterministic"])
def test_accept_reject_preserves_target_distribution(drafter_q: str) -> None:
    rng = np.random.default_rng(7)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    q = np.array([0.1, 0.1, 0.1, 0.1, 0.6])  # a bad drafter: most mass where p has little
    n = 20_000
    seen: Counter[int] = Counter()
    for _ in range(n):
        if drafter_q == "model":
            x = sample(q, rng)
            ok, repl = accept_draft(p, q, x, rng)
        else:
            x = 4  # always proposes the same token
            ok, repl = accept_draft(p, None, x, rng)
        seen[x if ok else int(repl)] += 1
    assert chi_square_p(seen, p, n) > 0.001


def test_identical_distributions_always_accept() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.25, 0.25, 0.5])
    assert all(accept_draft(p, p, sample(p, rng), rng)[0] for _ in range(200))
