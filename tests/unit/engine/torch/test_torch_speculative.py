"""The speculator drives TorchEngine like any Engine: greedy output equals the verifier alone,
with both models in torch and with the drafter in llama.cpp (the heterogeneous case)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_spy import record_calls

from openjarvis.engine.base import CostModel
from openjarvis.engine.drafters import ModelDrafter
from openjarvis.engine.llama import LlamaEngine
from openjarvis.engine.speculative import Request, Speculator
from openjarvis.engine.torch.engine import TorchEngine

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
#: GPU-like costs (a k-token verify barely dearer than a step), pinned so tests skip measuring.
VERIFIER_COST = CostModel("v", {1: 1e-3, 2: 1.05e-3, 4: 1.1e-3, 8: 1.2e-3, 17: 1.5e-3})
DRAFTER_COST = CostModel("d", {1: 2e-4, 2: 2.1e-4, 4: 2.2e-4, 8: 2.4e-4, 17: 3e-4})


@pytest.fixture
def verifier(tiny_verifier_path: Path) -> Iterator[TorchEngine]:
    with TorchEngine.from_gguf(tiny_verifier_path, context=512) as e:
        e.set_cost_model(VERIFIER_COST)
        yield e


@pytest.mark.parametrize("drafter_backend", ["torch", "llama"])
def test_greedy_speculation_equals_the_verifier_alone(
    drafter_backend: str, verifier: TorchEngine, tiny_drafter_path: Path
) -> None:
    drafter = (
        TorchEngine.from_gguf(tiny_drafter_path, context=512)
        if drafter_backend == "torch"
        else LlamaEngine(tiny_drafter_path, context=512, threads=1)
    )
    drafter.set_cost_model(DRAFTER_COST)
    with drafter:
        prompt = verifier.tokenize(PROMPT)
        expected = Speculator(verifier).generate(Request(prompt, max_tokens=80, drafter="none"))
        expected_tokens = expected.run().tokens
        spec = Speculator(verifier, model_drafter=ModelDrafter(drafter, verifier=verifier))
        gen = spec.generate(Request(prompt, max_tokens=80, drafter="model")).run()
    assert gen.tokens == expected_tokens and len(expected_tokens) > 10
    model = gen.stats.per_drafter["model"]
    assert 0 < model.accepted < model.drafted  # drafts were both accepted and rejected


def test_torch_verifier_writes_what_llama_cpp_writes(
    verifier: TorchEngine, tiny_verifier_path: Path
) -> None:
    """Same file, both in float32: the same greedy answer."""
    with LlamaEngine(tiny_verifier_path, context=512, threads=1) as llama:
        prompt = llama.tokenize(PROMPT)
        theirs = Speculator(llama).generate(Request(prompt, max_tokens=40, drafter="none"))
        theirs_tokens = theirs.run().tokens
    ours = Speculator(verifier).generate(Request(prompt, max_tokens=40, drafter="none")).run()
    assert ours.tokens == theirs_tokens


@pytest.mark.parametrize(("drafter_backend", "drafter_engine"),
                         [("same", TorchEngine), ("torch", TorchEngine), ("llama", LlamaEngine)])
def test_engine_backend_torch_opens_the_pair_on_the_torch_backend(
    drafter_backend: str, drafter_engine: type, tiny_drafter_path: Path, tiny_verifier_path: Path
) -> None:
    """``engine.drafter_backend = "llama"``: the drafter in llama.cpp beside the torch verifier
    (the heterogeneous case) through the same configuration a user writes."""
    from openjarvis.config import load_config
    from openjarvis.engine.pair import close_speculator, open_speculator

    config = load_config(overrides={"engine.backend": "torch", "engine.context": "256",
                                    "engine.drafter_backend": drafter_backend, "engine.threads": "1"})
    spec = open_speculator(config, verifier_path=tiny_verifier_path, drafter_path=tiny_drafter_path, drafter="model")
    try:
        assert isinstance(spec.verifier, TorchEngine)
        assert spec.model_drafter is not None and type(spec.model_drafter.engine) is drafter_engine
        spec.verifier.set_cost_model(VERIFIER_COST)
        spec.model_drafter.engine.set_cost_model(DRAFTER_COST)
        prompt = spec.verifier.tokenize(PROMPT)
        alone = spec.generate(Request(prompt=prompt, max_tokens=40, drafter="none")).run()
        gen = spec.generate(Request(prompt=prompt, max_tokens=40, drafter="model")).run()
        assert gen.tokens == alone.tokens and gen.stats.per_drafter["model"].accepted > 0
    finally:
        close_speculator(spec)


def test_a_drafter_backend_that_does_not_exist_is_refused_by_name() -> None:
    from openjarvis.config import load_config
    from openjarvis.errors import ConfigError

    with pytest.raises(ConfigError, match="engine.drafter_backend"):
        load_config(overrides={"engine.drafter_backend": "cuda"})


def test_jarvis_ask_answers_on_the_torch_backend(
    tiny_setup: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who sets ``engine.backend = "torch"`` gets an answer from `jarvis ask`: the
    assistant renders the chat template and the speculator drives both torch engines."""
    from openjarvis import paths
    from openjarvis.cli import main
    from openjarvis.daemon.lifecycle import stop

    cfg = paths.user_config_file()
    cfg.write_text(cfg.read_text().replace("[engine]\n", '[engine]\nbackend = "torch"\n'))
    monkeypatch.chdir(tiny_setup)
    (tiny_setup / ".git").mkdir()
    try:
        assert main(["ask", "what", "parses", "http", "responses?"]) == 0
    finally:
        stop(paths.socket_path())
    out, err = capsys.readouterr()
    assert "\nsources: app/http.py:" in out
    assert err.strip().splitlines()[-1].startswith("local · tiny-v · ")


