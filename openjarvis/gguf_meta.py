"""What a GGUF file says about itself: architecture, size, quantization, tokenizer identity.

Read with the ``gguf`` package (the reference reader from llama.cpp), never inferred from the file
name. The tokenizer fingerprint is what decides whether two models can pair for speculative
decoding: a drafter's token ids are fed to the verifier as-is, so both must map every id to the
same bytes, with the same merges and token types.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjarvis.errors import IncompatiblePair, ModelError

#: GGUF ``general.file_type`` values (llama.cpp's ``llama_ftype``) -> the usual quantization name.
FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
}

_FINGERPRINT_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
)


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    """The metadata of one GGUF file that the catalog and the engines care about."""

    path: Path
    architecture: str
    name: str
    parameters: int
    quantization: str
    context_length: int
    tokenizer_model: str
    tokenizer_pre: str
    n_vocab: int
    eos_token_id: int | None
    chat_template: bool
    fim: bool
    tokenizer_fingerprint: str


def _reader(path: Path) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(str(path), "r")
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise ModelError(f"{path}: not a readable GGUF file ({exc}); check the path") from exc


def _value(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def walk_fields(mm: Any, path: Path) -> tuple[int, list[tuple[str, int, int, int]], int]:
    """Walk a mapped GGUF's header fields with ``struct``: (tensor count, each field's (key,
    value type, offset of its type tag, end of its value), end of the fields).

    About 100x faster than building ``GGUFReader``'s per-string numpy views for a 150k-token
    vocabulary, which matters because every pair check (each ``jarvis models install``, each
    engine start) reads two tokenizers, and the torch engine reads every file it loads
    (``engine.torch.gguf_file``)."""
    import struct

    if mm[:4] != b"GGUF":
        raise ModelError(f"{path}: not a GGUF file (bad magic); check the path")
    try:
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
    except struct.error as exc:
        raise ModelError(f"{path}: truncated: it ends inside its header ({exc}); re-download or "
                         "reinstall it") from exc
    if version < 2:
        raise ModelError(f"{path}: GGUF version {version} is too old; re-convert the model")
    pos = 24
    fields: list[tuple[str, int, int, int]] = []

    def skip(tp: int, at: int) -> int:
        if tp in _SCALAR_SIZES:
            return at + _SCALAR_SIZES[tp]
        if tp == _STRING:
            return at + 8 + int(struct.unpack_from("<Q", mm, at)[0])
        if tp == _ARRAY:
            item, count = (int(v) for v in struct.unpack_from("<IQ", mm, at))
            at += 12
            if item in _SCALAR_SIZES:
                return at + count * _SCALAR_SIZES[item]
            for _ in range(count):
                at = skip(item, at)
            return at
        raise ModelError(f"{path}: unknown GGUF value type {tp}; the file may be corrupt")

    try:
        for _ in range(n_kv):
            klen = struct.unpack_from("<Q", mm, pos)[0]
            key = mm[pos + 8 : pos + 8 + klen].decode("utf-8", "replace")
            pos += 8 + klen
            tp = struct.unpack_from("<I", mm, pos)[0]
            end = skip(tp, pos + 4)
            if end > len(mm):
                raise struct.error(f"field {key} runs past the end")
            fields.append((key, tp, pos, end))
            pos = end
    except struct.error as exc:
        raise ModelError(f"{path}: truncated: it ends inside its header ({exc}); re-download or "
                         "reinstall it") from exc
    return int(n_tensors), fields, pos


def _raw_kv(path: Path) -> dict[str, bytes]:
    """Every metadata key of a GGUF mapped to the raw bytes of its value (type tag included)."""
    import mmap

    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        _, fields, _ = walk_fields(mm, path)
        return {key: mm[tag:end] for key, _, tag, end in fields}


def tokenizer_fingerprint(path: Path) -> str:
    """sha256 over the tokenizer's defining arrays; equal fingerprints mean identical vocabularies."""
    kv = _raw_kv(path)
    h = hashlib.sha256()
    for key in _FINGERPRINT_KEYS:
        h.update(key.encode())
        h.update(kv.get(key, b"\x00absent"))
        h.update(b"\x1f")
    return h.hexdigest()


