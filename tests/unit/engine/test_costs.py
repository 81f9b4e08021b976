"""Measured costs: a table per (model, device, threads), cached on disk, corrupt cache ignored."""

from __future__ import annotations

from pathlib import Path

from openjarvis import paths
from openjarvis.engine import costs
from openjarvis.engine.base import CostModel
from openjarvis.engine.llama import LlamaEngine, cost_key_for
from openjarvis.engine.pair import drafter_can_pay


def test_measured_once_then_read_from_the_cache(verifier: LlamaEngine) -> None:
    verifier.eval([1, 2, 3])
    cost = verifier.cost_model()
    assert verifier.n_past == 3  # measuring left the cache as it was
    assert set(cost.seconds) == set(costs.MEASURED_KS)
    times = [cost.seconds[k] for k in costs.MEASURED_KS]
    assert times == sorted(times)  # a bigger batch is never reported cheaper
    assert costs.costs_path().parent == paths.cache_dir()
    assert costs.cached(verifier.cost_key()) == cost
    assert "|t1|" in verifier.cost_key()
    assert verifier.cost_key() == cost_key_for(verifier.path, 1)
    assert cost_key_for(verifier.path, 2) != verifier.cost_key()  # threads are part of the key
    # llama.cpp hands over logits for every call: one table serves sampled requests too
    assert verifier.sampled_cost_model() is cost
    assert costs.cached(verifier.cost_key() + "|logits") is None


def test_corrupt_cache_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text("{not json", encoding="utf-8")
    assert costs.cached("k", path) is None
    costs.store(CostModel("k", {1: 0.01, 4: 0.02}), path)
    assert costs.cached("k", path) == CostModel("k", {1: 0.01, 4: 0.02})
    path.write_text('{"format": 1, "entries": {"k": {"seconds": {"1": -3}}}}', encoding="utf-8")
    assert costs.cached("k", path) is None


def test_drafter_can_pay_from_cached_costs(tiny_verifier_path: Path, tiny_drafter_path: Path) -> None:
    v, d = cost_key_for(tiny_verifier_path, 2), cost_key_for(tiny_drafter_path, 2)
    assert drafter_can_pay(v, d) is None  # nothing measured yet
    cpu_like = {1: 0.0305, 3: 0.061, 5: 0.0945, 17: 0.183}
    costs.store(CostModel(v, cpu_like))
    costs.store(CostModel(d, {1: 0.017, 3: 0.03}))
    assert drafter_can_pay(v, d) is False
    costs.store(CostModel(v, {1: 0.010, 2: 0.0102, 4: 0.0108, 8: 0.012, 16: 0.016}))
    costs.store(CostModel(d, {1: 0.002}))
    assert drafter_can_pay(v, d) is True