def test_the_torch_engine_reads_name_template_and_special_tokens_from_the_gguf(
    tiny_verifier_path: Path,
) -> None:
    with TorchEngine.from_gguf(tiny_verifier_path, context=128) as torch_e, \
            LlamaEngine(tiny_verifier_path, context=128, threads=1) as llama:
        assert torch_e.chat_template() == llama.chat_template() and "<|im_start|>" in (torch_e.chat_template() or "")
        assert torch_e.name == llama.name
        assert torch_e.special_token("<|im_end|>") == llama.special_token("<|im_end|>") is not None
        assert torch_e.special_token("not a special token") is None


def test_greedy_steps_take_only_the_argmax_and_logprobs_still_take_the_logits(
    verifier: TorchEngine, tiny_drafter_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy verify and draft steps never hand a logits row over (``greedy_eval``); a request
    for log-probabilities needs the rows, and gets them, with the same tokens."""
    with TorchEngine.from_gguf(tiny_drafter_path, context=512) as drafter:
        drafter.set_cost_model(DRAFTER_COST)
        names = ("eval", "eval_argmax", "draft_greedy")
        v_seen = record_calls(verifier, names, monkeypatch)
        d_seen = record_calls(drafter, names, monkeypatch)
        spec = Speculator(verifier, model_drafter=ModelDrafter(drafter, verifier=verifier))
        prompt = verifier.tokenize(PROMPT)
        gen = spec.generate(Request(prompt, max_tokens=40, drafter="model")).run()
        v_calls, d_calls = Counter(n for n, _ in v_seen), Counter(n for n, _ in d_seen)
        assert v_calls == {"eval": 1, "eval_argmax": gen.stats.steps}  # eval: the prefill
        drafts = gen.stats.per_drafter["model"].drafts  # each: one catch-up, then one chain
        assert d_calls["eval"] == 0 and d_calls["eval_argmax"] == drafts
        assert 0 < d_calls["draft_greedy"] <= drafts
        v_seen.clear()
        with_lp = spec.generate(Request(prompt, max_tokens=40, drafter="model", logprobs=True)).run()
        v_calls = Counter(n for n, _ in v_seen)
    assert with_lp.tokens == gen.tokens and with_lp.stats.mean_logprob is not None
    assert v_calls["eval_argmax"] == 0 and v_calls["eval"] >= with_lp.stats.steps


def test_sampled_requests_are_planned_with_the_costs_of_calls_that_return_logits(
    verifier: TorchEngine, tiny_drafter_path: Path
) -> None:
    """The torch engine's default table times greedy calls; a sampled step reads logits, so
    its plan uses the engine's other table. Here verifying is nearly free for greedy calls and
    dear for sampled ones: a greedy plan drafts, a sampled one does not."""
    cheap = CostModel("v", {1: 1e-3, 2: 1.01e-3, 8: 1.02e-3, 17: 1.03e-3})
    dear = CostModel("v|logits", {1: 1e-3, 2: 2e-3, 8: 8e-3, 17: 17e-3})
    verifier.set_cost_model(cheap, sampled=dear)
    with TorchEngine.from_gguf(tiny_drafter_path, context=512) as drafter:
        drafter.set_cost_model(DRAFTER_COST)
        spec = Speculator(verifier, model_drafter=ModelDrafter(drafter, verifier=verifier))
        spec.acceptance.record("model", 100, 95)  # a drafter that is usually right
        committed = verifier.tokenize(PROMPT)
        greedy_plan, _ = spec._plan("auto", committed, 8, None, 100)
        sampled_plan, _ = spec._plan("auto", committed, 8, None, 100, greedy_draft=False,
                                     greedy_verify=False)
    assert greedy_plan.key == "model" and greedy_plan.k > 1
    assert sampled_plan.key is None
    assert verifier.sampled_cost_model() is dear and verifier.cost_model() is cheap