def read_info(path: Path) -> GGUFInfo:
    """Read a GGUF's header; raises ``ModelError`` naming the file when it is not a GGUF."""
    reader = _reader(path)
    arch = str(_value(reader, "general.architecture") or "unknown")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    n_vocab = len(tokens.data) if tokens is not None else 0
    fim = False
    if tokens is not None:
        wanted = {b"<|fim_prefix|>", b"<|fim_suffix|>", b"<|fim_middle|>"}
        found = {bytes(tokens.parts[i]) for i in tokens.data if bytes(tokens.parts[i]) in wanted}
        fim = found == wanted or _value(reader, "tokenizer.ggml.fim_pre_token_id") is not None
    file_type = _value(reader, "general.file_type")
    parameters = sum(int(t.n_elements) for t in reader.tensors)
    eos = _value(reader, "tokenizer.ggml.eos_token_id")
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=str(_value(reader, "general.name") or path.stem),
        parameters=parameters,
        quantization=FILE_TYPES.get(int(file_type), f"type{file_type}") if file_type is not None else "unknown",
        context_length=int(_value(reader, f"{arch}.context_length") or 0),
        tokenizer_model=str(_value(reader, "tokenizer.ggml.model") or ""),
        tokenizer_pre=str(_value(reader, "tokenizer.ggml.pre") or ""),
        n_vocab=n_vocab,
        eos_token_id=int(eos) if eos is not None else None,
        chat_template=reader.get_field("tokenizer.chat_template") is not None,
        fim=fim,
        tokenizer_fingerprint=tokenizer_fingerprint(path),
    )


def tensor_type_names(path: Path) -> dict[str, str]:
    """GGML type name of every tensor in a GGUF file (read from the header only)."""
    return {t.name: t.tensor_type.name for t in _reader(path).tensors}


def tensor_types(path: Path) -> dict[str, int]:
    """Bytes per tensor type among the weight tensors (2-D and up), e.g. ``{"Q5_0": ..., "Q8_0": ...}``.

    What a file is labelled (``general.file_type``) need not be what it holds: the default
    drafter says Q4_K_M but is mostly Q5_0 and Q8_0, and what a step costs follows the bytes.
    """
    out: dict[str, int] = {}
    for t in _reader(path).tensors:
        if len(t.shape) >= 2 and int(t.shape[1]) > 1:
            name = t.tensor_type.name
            out[name] = out.get(name, 0) + int(t.n_bytes)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def check_pairable(drafter: Path, verifier: Path) -> None:
    """Raise ``IncompatiblePair`` unless both files carry the identical tokenizer."""
    if tokenizer_fingerprint(drafter) == tokenizer_fingerprint(verifier):
        return
    reason = _first_difference(_reader(drafter), _reader(verifier))
    raise IncompatiblePair(
        f"{drafter.name} and {verifier.name} cannot pair for speculative decoding: their tokenizers "
        f"differ ({reason}); choose a drafter from the same model family as the verifier"
    )


def _first_difference(a: Any, b: Any) -> str:
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        va, vb = _value(a, key), _value(b, key)
        if va != vb:
            return f"{key} is {va!r} vs {vb!r}"
    ta, tb = a.get_field("tokenizer.ggml.tokens"), b.get_field("tokenizer.ggml.tokens")
    if ta is None or tb is None:
        return "one of them has no tokenizer.ggml.tokens"
    if len(ta.data) != len(tb.data):
        return f"vocabulary sizes {len(ta.data)} vs {len(tb.data)}"
    for i, (ia, ib) in enumerate(zip(ta.data, tb.data, strict=True)):
        if bytes(ta.parts[ia]) != bytes(tb.parts[ib]):
            return f"token {i} is {bytes(ta.parts[ia])!r} vs {bytes(tb.parts[ib])!r}"
    return "token types or merges differ"
