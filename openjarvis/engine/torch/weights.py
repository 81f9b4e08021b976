"""GGUF tensors -> dequantized torch tensors, packed the way the forward pass reads them.

llama.cpp's GGUF names (``blk.{i}.attn_q.weight`` ...) are the one vocabulary here: the benchmark's
random and Hugging Face weights are renamed into it before packing. Quantized tensors are
decoded on the device that will hold them (``dequant.py``: torch ops, bit-identical to the gguf
package's reference decoders for F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q5_K, Q6_K; every other type
the gguf package knows through its decoder on the host), then cast to the run dtype.

Qwen2 Q/K rows are stored in Hugging Face order (NeoX RoPE: pairs ``(i, i + head_dim/2)``);
llama.cpp permutes Q/K rows only for the ``llama`` architecture, which this backend does not load.

Packing (per layer, shapes ``[out, in]`` as ``nn.Linear``):
    wqkv [qkv_dim, D] = cat(q, k, v);  bqkv [qkv_dim]
    wo   [D, q_dim]
    w13  [2 * n_ff, D] = cat(gate, up)
    w2   [D, n_ff]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from openjarvis.engine.torch.config import ModelArgs
from openjarvis.errors import EngineError


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor  # [D]
    wqkv: torch.Tensor  # [qkv_dim, D]
    bqkv: torch.Tensor  # [qkv_dim]
    wo: torch.Tensor  # [D, q_dim]
    ffn_norm: torch.Tensor  # [D]
    w13: torch.Tensor  # [2F, D]
    w2: torch.Tensor  # [D, F]


@dataclass(slots=True)
class Weights:
    tok_emb: torch.Tensor  # [V, D]
    layers: list[LayerWeights]
    out_norm: torch.Tensor  # [D]
    out: torch.Tensor  # [V, D]; the same storage as tok_emb when tied

    def nbytes(self) -> int:
        """Bytes one decode step reads: every matrix once. The output projection reads all of
        ``out``; the embedding lookup one row of ``tok_emb`` (noise), so an untied ``tok_emb``
        is left out, but a tied one is ``out`` and counts. (Before session 7 a tied ``out``
        was left out with it: every floor in BENCHMARKS.md up to then lacks the output matrix.)"""
        seen: set[int] = set()
        total = 0
        for t in self.tensors():
            if t is self.tok_emb and self.out is not self.tok_emb:
                continue
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor, the embedding and the output matrix first (once each where tied)."""
        yield self.tok_emb
        yield self.out_norm
        yield self.out
        for lw in self.layers:
            yield from (lw.attn_norm, lw.wqkv, lw.bqkv, lw.wo, lw.ffn_norm, lw.w13, lw.w2)


def _open(path: str | Path) -> tuple[dict[str, Any], list[Any]]:
    """The file's fields and tensor table (``gguf_file``: the tokenizer's arrays stepped over,
    the tensors mapped, not read)."""
    from openjarvis.engine.torch.gguf_file import read_header

    return read_header(path)


