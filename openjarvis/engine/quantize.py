"""Derive a cheaper model with llama.cpp's own quantizer (reachable through llama-cpp-python).

A drafter only has to guess the verifier's next tokens; a coarser quantization makes each of its
steps cheaper, which on memory-bound hardware is the whole cost. Whether that pays depends on
how much acceptance it loses, so ``jarvis models quantize`` produces candidates to measure
(see BENCHMARKS.md), and the catalog records what each was derived from.

Requantizing an already quantized file (the default pair ships as Q4_K_M) works, at a quality
cost beyond quantizing from F16; the catalog entry says so.

Two things decide what a type buys on a given model, and the result reports both
(``Quantized.tensor_bytes``):

- K-quants (Q2_K .. Q6_K) store rows in blocks of 256 values. Qwen2.5-0.5B's rows are 896 wide,
  so llama.cpp writes most of its tensors in a fallback type instead (Q4_0 for Q2_K and Q3_K_M,
  Q5_0 for Q4_K_S): asking for Q2_K gave a file 84 % of the original's size with no Q2_K tensor.
- ``output.weight`` (vocabulary x width, 30 % of the 0.5B's bytes and read on every step) keeps
  Q8_0 or Q6_K whatever the type, unless ``output_type`` names one (llama-quantize's
  ``--output-tensor-type``).

Example::

    result = quantize(Path("qwen-0.5b-q4_k_m.gguf"), Path("qwen-0.5b-q4_0.gguf"), "Q4_0")
    result.sha256, result.size, result.tensor_bytes  # {"Q4_0": ..., "Q8_0": ...}
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from openjarvis.errors import EngineError
from openjarvis.gguf_meta import tensor_types
from openjarvis.models import file_sha256

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

#: Types ``output.weight`` can be given (``output_type``) -> ``ggml_type`` constant names. K types
#: need rows that are a multiple of 256 values; on other widths llama.cpp falls back again.
OUTPUT_TYPES: dict[str, str] = {
    "Q4_0": "GGML_TYPE_Q4_0",
    "Q4_1": "GGML_TYPE_Q4_1",
    "Q5_0": "GGML_TYPE_Q5_0",
    "Q5_1": "GGML_TYPE_Q5_1",
    "Q8_0": "GGML_TYPE_Q8_0",
    "IQ4_NL": "GGML_TYPE_IQ4_NL",
    "Q4_K": "GGML_TYPE_Q4_K",
    "Q5_K": "GGML_TYPE_Q5_K",
    "Q6_K": "GGML_TYPE_Q6_K",
    "F16": "GGML_TYPE_F16",
}


@dataclass(frozen=True, slots=True)
class Quantized:
    """A derived model file and what llama.cpp actually wrote into it."""

    path: Path
    type: str
    size: int
    sha256: str
    source: Path
    source_sha256: str
    #: The type forced on ``output.weight``, or None for llama.cpp's choice.
    output_type: str | None = None
    #: Bytes of weight tensors (2-D and up) per tensor type, e.g. {"IQ4_NL": ..., "Q2_K": ...}.
    tensor_bytes: dict[str, int] = field(default_factory=dict)

    def share(self, tensor_type: str) -> float:
        """Fraction of the weight bytes stored as ``tensor_type``."""
        total = sum(self.tensor_bytes.values())
        return self.tensor_bytes.get(tensor_type, 0) / total if total else 0.0


def base_type(qtype: str) -> str:
    """The tensor type a file type is named after: Q3_K_M -> Q3_K, Q4_0 -> Q4_0."""
    name = qtype.upper()
    return name[: name.index("_K") + 2] if "_K" in name else name


def check_type(value: str, table: Mapping[str, str], what: str) -> str:
    """``value`` upper-cased if ``table`` knows it; else the one-line error naming the choices."""
    name = value.upper()
    if name not in table:
        raise EngineError(f"unknown {what} {value!r}; use one of {', '.join(table)}")
    return name


def quantize(
    src: Path,
    dst: Path,
    qtype: str,
    *,
    threads: int = 0,
    output_type: str | None = None,
    source_sha256: str | None = None,
) -> Quantized:
    """Write ``src`` quantized to ``qtype`` at ``dst`` (via a temporary file, then renamed).

    ``output_type`` overrides llama.cpp's choice for ``output.weight``. ``source_sha256``: the
    source's hash where it is already known (a catalog model's verified manifest), so a 1 GB
    source is not read a second time. llama.cpp's per-tensor log (300 lines for a 0.5B) is
    silenced; errors still reach stderr.
    """
    import llama_cpp

    from openjarvis.engine.llama import _quiet_llama_logs

    name = check_type(qtype, TYPES, "quantization type")
    out_name = check_type(output_type, OUTPUT_TYPES, "output tensor type") if output_type else None
    if not src.is_file():
        raise EngineError(f"model file not found: {src}")
    _quiet_llama_logs()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TYPES[name])
    params.nthread = threads
    params.allow_requantize = True
    if out_name is not None:
        params.output_tensor_type = getattr(llama_cpp, OUTPUT_TYPES[out_name])
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
        sha256=file_sha256(dst),
        source=src,
        source_sha256=source_sha256 or file_sha256(src),
        output_type=out_name,
        tensor_bytes=tensor_types(dst),
    )
