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

#: Scalar value types: struct format (little-endian) by GGUF type id; 8 is a string, 9 an array
#: (their sizes: ``gguf_meta``'s walker).
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


def read_header(path: str | Path) -> tuple[dict[str, Any], list[RawTensor]]:
    """The scalar fields (with ``GGUF.version``, ``GGUF.tensor_count``, ``GGUF.kv_count`` as
    ``GGUFReader`` names them, and each array field's item count under ``KEY#count``) and the
    tensors, their data mapped from the file, not read. The fields are walked by
    ``gguf_meta.walk_fields``, the pair checks' walker."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from openjarvis.errors import ModelError
    from openjarvis.gguf_meta import walk_fields

    path = Path(path)
    try:
        with path.open("rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read GGUF file {path}: {exc}") from exc
    try:
        n_tensors, walked, pos = walk_fields(buf, path)
        (version,) = struct.unpack_from("<I", buf, 4)
        fields: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors,
                                  "GGUF.kv_count": len(walked)}
        for key, kind, tag, _ in walked:
            at = tag + 4
            if kind == _STRING:
                (n,) = struct.unpack_from("<Q", buf, at)
                fields[key] = buf[at + 8:at + 8 + n].decode("utf-8", errors="replace")
            elif kind == _ARRAY:
                fields[key + "#count"] = int(struct.unpack_from("<Q", buf, at + 4)[0])
            else:
                fields[key] = struct.unpack_from(_SCALARS[kind], buf, at)[0]
        table = []
        for _ in range(n_tensors):
            (n,) = struct.unpack_from("<Q", buf, pos)
            name = buf[pos + 8:pos + 8 + n].decode("utf-8", errors="replace")
            pos += 8 + n
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = list(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4))
            kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            table.append((name, dims, kind, offset))
    except ModelError as exc:
        raise EngineError(f"cannot read GGUF file {exc}; run `jarvis models verify`") from None
    except struct.error:
        raise EngineError(f"cannot read GGUF file {path}: it ends inside its header (its tensor "
                          "table); run `jarvis models verify`") from None
    align = int(fields.get("general.alignment", 32))
    start = -(-pos // align) * align
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
