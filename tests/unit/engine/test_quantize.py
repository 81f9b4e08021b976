"""Quantizing a tiny model with llama.cpp's quantizer gives a smaller model that still generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from openjarvis.engine.llama import LlamaEngine
from openjarvis.engine.quantize import base_type, quantize
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


def test_a_known_source_hash_is_not_recomputed(
    tiny_drafter_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openjarvis.engine.quantize as Q

    hashed: list[Path] = []
    real = Q.file_sha256
    monkeypatch.setattr(Q, "file_sha256", lambda p: hashed.append(p) or real(p))
    out = quantize(tiny_drafter_path, tmp_path / "q8.gguf", "Q8_0", threads=1, source_sha256="ab" * 32)
    assert out.source_sha256 == "ab" * 32 and hashed == [out.path]  # only the new file is read
    again = quantize(tiny_drafter_path, tmp_path / "q8b.gguf", "Q8_0", threads=1)
    assert again.source_sha256 == real(tiny_drafter_path) and tiny_drafter_path in hashed


def test_unknown_type_is_a_clear_error(tiny_drafter_path: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown quantization type 'Q9'; use one of Q4_0"):
        quantize(tiny_drafter_path, tmp_path / "x.gguf", "Q9")


def test_output_type_sets_the_output_tensor_and_the_result_reports_the_mix(
    tiny_drafter_path: Path, tmp_path: Path
) -> None:
    plain = quantize(tiny_drafter_path, tmp_path / "q8.gguf", "Q8_0", threads=1)
    small = quantize(tiny_drafter_path, tmp_path / "q8-out-q4.gguf", "Q8_0", threads=1, output_type="q4_0")
    assert small.output_type == "Q4_0" and plain.output_type is None
    assert set(plain.tensor_bytes) == {"Q8_0"}
    assert set(small.tensor_bytes) == {"Q8_0", "Q4_0"} and small.size < plain.size
    assert abs(sum(small.share(t) for t in small.tensor_bytes) - 1.0) < 1e-9
    with LlamaEngine(small.path, context=256, threads=1) as engine:  # llama.cpp loads it
        assert engine.eval(engine.tokenize("x = 1"), last_only=True).shape[0] == 1


def test_k_quant_fallback_is_visible_in_the_result_not_in_llama_logs(
    tiny_drafter_path: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The tiny model's rows are 64 wide: no K-quant block (256) fits, llama.cpp falls back.
    out = quantize(tiny_drafter_path, tmp_path / "q2k.gguf", "Q2_K", threads=1)
    assert base_type("Q2_K") == "Q2_K" and base_type("q3_k_m") == "Q3_K" and base_type("Q4_0") == "Q4_0"
    assert out.share("Q2_K") == 0.0 and out.tensor_bytes
    err = capfd.readouterr().err
    assert "falling back" not in err and "llama_model_loader" not in err  # llama.cpp's 300-line log


def test_llama_errors_reach_stderr_and_nothing_is_left_behind(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    junk = models / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(EngineError, match="llama.cpp could not quantize junk.gguf to Q4_0"):
        quantize(junk, models / "out.gguf", "Q4_0", threads=1)
    assert "failed to quantize" in capfd.readouterr().err  # llama.cpp's own reason, an error-level log
    assert sorted(p.name for p in models.iterdir()) == ["junk.gguf"]


def test_unknown_output_type_is_a_clear_error(tiny_drafter_path: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown output tensor type 'Q2_K'; use one of Q4_0"):
        quantize(tiny_drafter_path, tmp_path / "x.gguf", "Q4_0", output_type="Q2_K")
