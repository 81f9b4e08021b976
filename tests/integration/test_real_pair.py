"""The real default pair loads in llama.cpp and generates: the catalog's bytes are a usable model."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("role", ["drafter", "verifier"])
def test_real_model_generates(real_pair: tuple[Path, Path], role: str) -> None:
    from llama_cpp import Llama

    path = real_pair[0] if role == "drafter" else real_pair[1]
    llm = Llama(model_path=str(path), n_ctx=256, n_threads=2, verbose=False, seed=0)
    try:
        out = llm.create_completion("def fibonacci(n):", max_tokens=8, temperature=0.0)
        text = out["choices"][0]["text"]
        assert out["usage"]["completion_tokens"] >= 1
        assert text.strip(), f"{role} produced only whitespace: {text!r}"
        assert llm.n_vocab() == 151936
        assert llm.token_eos() == 151645
    finally:
        llm.close()
