"""Derive a cheaper model with llama.cpp's own quantizer (reachable through llama-cpp-python).

A drafter only has to guess the verifier's next tokens; a coarser quantization makes each of its
steps cheaper, which on memory-bound hardware is the whole cost. Whether that pays depends on
how much acceptance it loses, so ``jarvis models quantize`` produces candidates to measure
(see BENCHMARKS.md), and the catalog records what each was derived from.

Requantizing an already quantized file (the default pair ships as Q4_K_M) works, at a quality
cost beyond quantizing from F16; the catalog entry says so.

Example::

    result = quantize(Path("qwen-0.5b-q4_k_m.gguf"), Path("qwen-0.5b-q4_0.gguf"), "Q4_0")
    result.sha256, result.size
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from openjarvis.errors import EngineError

#: Type names as llama.cpp's ``llama-quantize`` spells them -> ``llama_ftype`` constant names.
TYPES: dict[str, str] = {
    "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "Q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "Q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "Q3_K_S": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    "Q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "Q3_K_L": "LLAMA_FTYPE_MOSTLY_Q3_K_L",
    "Q4_K_S": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "Q5_K_S": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
}


@dataclass(frozen=True, slots=True)
class Quantized:
    path: Path
    type: str
    size: int
    sha256: str
    source: Path
    source_sha256: str


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def quantize(src: Path, dst: Path, qtype: str, *, threads: int = 0) -> Quantized:
    """Write ``src`` quantized to ``qtype`` at ``dst`` (via a temporary file, then renamed)."""
    import llama_cpp

    name = qtype.upper()
    if name not in TYPES:
        raise EngineError(f"unknown quantization type {qtype!r}; use one of {', '.join(TYPES)}")
    if not src.is_file():
        raise EngineError(f"model file not found: {src}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TYPES[name])
    params.nthread = threads
    params.allow_requantize = True
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0 or not tmp.is_file():
            raise EngineError(f"llama.cpp could not quantize {src.name} to {name} (code {rc})")
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return Quantized(
        path=dst,
        type=name,
        size=dst.stat().st_size,
        sha256=_sha256(dst),
        source=src,
        source_sha256=_sha256(src),
    )
