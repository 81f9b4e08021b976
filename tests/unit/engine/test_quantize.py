"""Quantizing a tiny model with llama.cpp's quantizer gives a smaller model that still generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from openjarvis.engine.llama import LlamaEngine
from openjarvis.engine.quantize import quantize
from openjarvis.engine.speculative import Request, Speculator
from openjarvis.errors import EngineError


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_model_is_smaller_and_generates(
    qtype: str, tiny_drafter_path: Path, tmp_path: Path
) -> None:
    out = quantize(tiny_drafter_path, tmp_path / f"d-{qtype}.gguf", qtype, threads=1)
    assert out.path.is_file() and out.type == qtype
    assert out.size < tiny_drafter_path.stat().st_size
    assert len(out.sha256) == 64 and out.source == tiny_drafter_path
    assert not list(tmp_path.glob("*.tmp"))
    with LlamaEngine(out.path, context=512, threads=1) as engine, LlamaEngine(
        tiny_drafter_path, context=512, threads=1
    ) as original:
        assert engine.vocab_fingerprint() == original.vocab_fingerprint()  # still pairs
        gen = Speculator(engine).generate(Request(engine.tokenize("def add(a, b):"), max_tokens=8))
        assert len(gen.run().tokens) > 0


def test_unknown_type_is_a_clear_error(tiny_drafter_path: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown quantization type 'Q9'; use one of Q4_0"):
        quantize(tiny_drafter_path, tmp_path / "x.gguf", "Q9")
