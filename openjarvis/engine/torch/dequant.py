"""GGUF quantized blocks decoded with torch ops, on whatever device holds the bytes.

``gguf.quants.dequantize`` (numpy, one core) and the packing after it took 10-14 s of the
1.5B's load on the GPU host (session 24, run 218) and held the whole model in float32 on the host
(7 GB for the 1.5B) before the copy to the GPU. Here each tensor's raw bytes go to the device
and are decoded there, ``CHUNK`` elements at a time straight into a tensor of the model's dtype
(until session 25 a whole tensor went through float32 at about 10 bytes an element: 2.3 GB
for the 1.5B's 233M-element embedding), by the same arithmetic as the gguf package's
decoders (each step the same float32 operation, so the values are bit-identical to its;
``tests/unit/engine/torch/test_torch_weights.py`` compares every type). Types without a decoder
here (Q4_0, Q5_1, Q2_K, Q3_K, the IQ types...) fall back to the gguf package on the host.

Block layouts (ggml-common.h), bytes: Q8_0 34 (f16 d, 32 int8); Q5_0 22 (f16 d, 4 bytes of high
bits, 16 bytes of nibbles); Q4_K 144 (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128
bytes of nibbles); Q5_K 176 (as Q4_K, then 32 bytes of high bits); Q6_K 210 (128 bytes of low
nibbles, 64 of high 2-bit pairs, 16 int8 scales, f16 d).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

QK_K = 256
#: Elements decoded at a time (through float32 and the decoders' temporaries, ~10 bytes each):
#: 16M bounds that to ~160 MB beside the tensor's bytes and its output, and is large enough
#: that the launches of a chunk's few dozen ops cost nothing against its work.
CHUNK = 1 << 24


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] little-endian bytes -> [n, 1] float32."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """[..., m] bytes -> [..., 2, m]: the low nibbles, then the high ones."""
    return torch.stack([b & 0x0F, b >> 4], dim=-2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks[:, :2])


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = _f16(blocks[:, :2])
    qh = blocks[:, 2:6].contiguous().view(torch.int32)  # [n, 1]: bit j is quant j's fifth bit
    shifts = torch.arange(32, dtype=torch.int32, device=blocks.device)
    high = ((qh >> shifts) & 1).to(torch.uint8)  # (an arithmetic shift: & 1 keeps bit j alone)
    low = _nibbles(blocks[:, 6:]).reshape(n, 32)
    return d * ((low | (high << 4)).float() - 16.0)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins a block."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    d = (_f16(blocks[:, 0:2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(blocks[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    q = _nibbles(blocks[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    d = (_f16(blocks[:, 0:2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(blocks[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    qh = blocks[:, 16:48].reshape(n, 1, 32)
    high = torch.stack([(qh >> i) & 1 for i in range(8)], dim=-2).reshape(n, 8, 32)
    low = _nibbles(blocks[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    return (d * (low | (high << 4)).float() - dm).reshape(n, QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(blocks[:, 208:210]) * scales).reshape(n, QK_K // 16, 1)
    low = _nibbles(blocks[:, :128].reshape(n, 2, 64)).reshape(n, 8, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    high = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=-2).reshape(n, 8, 32)
    q = ((low | (high << 4)).float() - 32.0).reshape(n, QK_K // 16, 16)
    return (d * q).reshape(n, QK_K)


def _bf16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.bfloat16).float()


@functools.cache
def _decoders() -> dict[Any, Callable[[torch.Tensor], torch.Tensor]]:
    """GGML type -> decoder of its blocks (their sizes: ``gguf.GGML_QUANT_SIZES``)."""
    from gguf import GGMLQuantizationType as Q

    return {Q.Q8_0: _q8_0, Q.Q5_0: _q5_0, Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k,
            Q.BF16: _bf16}


def dequantize_tensor(t: Any, device: torch.device | str,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor of ``gguf_file.read_header`` (or ``gguf.GGUFReader``, shaped alike) as ``dtype``
    on ``device``, shaped ``[rows, cols]`` (or its own shape, slowest dimension first): decoded
    there, ``CHUNK`` elements at a time, where a decoder here knows its type (other types on the
    host, whole). Each value is the gguf package's float32 value rounded once to ``dtype``."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    shape = tuple(int(s) for s in reversed(t.shape.tolist()))  # ne is fastest-first
    if t.tensor_type in (Q.F32, Q.F16):  # (float16 to bf16 goes through float32: the same bits)
        return torch.from_numpy(np.array(t.data)).to(dtype).to(device).reshape(shape)
    decode = _decoders().get(t.tensor_type)
    if decode is None:  # the gguf package's decoder on the host, rounded there before the copy
        host = torch.from_numpy(dequantize(np.asarray(t.data), t.tensor_type))
        return host.to(dtype).to(device).reshape(shape)
    per_block, size = GGML_QUANT_SIZES[t.tensor_type]  # (elements, bytes) a block
    raw = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(-1, size)).to(device)
    out = torch.empty(raw.shape[0] * per_block, dtype=dtype, device=device)
    step = max(1, CHUNK // per_block)  # blocks a chunk
    for b in range(0, raw.shape[0], step):
        out[b * per_block : (b + step) * per_block] = decode(raw[b : b + step]).reshape(-1)
    return out.reshape(shape)
