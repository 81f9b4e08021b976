"""The llama-cpp-python Engine on the tiny models: logits, exact rollback, state, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from openjarvis.engine.base import Engine
from openjarvis.engine.llama import LlamaEngine
from openjarvis.errors import ContextOverflow, EngineError

TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def test_is_an_engine(verifier: LlamaEngine) -> None:
    assert isinstance(verifier, Engine)
    assert verifier.eos_token_ids >= {verifier.special_token("<|im_end|>")}


def test_tokenize_round_trips_text_and_specials(verifier: LlamaEngine) -> None:
    text = "<|im_start|>user\n" + TEXT + "naïve ✓<|im_end|>"
    tokens = verifier.tokenize(text)
    assert verifier.detokenize(tokens).decode() == text
    assert verifier.tokenize("<|im_end|>") == [verifier.special_token("<|im_end|>")]
    assert len(verifier.tokenize("<|im_end|>", special=False)) > 1


def test_eval_returns_one_row_per_token_and_last_only(verifier: LlamaEngine) -> None:
    tokens = verifier.tokenize(TEXT)
    rows = verifier.eval(tokens)
    assert rows.shape == (len(tokens), verifier.n_vocab)
    assert rows.dtype == np.float32
    verifier.rollback(0)
    last = verifier.eval(tokens, last_only=True)
    assert last.shape == (1, verifier.n_vocab)
    np.testing.assert_allclose(last[0], rows[-1], atol=1e-4)
    assert verifier.n_past == len(tokens)


def test_eval_longer_than_a_batch(verifier: LlamaEngine) -> None:
    tokens = verifier.tokenize(TEXT * 8)
    assert len(tokens) > 64  # the fixture's batch size
    rows = verifier.eval(tokens)
    assert rows.shape[0] == len(tokens)


def test_rollback_is_exact(verifier: LlamaEngine) -> None:
    a = verifier.tokenize("def add(a, b):\n")
    b = verifier.tokenize("    return a - b\n")
    c = verifier.tokenize("    return a + b\n")
    fresh = verifier.eval(a + c)[len(a) :]
    verifier.rollback(0)
    verifier.eval(a + b)
    verifier.rollback(len(a))
    assert verifier.n_past == len(a)
    again = verifier.eval(c)
    np.testing.assert_allclose(again, fresh, atol=1e-4)


def test_rollback_beyond_cache_is_an_error(verifier: LlamaEngine) -> None:
    verifier.eval([1, 2, 3])
    with pytest.raises(EngineError, match="cannot roll back to 5"):
        verifier.rollback(5)


def test_state_round_trip(verifier: LlamaEngine, tiny_verifier_path: Path) -> None:
    prefix = verifier.tokenize(TEXT)
    verifier.eval(prefix)
    state = verifier.save_state()
    expected = verifier.eval([5, 6])
    with LlamaEngine(tiny_verifier_path, context=1024, threads=1) as fresh:
        fresh.load_state(state)
        assert fresh.n_past == len(prefix)
        np.testing.assert_allclose(fresh.eval([5, 6]), expected, atol=1e-4)


def test_context_overflow_is_a_clear_error(tiny_verifier_path: Path) -> None:
    with LlamaEngine(tiny_verifier_path, context=256, threads=1) as small:
        assert small.n_ctx == 256
        small.eval(list(range(200)))
        with pytest.raises(ContextOverflow, match="260 tokens exceed the 256-token context"):
            small.eval(list(range(60)))
        assert small.n_past == 200


def test_vocab_fingerprint_pairs_drafter_not_other(
    verifier: LlamaEngine, drafter: LlamaEngine, other: LlamaEngine
) -> None:
    assert verifier.vocab_fingerprint() == drafter.vocab_fingerprint()
    assert verifier.vocab_fingerprint() != other.vocab_fingerprint()


def test_corrupt_model_file_is_an_engine_error(tmp_path: Path, tiny_verifier_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny_verifier_path.read_bytes()[:5000])
    with pytest.raises(EngineError, match="cannot load .*bad.gguf"):
        LlamaEngine(bad)
    with pytest.raises(EngineError, match="model file not found"):
        LlamaEngine(tmp_path / "missing.gguf")
