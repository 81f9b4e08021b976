"""scripts/agree_torch_llama.py: the comparison it reports and the llama.cpp roundings it emulates.

The script's figures (BENCHMARKS.md, issue 7) rest on these: ``compare`` counting what it says,
the Q8 activation roundings being ggml's, and the emulation reaching the forward pass and being
undone afterwards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the gpu extra (torch) is not installed")

from agree_torch_llama import _round_q8_0, _round_q8_k, compare, emulating  # noqa: E402

pytestmark = pytest.mark.gpu


def test_compare_counts_agreement_overlap_and_gaps() -> None:
    ref = np.array([[5.0, 4.9, 1.0, 0.0, -1.0, -2.0, -3.0],  # near-tie of tokens 0 and 1
                    [0.0, 1.0, 9.0, 2.0, 3.0, 4.0, 5.0]], dtype=np.float32)
    ours = ref.copy()
    ours[0, 1] = 5.2  # flips the near-tie: top-1 differs, same top-5
    s = compare(ours, ref)
    assert s.agree.tolist() == [False, True]
    assert s.top5.tolist() == [5, 5]
    assert s.gap == pytest.approx([0.1, 4.0], abs=1e-6)
    assert s.pair_err == pytest.approx([0.3, 0.0], abs=1e-6)  # 5.0 - 5.2 against 5.0 - 4.9
    summary = s.summary()
    assert (summary["positions"], summary["disagree"], summary["top1"]) == (2, 1, 0.5)
    assert summary["rel_err"] == pytest.approx(0.3 / np.linalg.norm(ref), rel=1e-6)
    assert summary["disagree_gap_below"]["0.25"] == 1.0
    assert (summary["first_disagree"], summary["rest_top1"], summary["rest_rel_err"]) == (1, 1.0, 0.0)


def test_q8_0_rounding_is_ggml_reference() -> None:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    want = dequantize(quantize(x, Q.Q8_0), Q.Q8_0)
    assert np.array_equal(_round_q8_0(torch.from_numpy(x)).numpy(), want)


def test_q8_k_rounding_keeps_each_block_max_and_half_a_step() -> None:
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1))
    y = _round_q8_k(x)
    blocks, yb = x.view(3, 2, 256), y.view(3, 2, 256)
    step = blocks.abs().amax(-1, keepdim=True) / 127  # [3, 2, 1]
    idx = blocks.abs().argmax(-1, keepdim=True)
    assert torch.allclose(yb.gather(-1, idx), blocks.gather(-1, idx), rtol=1e-6)
    assert ((yb - blocks).abs() <= step / 2 * (1 + 1e-5)).all()
    assert not torch.equal(y, x)


def test_emulation_reaches_the_forward_and_is_undone(tiny_verifier_path: Path) -> None:
    from openjarvis.engine.torch.engine import TorchEngine

    with TorchEngine.from_gguf(tiny_verifier_path, device="cpu", context=64) as engine:
        tokens = engine.tokenize("def add(a, b):\n    return a + b\n")

        def run(mode: str, types: dict[str, str]) -> np.ndarray:
            engine.rollback(0)
            with emulating(engine, types, mode):
                return engine.eval(tokens)

        names = ["output.weight", "token_embd.weight"] + [
            f"blk.{i}.{n}.weight" for i in range(engine.args.n_layer)
            for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        ]
        plain = run("plain", {})
        f32 = dict.fromkeys(names, "F32")
        assert np.array_equal(run("q8", f32), plain)  # float32 weights: llama.cpp rounds nothing
        q8 = run("q8", dict.fromkeys(names, "Q8_0"))
        both = run("q8+f16", dict.fromkeys(names, "Q8_0"))
        for emulated in (q8, both):
            rel = np.linalg.norm(emulated - plain) / np.linalg.norm(plain)
            assert 1e-5 < rel < 0.1
        assert not np.array_equal(q8, both)
        assert np.array_equal(run("plain", {}), plain)  # tensors put back
