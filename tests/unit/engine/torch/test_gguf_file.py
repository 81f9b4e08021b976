"""The torch backend's own GGUF header reader against the gguf package's ``GGUFReader``: the
same scalar fields, array counts and tensors (names, types, shapes, bytes), and clear errors
for files that are not GGUF or end early."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from openjarvis.engine.torch.gguf_file import read_header
from openjarvis.errors import EngineError


def _write(path: Path, alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(path, "qwen2")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1e-6)
    w.add_bool("t.bool", True)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1.0 / 3.0)
    w.add_string("t.str", "héllo")
    w.add_array("tokenizer.ggml.tokens", ["a", "bé", "", "<|im_end|>"])
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    w.add_tensor("f32.weight", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("vec", rng.standard_normal(64).astype(np.float32))
    raw = rng.integers(0, 256, (4, 2 * 144), dtype=np.uint8)  # 4 rows of 512 in Q4_K
    w.add_tensor("q4k.weight", raw, raw_dtype=Q.Q4_K)
    raw8 = rng.integers(0, 256, (2, 34), dtype=np.uint8)  # 2 rows of 32 in Q8_0
    w.add_tensor("q8.weight", raw8, raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_fields_and_tensors_are_what_gguf_reader_reads(tmp_path: Path, alignment: int | None) -> None:
    path = _write(tmp_path / "t.gguf", alignment)
    fields, tensors = read_header(path)
    ref = gguf.GGUFReader(path)
    scalars = {k: f.contents() for k, f in ref.fields.items() if f.types[0] != gguf.GGUFValueType.ARRAY}
    assert {k: v for k, v in fields.items() if not k.endswith("#count")} == scalars
    assert fields["tokenizer.ggml.tokens#count"] == 4 and fields["t.ints#count"] == 3
    assert fields["t.nested#count"] == 2 and fields["t.str"] == "héllo"
    assert [t.name for t in tensors] == [t.name for t in ref.tensors]
    for ours, theirs in zip(tensors, ref.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type
        assert ours.shape.tolist() == theirs.shape.tolist()
        assert ours.data.shape == theirs.data.shape and ours.data.dtype == theirs.data.dtype
        assert np.array_equal(ours.data.view(np.uint8), np.asarray(theirs.data).view(np.uint8))


def test_a_file_that_is_not_gguf_or_ends_early_is_refused_by_name(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.gguf")
    data = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(EngineError, match="not a GGUF file"):
        read_header(bad)
    # in the fields, in the tokens' array, in the tensor table, in the last tensor's bytes
    for cut in (30, 200, 420, len(data) - 100):
        bad.write_bytes(data[:cut])
        with pytest.raises(EngineError, match=r"bad\.gguf.*(ends inside its header|runs past the end)"):
            read_header(bad)
    with pytest.raises(EngineError, match="cannot read GGUF file"):
        read_header(tmp_path / "missing.gguf")
