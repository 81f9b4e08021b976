"""The reference path in float32 on the CPU against an independent float64 Qwen2."""

from __future__ import annotations

import pytest
import torch
from torch_ref import qwen2_f64

from openjarvis.engine.torch.cache import KVCache
from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.model import Transformer
from openjarvis.engine.torch.weights import gguf_names, random_weights

TINY = ModelArgs("qwen2", n_layer=2, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, n_vocab=97,
                 rope_theta=10000.0)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture
def tiny() -> tuple[Transformer, torch.Tensor]:
    w = random_weights(TINY, torch.float32, "cpu", seed=1, scale=0.2)
    ref = qwen2_f64(TINY, gguf_names(w, TINY), list(range(3, 3 + 12)))
    return Transformer(TINY, w, n_pos=64), ref


def test_prefill_matches_float64(tiny: tuple[Transformer, torch.Tensor]) -> None:
    model, ref = tiny
    cache = KVCache(TINY, 32, torch.float32, "cpu")
    tokens = torch.arange(3, 15)
    out = model.forward(tokens, torch.arange(12), cache)
    assert out.shape == (12, TINY.n_vocab) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert rel(out, ref) < 1e-4


def test_decode_and_verify_steps_match_prefill(tiny: tuple[Transformer, torch.Tensor]) -> None:
    model, ref = tiny
    cache = KVCache(TINY, 32, torch.float32, "cpu")
    rows = [model.forward(torch.arange(3, 8), torch.arange(5), cache, kv_len=5)]
    for t in range(5, 8):  # one token at a time, attending over the whole (masked) cache
        rows.append(model.forward(torch.tensor([3 + t]), torch.tensor([t]), cache))
    rows.append(model.forward(torch.arange(11, 15), torch.arange(8, 12), cache))  # a k=4 verify
    assert rel(torch.cat(rows), ref) < 1e-4


def test_rollback_is_a_position_reset(tiny: tuple[Transformer, torch.Tensor]) -> None:
    model, ref = tiny
    cache = KVCache(TINY, 32, torch.float32, "cpu")
    model.forward(torch.arange(3, 10), torch.arange(7), cache)
    model.forward(torch.tensor([50, 60, 70]), torch.arange(7, 10), cache)  # rejected drafts
    out = model.forward(torch.arange(10, 15), torch.arange(7, 12), cache)  # back to 7
    assert rel(out, ref[7:]) < 1e-4


@pytest.mark.parametrize(
    "args",
    [
        ModelArgs("qwen2", 1, 896, 4864, 14, 2, 500, rope_theta=1e6),  # a 0.5B layer
        ModelArgs("qwen2", 1, 1536, 8960, 12, 2, 500, rope_theta=1e6),  # a 1.5B layer
    ],
    ids=["0.5B-layer", "1.5B-layer"],
)
def test_real_shapes_match_float64(args: ModelArgs) -> None:
    """One layer of each default-pair model (head_dim 64 and 128, GQA groups of 7 and 6)."""
    w = random_weights(args, torch.float32, "cpu", seed=2, scale=0.02)
    tokens = [5, 17, 250, 3, 499, 42]
    ref = qwen2_f64(args, gguf_names(w, args), tokens)
    cache = KVCache(args, 16, torch.float32, "cpu")
    model = Transformer(args, w, n_pos=64)
    out = torch.cat([
        model.forward(torch.tensor(tokens[:4]), torch.arange(4), cache, kv_len=4),
        model.forward(torch.tensor(tokens[4:]), torch.arange(4, 6), cache),
    ])
    assert rel(out, ref) < 1e-4
