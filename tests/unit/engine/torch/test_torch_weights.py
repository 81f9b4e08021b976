"""GGUF reading and dequantization, per tensor type, against the gguf package's reference."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from openjarvis.engine.torch.weights import read_gguf

ROWS, COLS = 6, 512  # COLS: a multiple of every block size (32, 256)
#: max |x - dequantize(quantize(x))| / max |x| for types the gguf package can quantize.
QUANT_ERROR = {Q.F16: 1e-3, Q.BF16: 8e-3, Q.Q8_0: 1e-2, Q.Q5_0: 7e-2, Q.Q4_0: 0.15}
#: K-quant block layouts: byte offsets of the float16 scales in each block.
K_SCALES = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def _raw(qtype: Q, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """(bytes [ROWS, row_bytes], the float data they quantize, or None for random blocks)."""
    data = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    if qtype in K_SCALES:  # no quantizer in gguf: random blocks with sane float16 scales
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (ROWS * COLS // block, size), dtype=np.uint8)
        for off in K_SCALES[qtype]:
            raw[:, off : off + 2] = (
                rng.uniform(0.001, 0.05, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
            )
        return raw.reshape(ROWS, -1), None
    return quantize(data, qtype), data


@pytest.mark.parametrize(
    "qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name
)
def test_read_gguf_dequantizes_like_the_reference(qtype: Q, tmp_path: Path) -> None:
    rng = np.random.default_rng(int(qtype))
    raw, data = _raw(qtype, rng)
    f32 = rng.standard_normal(COLS).astype(np.float32)
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_uint32("qwen2.block_count", 0)
    w.add_tensor("m.weight", raw, raw_dtype=qtype)
    w.add_tensor("v.weight", f32)  # an F32 vector, read without a decoder
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    meta, tensors = read_gguf(path)
    assert meta["qwen2.block_count"] == 0
    got = tensors["m.weight"]
    assert got.shape == (ROWS, COLS) and got.dtype == np.float32 and got.flags.writeable
    ref = dequantize(raw, qtype).reshape(ROWS, COLS)
    np.testing.assert_array_equal(got, ref)
    assert np.isfinite(got).all() and np.abs(got).max() > 0
    if data is not None:
        err = np.abs(got - data).max() / np.abs(data).max()
        assert err < QUANT_ERROR[qtype]
    np.testing.assert_array_equal(tensors["v.weight"], f32)


@pytest.mark.parametrize(
    "qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name
)
def test_a_tensor_decodes_in_chunks_into_the_models_dtype(
    qtype: Q, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's load decodes a tensor a chunk at a time straight into bf16 (no float32 copy of
    a whole tensor): each value the reference's float32 rounded once, whatever the chunk (here
    one of 300 elements: blocks of 32 and 256 end in the middle of rows)."""
    import torch

    from openjarvis.engine.torch import dequant
    from openjarvis.engine.torch.gguf_file import read_header

    raw, _ = _raw(qtype, np.random.default_rng(int(qtype)))
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_tensor("m.weight", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = torch.from_numpy(dequantize(raw, qtype).reshape(ROWS, COLS)).to(torch.bfloat16)
    (t,) = read_header(path)[1]
    whole = dequant.dequantize_tensor(t, "cpu", torch.bfloat16)
    monkeypatch.setattr(dequant, "CHUNK", 300)
    got = dequant.dequantize_tensor(t, "cpu", torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (ROWS, COLS)
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))
    assert torch.equal(whole.view(torch.int16), ref.view(torch.int16))


def test_q8_0_block_layout_by_hand(tmp_path: Path) -> None:
    """One Q8_0 block decoded from its definition: value = float16 scale * int8 quant."""
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([np.array([0.5], np.float16).view(np.uint8), q.view(np.uint8)])
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_tensor("m.weight", block[None, :], raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _, tensors = read_gguf(path)
    np.testing.assert_array_equal(tensors["m.weight"], 0.5 * q.astype(np.float32)[None, :])


@pytest.mark.parametrize("tied", [True, False])
def test_step_bytes_count_the_output_matrix_once_tied_or_not(tied: bool) -> None:
    """The bandwidth floor's numerator: a step reads every layer matrix and the whole output
    matrix, but only one row of an untied embedding. A tied output matrix is the embedding
    and is read whole; leaving it out (as before session 7) understated every floor."""
    import dataclasses

    import torch

    from openjarvis.engine.torch.config import ModelArgs
    from openjarvis.engine.torch.weights import random_weights

    a = ModelArgs("qwen2", 2, 64, 96, 4, 2, 300)
    w = random_weights(a, torch.bfloat16, "cpu", seed=0)
    if not tied:
        w = dataclasses.replace(w, out=w.tok_emb.clone())
    layer = (a.qkv_dim * 64 + a.qkv_dim + 64 * a.q_dim + 2 * 96 * 64 + 64 * 96 + 2 * 64) * 2
    assert w.nbytes() == a.n_layer * layer + (300 * 64 + 64) * 2
