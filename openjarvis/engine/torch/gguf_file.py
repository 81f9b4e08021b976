"""A GGUF file's header and tensor table, read without decoding the arrays it does not need.

``gguf.GGUFReader`` builds a numpy view for every element of every array field: the default
pair's tokenizer (151,936 tokens, 151,387 merges) costs it 10.7 s on a 2-core machine, most of
a torch engine's load once the blocks are decoded on the GPU (session 24, run 218). The torch
backend needs only the scalar fields, the vocabulary's size and the tensor table; llama.cpp
reads the tokenizer itself (``engine.Vocab``). Here the arrays are stepped over (a string
array's lengths are read, nothing else) and the tensors are views of one read-only map of the
file, shaped as ``GGUFReader`` shapes them so ``dequant.dequantize_tensor`` takes either.

Layout (GGUF version 2 and 3, little-endian): magic ``GGUF``, version u32, tensor count u64,
field count u64; each field a string key, a u32 type and its value (an array: item type u32,
count u64, items); each tensor a string name, u32 dimension count, u64 dimensions (fastest
first), u32 type, u64 offset from the data section, which starts at the next multiple of
``general.alignment`` (default 32) after the table. A string is a u64 length and its bytes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from openjarvis.errors import EngineError

#: Scalar value types: struct format (little-endian) by GGUF type id; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class RawTensor:
    """One tensor as ``gguf.GGUFReader`` gives it: ``shape`` fastest dimension first; ``data``
    float32 / float16 values, or for every other type its bytes as ``[rows, row bytes]``."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray
    data: np.ndarray


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise EngineError(f"cannot read GGUF file {self.path}: it ends inside its header "
                              f"(at byte {self.pos}); run `jarvis models verify`") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        end = self.pos + n
        if end > len(self.buf):
            raise EngineError(f"cannot read GGUF file {self.path}: it ends inside its header "
                              f"(a string at byte {self.pos}); run `jarvis models verify`")
        raw = self.buf[self.pos:end]
        self.pos = end
        return raw.decode("utf-8", errors="replace")

    def skip_array(self) -> int:
        """Step over an array's items; returns their count."""
        item, n = self.take("<I"), self.take("<Q")
        if item == _STRING:
            for _ in range(n):
                n_bytes = self.take("<Q")  # (not ``pos += take()``: take moves pos first)
                self.pos += n_bytes
        elif item == _ARRAY:
            for _ in range(n):
                self.skip_array()
        elif item in _SCALARS:
            self.pos += n * struct.calcsize(_SCALARS[item])
        else:
            raise EngineError(f"cannot read GGUF file {self.path}: array of unknown type {item}")
        if self.pos > len(self.buf):
            raise EngineError(f"cannot read GGUF file {self.path}: it ends inside its header "
                              f"(an array of {n} items); run `jarvis models verify`")
        return int(n)


def read_header(path: str | Path) -> tuple[dict[str, Any], list[RawTensor]]:
    """The scalar fields (with ``GGUF.version``, ``GGUF.tensor_count``, ``GGUF.kv_count`` as
    ``GGUFReader`` names them, and each array field's item count under ``KEY#count``) and the
    tensors, their data mapped from the file, not read."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        with path.open("rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read GGUF file {path}: {exc}") from exc
    c = _Cursor(buf, path)
    if buf[:4] != b"GGUF":
        raise EngineError(f"cannot read GGUF file {path}: not a GGUF file (no GGUF magic)")
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise EngineError(f"cannot read GGUF file {path}: GGUF version {version}; 2 and 3 are read")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    fields: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors,
                              "GGUF.kv_count": n_kv}
    for _ in range(n_kv):
        key, kind = c.string(), c.take("<I")
        if kind == _STRING:
            fields[key] = c.string()
        elif kind == _ARRAY:
            fields[key + "#count"] = c.skip_array()
        elif kind in _SCALARS:
            fields[key] = c.take(_SCALARS[kind])
        else:
            raise EngineError(f"cannot read GGUF file {path}: field {key} has unknown type {kind}")
    table = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.take("<Q") for _ in range(c.take("<I"))]
        kind, offset = c.take("<I"), c.take("<Q")
        table.append((name, dims, kind, offset))
    align = int(fields.get("general.alignment", 32))
    start = -(-c.pos // align) * align
    tensors = []
    for name, dims, kind, offset in table:
        try:
            qtype = GGMLQuantizationType(kind)
            block, size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise EngineError(f"cannot read GGUF file {path}: tensor {name} has unknown type "
                              f"{kind}") from None
        count = int(np.prod(dims)) if dims else 1
        nbytes = count // block * size
        at = start + offset
        if at + nbytes > len(buf):
            raise EngineError(f"cannot read GGUF file {path}: tensor {name} runs past the end "
                              f"of the file (truncated?); run `jarvis models verify`")
        if qtype == GGMLQuantizationType.F32 or qtype == GGMLQuantizationType.F16:
            dt = np.float32 if qtype == GGMLQuantizationType.F32 else np.float16
            data = np.frombuffer(buf, dtype=dt, count=count, offset=at).reshape(dims[::-1] or 1)
        else:
            row = dims[0] // block * size if dims else size
            data = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=at).reshape(-1, row)
        tensors.append(RawTensor(name, qtype, np.array(dims, dtype=np.uint64), data))
    return fields, tensors
