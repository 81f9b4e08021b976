"""The tiny test models load in llama.cpp, tokenize like Qwen and generate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from make_tiny_gguf import SPECIAL_TOKENS

llama_cpp = pytest.importorskip("llama_cpp")


def load(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(path), n_ctx=256, n_threads=1, verbose=False)


@pytest.mark.parametrize("which", ["tiny_drafter_path", "tiny_verifier_path", "tiny_other_path"])
def test_each_tiny_model_loads_and_generates(which: str, request: pytest.FixtureRequest) -> None:
    llm = load(request.getfixturevalue(which))
    try:
        out = llm.create_completion("def add(a, b):", max_tokens=8, temperature=0.0)
        assert out["usage"]["completion_tokens"] >= 1
        assert llm.metadata["general.architecture"] == "qwen2"
        assert llm.metadata["tokenizer.ggml.pre"] == "qwen2"
    finally:
        llm.close()


def test_tokenizer_is_byte_level_bpe_with_qwen_specials(tiny_verifier_path: Path) -> None:
    llm = load(tiny_verifier_path)
    try:
        text = "def fibonacci(n):\n    return n  # naïve ✓"
        tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert len(tokens) < len(text.encode())  # merges apply
        assert llm.detokenize(tokens).decode() == text  # and round-trip every byte
        for special in SPECIAL_TOKENS:
            ids = llm.tokenize(special.encode(), add_bos=False, special=True)
            assert len(ids) == 1, special
        (im_end,) = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
        assert llm.token_eos() == im_end
        assert "<|im_start|>" in llm.metadata["tokenizer.chat_template"]
    finally:
        llm.close()


def test_drafter_and_verifier_share_vocabulary_other_differs(
    tiny_drafter_path: Path, tiny_verifier_path: Path, tiny_other_path: Path
) -> None:
    from gguf import GGUFReader

    def tokens(path: Path) -> list[bytes]:
        field = GGUFReader(path).fields["tokenizer.ggml.tokens"]
        return [bytes(field.parts[i]) for i in field.data]

    assert tokens(tiny_drafter_path) == tokens(tiny_verifier_path)
    assert tokens(tiny_other_path) != tokens(tiny_verifier_path)


def test_cli_writes_a_loadable_model(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[3] / "scripts" / "make_tiny_gguf.py"
    out = tmp_path / "d.gguf"
    result = subprocess.run(
        [sys.executable, str(script), str(out), "--role", "drafter", "--seed", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == str(out)
    llm = load(out)
    try:
        assert llm.metadata["qwen2.block_count"] == "2"
    finally:
        llm.close()
