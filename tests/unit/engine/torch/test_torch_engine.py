"""TorchEngine on the CPU (float32) over the tiny GGUF: the Engine Protocol, against llama.cpp
on the same file and against an independent float64 Qwen2 of the same weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_spy import record_calls
from torch_ref import qwen2_f64

from openjarvis.engine.base import Engine
from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.engine import TorchEngine
from openjarvis.engine.torch.weights import read_gguf
from openjarvis.errors import ContextOverflow, EngineError

TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n"


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.fixture
def engine(tiny_verifier_path: Path) -> Iterator[TorchEngine]:
    with TorchEngine.from_gguf(tiny_verifier_path, context=256) as e:
        yield e


def test_is_an_engine_on_the_cpu_in_float32(engine: TorchEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.describe()["dtype"] == "torch.float32" and engine.n_ctx == 256
    assert engine.n_past == 0 and engine.eos_token_ids


def test_a_prompt_is_read_in_runs_of_the_widest_wide_step_on_the_gpu_path_only(
        engine: TorchEngine) -> None:
    """On the CPU the speculator's runs of ``RUN`` (a cancel lands within one); on the GPU's
    path (Triton kernels in CUDA graphs, ``Runner.wide`` on) runs of the widest wide step, which
    read each weight once a run; a width that is not a multiple of ``RUN`` is not asked for."""
    from openjarvis.engine.prefix_cache import RUN, run_of

    r = engine.runner
    assert run_of(engine) == engine.prefill_run == RUN and r.wide == 0
    r.kernels, r.graphs, r.wide = "triton", True, 1024  # (the GPU default; the flags alone)
    assert r.wide_widths == (1024, 512, 256, 128)
    assert run_of(engine) == 1024
    r.wide = 200
    assert r.wide_widths == (200, 128) and run_of(engine) == RUN
    r.graphs = False
    r.wide = 1024
    assert run_of(engine) == RUN


def test_logits_match_float64_reference_of_the_file(engine: TorchEngine, tiny_verifier_path: Path) -> None:
    tokens = engine.tokenize(TEXT)
    assert len(tokens) > 10
    meta, arrays = read_gguf(tiny_verifier_path)
    args = ModelArgs.from_metadata(meta)
    ref = qwen2_f64(args, {k: torch.from_numpy(v) for k, v in arrays.items()}, tokens)
    out = engine.eval(tokens)
    assert out.dtype == np.float32 and out.shape == (len(tokens), engine.n_vocab)
    assert rel(out, ref[:, : engine.n_vocab].numpy()) < 1e-4


def test_agrees_with_llama_cpp_on_the_same_file(engine: TorchEngine, tiny_verifier_path: Path) -> None:
    from openjarvis.engine.llama import LlamaEngine

    with LlamaEngine(tiny_verifier_path, context=256, threads=1) as llama:
        assert llama.vocab_fingerprint() == engine.vocab_fingerprint()
        tokens = llama.tokenize(TEXT)
        assert engine.tokenize(TEXT) == tokens
        assert engine.detokenize(tokens) == llama.detokenize(tokens) == TEXT.encode()
        ours, theirs = engine.eval(tokens), llama.eval(tokens)
    assert rel(ours, theirs) < 1e-3  # float32 weights on both sides
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_rollback_save_and_load_state(engine: TorchEngine) -> None:
    tokens = engine.tokenize(TEXT)
    full = engine.eval(tokens)
    engine.rollback(5)
    assert engine.n_past == 5
    engine.eval([7, 8, 9])  # a rejected draft
    engine.rollback(5)
    again = engine.eval(tokens[5:], last_only=True)
    assert again.shape == (1, engine.n_vocab)
    np.testing.assert_allclose(again[0], full[-1], rtol=1e-5, atol=1e-5)
    state = engine.save_state()
    engine.eval([3, 4])  # then forget it by loading the state back
    engine.load_state(state)
    assert engine.n_past == len(tokens)
    engine.rollback(len(tokens) - 1)
    np.testing.assert_allclose(engine.eval(tokens[-1:])[0], full[-1], rtol=1e-5, atol=1e-5)


def test_eval_argmax_is_the_argmax_of_eval(engine: TorchEngine) -> None:
    tokens = engine.tokenize(TEXT)
    greedy = engine.eval_argmax(tokens)
    engine.rollback(0)
    assert greedy == [int(x) for x in engine.eval(tokens).argmax(-1)]


def test_draft_greedy_is_each_step_s_argmax_fed_to_the_next(engine: TorchEngine) -> None:
    """The call and its bookkeeping (on the CPU a loop of greedy steps; the one-graph chain it
    runs on a GPU is tested against the same steps one by one in test_on_gpu.py)."""
    tokens = engine.tokenize(TEXT)
    engine.eval_argmax(tokens[:-1])
    drafted = engine.draft_greedy(tokens[-1], 5)
    assert engine.n_past == len(tokens) + 4
    engine.rollback(len(tokens) - 1)
    one_by_one, tok = [], tokens[-1]
    for _ in range(5):
        tok = engine.eval_argmax([tok])[0]
        one_by_one.append(tok)
    assert drafted == one_by_one
    with pytest.raises(ContextOverflow):
        engine.draft_greedy(1, engine.n_ctx)
    with pytest.raises(EngineError, match="n >= 1"):
        engine.draft_greedy(1, 0)
    with pytest.raises(EngineError, match="out of range"):
        engine.draft_greedy(-1, 2)
    engine.warm_drafts()  # no graphs on the CPU: nothing to capture, nothing changed
    assert engine.n_past == len(tokens) + 4


def test_costs_are_timed_as_greedy_calls(engine: TorchEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy requests (the default) verify through ``eval_argmax``: the planner's costs are
    timed that way, and the cache is left as it was."""
    from openjarvis.engine import costs

    calls = record_calls(engine, ("eval", "eval_argmax"), monkeypatch)
    cost = costs.measure(engine, "key", ks=(1, 3))
    assert set(cost.seconds) == {1, 3} and engine.n_past == 0
    timed = [c for c in calls if c[1] in (1, 3)]
    assert timed and all(name == "eval_argmax" for name, _ in timed)
    assert "-argmax" in engine.cost_key()
    calls.clear()
    sampled = costs.measure(engine, "key|logits", ks=(1, 3), greedy=False)  # the other table
    assert set(sampled.seconds) == {1, 3} and engine.n_past == 0
    assert all(name == "eval" for name, n in calls if n in (1, 3))