def _metadata(fields: dict[str, Any], tensors: list[Any]) -> dict[str, Any]:
    """Scalars, with ``n_vocab`` (the tokenizer's size) and ``tied_embeddings`` added."""
    meta = {k: v for k, v in fields.items()
            if not k.endswith("#count") and (not k.startswith("tokenizer.ggml.")
                                             or k == "tokenizer.ggml.model")}
    if "tokenizer.ggml.tokens#count" in fields:
        meta["n_vocab"] = fields["tokenizer.ggml.tokens#count"]
    names = {t.name: t for t in tensors}
    meta["tied_embeddings"] = "output.weight" not in names
    if "token_embd.weight" in names:
        meta.setdefault("n_vocab", int(names["token_embd.weight"].shape[-1]))
    return meta


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Metadata (scalars; ``n_vocab`` and ``tied_embeddings`` added) and float32 arrays by name
    (every tensor decoded on the CPU; ``load_gguf`` decodes one at a time where it runs)."""
    from openjarvis.engine.torch.dequant import dequantize_tensor

    fields, table = _open(path)
    tensors = {t.name: dequantize_tensor(t, "cpu").numpy() for t in table}
    return _metadata(fields, table), tensors


def pack(
    args: ModelArgs,
    get: Callable[[str], torch.Tensor],
    dtype: torch.dtype,
    device: torch.device | str,
) -> Weights:
    """Pack GGUF-named tensors (``get(name)`` -> float tensor) into fused ``Weights``."""

    def w(name: str) -> torch.Tensor:
        return get(name).to(device=device, dtype=dtype).contiguous()

    layers = []
    for i in range(args.n_layer):
        p = f"blk.{i}."
        qkv = [get(p + f"attn_{x}.weight") for x in "qkv"]
        if args.qkv_bias:
            bias = torch.cat([get(p + f"attn_{x}.bias") for x in "qkv"])
        else:
            bias = torch.zeros(args.qkv_dim)
        layers.append(
            LayerWeights(
                attn_norm=w(p + "attn_norm.weight"),
                wqkv=torch.cat(qkv).to(device=device, dtype=dtype).contiguous(),
                bqkv=bias.to(device=device, dtype=dtype).contiguous(),
                wo=w(p + "attn_output.weight"),
                ffn_norm=w(p + "ffn_norm.weight"),
                w13=torch.cat([get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")])
                .to(device=device, dtype=dtype)
                .contiguous(),
                w2=w(p + "ffn_down.weight"),
            )
        )
        _check_layer(args, layers[-1], i)
    tok_emb = w("token_embd.weight")
    out = tok_emb if args.tied_embeddings else w("output.weight")
    if tok_emb.shape != (args.n_vocab, args.n_embd) or out.shape != tok_emb.shape:
        raise EngineError(f"embedding shape {tuple(tok_emb.shape)} does not match the metadata")
    return Weights(tok_emb=tok_emb, layers=layers, out_norm=w("output_norm.weight"), out=out)


def _check_layer(args: ModelArgs, lw: LayerWeights, i: int) -> None:
    d, f = args.n_embd, args.n_ff
    want = {
        "wqkv": (args.qkv_dim, d),
        "bqkv": (args.qkv_dim,),
        "wo": (d, args.q_dim),
        "w13": (2 * f, d),
        "w2": (d, f),
        "attn_norm": (d,),
        "ffn_norm": (d,),
    }
    for name, shape in want.items():
        got = tuple(getattr(lw, name).shape)
        if got != shape:
            raise EngineError(f"layer {i} {name} has shape {got}, metadata implies {shape}")


def load_gguf(
    path: str | Path, dtype: torch.dtype, device: torch.device | str
) -> tuple[ModelArgs, Weights, dict[str, Any]]:
    """Read, dequantize and pack a GGUF file; returns (args, weights, metadata)."""
    from openjarvis.engine.torch.dequant import dequantize_tensor

    fields, table = _open(path)
    meta = _metadata(fields, table)
    try:
        args = ModelArgs.from_metadata(meta)
    except (KeyError, ValueError) as exc:
        raise EngineError(f"unsupported GGUF model {path}: {exc}") from exc
    raw = {t.name: t for t in table}
    try:
        # each tensor's bytes decoded on ``device`` into ``dtype`` as packing asks for it: no
        # float32 copy of the whole model on the host, nor of a whole quantized tensor on the
        # device (types without a decoder there go through float32 on the host; ``dequant.py``)
        weights = pack(args, lambda n: dequantize_tensor(raw[n], device, dtype), dtype, device)
    except KeyError as exc:
        raise EngineError(f"GGUF file {path} lacks tensor {exc}") from exc
    return args, weights, meta


def random_weights(
    args: ModelArgs,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
    scale: float = 0.02,
) -> Weights:
    """Random non-zero weights of a model's shapes (benchmarks, tests): N(0, scale), norms ~1."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, mean: float = 0.0, std: float = scale) -> torch.Tensor:
        t = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
        return (t.mul_(std).add_(mean)).to(dtype)

    d, f = args.n_embd, args.n_ff
    layers = [
        LayerWeights(
            attn_norm=rnd(d, mean=1.0, std=0.1),
            wqkv=rnd(args.qkv_dim, d),
            bqkv=rnd(args.qkv_dim, std=0.1),
            wo=rnd(d, args.q_dim),
            ffn_norm=rnd(d, mean=1.0, std=0.1),
            w13=rnd(2 * f, d),
            w2=rnd(d, f),
        )
        for _ in range(args.n_layer)
    ]
    tok_emb = rnd(args.n_vocab, d)
    return Weights(tok_emb, layers, rnd(d, mean=1.0, std=0.1), tok_emb)


def cast(weights: Weights, dtype: torch.dtype) -> Weights:
    """The same weights in another dtype (a float32 reference of bf16 weights is exact)."""
    layers = [
        LayerWeights(*(getattr(lw, f.name).to(dtype) for f in dataclasses.fields(LayerWeights)))
        for lw in weights.layers
    ]
    emb = weights.tok_emb.to(dtype)
    tied = weights.out.data_ptr() == weights.tok_emb.data_ptr()
    return Weights(emb, layers, weights.out_norm.to(dtype), emb if tied else weights.out.to(dtype))


def gguf_names(
    weights: Weights, args: ModelArgs
) -> Mapping[str, torch.Tensor]:  # pragma: no cover - used by tests and benchmarks
    """The inverse of :func:`pack`: GGUF names -> tensors (views into ``weights``)."""
    out: dict[str, torch.Tensor] = {
        "token_embd.weight": weights.tok_emb,
        "output_norm.weight": weights.out_norm,
    }
    if not args.tied_embeddings:
        out["output.weight"] = weights.out
    q, kv, f = args.q_dim, args.kv_dim, args.n_ff
    for i, lw in enumerate(weights.layers):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = lw.attn_norm
        out[p + "ffn_norm.weight"] = lw.ffn_norm
        for x, lo, hi in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)):
            out[p + f"attn_{x}.weight"] = lw.wqkv[lo:hi]
            out[p + f"attn_{x}.bias"] = lw.bqkv[lo:hi]
        out[p + "attn_output.weight"] = lw.wo
        out[p + "ffn_gate.weight"], out[p + "ffn_up.weight"] = lw.w13[:f], lw.w13[f:]
        out[p + "ffn_down.weight"] = lw.w2
    return out