def test_warmup_leaves_an_empty_cache_that_computes_the_same(tiny_verifier_path: Path) -> None:
    with TorchEngine.from_gguf(tiny_verifier_path, context=256, warmup=True) as warm, \
            TorchEngine.from_gguf(tiny_verifier_path, context=256) as cold:
        assert warm.n_past == 0
        tokens = warm.tokenize(TEXT)
        np.testing.assert_allclose(warm.eval(tokens), cold.eval(tokens), rtol=1e-5, atol=1e-5)


def test_errors(engine: TorchEngine) -> None:
    with pytest.raises(EngineError, match="at least one token"):
        engine.eval([])
    with pytest.raises(ContextOverflow, match="256-token context"):
        engine.eval([1] * 257)
    assert engine.n_past == 0
    with pytest.raises(EngineError, match="roll back to 3"):
        engine.rollback(3)
    with pytest.raises(EngineError, match="does not fit"):
        engine.load_state(b"not a state")
    with pytest.raises(EngineError, match="not found"):
        TorchEngine.from_gguf(Path("/nonexistent.gguf"))


def test_the_deterministic_setting_reaches_the_runner_and_its_cost_key(tiny_verifier_path: Path) -> None:
    from openjarvis.config import EngineConfig

    with TorchEngine.from_config(tiny_verifier_path, EngineConfig(context=256, deterministic=True)) as det, \
            TorchEngine.from_config(tiny_verifier_path, EngineConfig(context=256)) as plain:
        assert det.runner.deterministic and not plain.runner.deterministic
        assert det.describe()["deterministic"] is True
        assert det.cost_key() != plain.cost_key()  # verify costs differ: separate cost tables


def test_a_speed_tuning_reprices_the_cost_tables_and_keeps_saved_heads(
        engine: TorchEngine, tmp_path: Path) -> None:
    """The verify steps' shared-memory floors change what a step costs, not the bits it
    writes: the cost tables are keyed anew, a saved head still loads. Wide steps on the
    Triton path change the bits: a head saved without them is not loaded into an engine that
    would compute it with them."""
    from openjarvis.engine.prefix_cache import PrefixCache

    cache = PrefixCache(tmp_path)
    tokens = (engine.tokenize(TEXT) * 8)[:80]
    engine.eval(tokens, last_only=True)
    assert cache.save(engine, tokens) is not None
    r = engine.runner
    cost, state = engine.cost_key(), engine.state_key()
    r.smem_floor = {("combine", True): 77_056, ("wo", True): 77_056}
    r.smem_floor_max_t = 17
    try:
        assert engine.cost_key() == cost + "-floors<=17:combine@v=77056,wo@v=77056"
        assert engine.state_key() == state
        engine.rollback(0)
        assert cache.load(engine, tokens) and engine.n_past == len(tokens)
    finally:
        r.smem_floor = {}
    r.wide = 256  # the torch path never takes a wide step: the same bits
    assert engine.state_key() == state
    r.kernels, r.wide = "triton", 0  # (the flags alone: the keys a GPU engine would have)
    try:
        narrow = engine.state_key()
        assert "-wide" not in narrow and cache.save(engine, tokens) is not None
        r.wide = 256  # its steps would now read a head in wide steps: other bits
        assert engine.state_key() == narrow + "-wide256/128"
        engine.rollback(0)
        assert not cache.load(engine, tokens) and cache.last_miss == "absent"
        assert engine.n_past == 0
        r.wide = 0
        assert cache.load(engine, tokens) and engine.n_past == len(tokens)
    finally:
        r.kernels, r.wide = "torch", 0
    assert engine.state_key() == state


def test_the_gpu_warm_up_covers_every_step_size_a_request_can_run() -> None:
    """A request runs steps of 1 to ``MAX_STEP`` tokens (verifies up to 17, a prompt's steps of
    32 and what they leave, the drafter's catch-up with argmaxes): the engine captures all of
    them at load, logits and greedy (the GPU test of the same runs them and sees nothing new
    captured)."""
    from openjarvis.engine.speculative import MAX_DRAFT
    from openjarvis.engine.torch.engine import WARM_GREEDY, WARM_STEPS
    from openjarvis.engine.torch.generate import MAX_STEP

    assert MAX_DRAFT + 1 <= MAX_STEP
    assert set(WARM_STEPS) == set(WARM_GREEDY) == set(range(1, MAX_STEP + 1))
