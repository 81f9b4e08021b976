"""The Triton kernels in Triton's interpreter (CPU) against the plain-torch reference."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton sees any @jit: run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed")

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.cache import KVCache  # noqa: E402
from openjarvis.engine.torch.config import ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import (  # noqa: E402
    DEFAULT_ONE_TOKEN_PDL,
    DEFAULT_PDL_BY_T,
    MAX_STEP,
    Runner,
    Workspace,
)
from openjarvis.engine.torch.model import Transformer, apply_rope, rms_norm, rope_table  # noqa: E402
from openjarvis.engine.torch.weights import random_weights  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 at import"
)

ARGS = ModelArgs("qwen2", n_layer=2, n_embd=128, n_ff=160, n_head=4, n_head_kv=2, n_vocab=101,
                 rope_theta=10000.0)
POISON = float("nan")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def g(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _model() -> Transformer:
    """The small model the Runner tests step through: float32, random weights (seed 3)."""
    return Transformer(ARGS, random_weights(ARGS, torch.float32, "cpu", seed=3, scale=0.1),
                       n_pos=128)


def _seq_and_ref(model: Transformer, n: int, seed: int) -> tuple[list[int], torch.Tensor]:
    """``n`` random tokens and the reference forward's logits for them from position 0."""
    gen = torch.Generator().manual_seed(seed)
    seq = [int(x) for x in torch.randint(0, ARGS.n_vocab, (n,), generator=gen)]
    ref = model.forward(torch.tensor(seq), torch.arange(n), KVCache(ARGS, 64, torch.float32, "cpu"))
    return seq, ref


#: (PDL mode, swapped operands): 3 and 7 run the code PDL modes 2 and 6 run in the unswapped
#: kernel (the first weight tile before the wait), without PDL itself, which the interpreter
#: lacks; the swapped kernel takes any mode and waits first.
@pytest.mark.parametrize(("peel", "swap"), [(0, False), (3, False), (7, False), (0, True),
                                            (3, True)])
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("mode", [K.STORE, K.ADD, K.SWIGLU])
def test_linear_modes(t: int, mode: int, peel: int, swap: bool) -> None:
    n, k = 40, 72  # not multiples of the tiles: the masks matter
    x, w = g(t, k, seed=1), g(2 * n if mode == K.SWIGLU else n, k, seed=2)
    norm, bias = g(k, seed=3) + 1, g(n, seed=4)
    h0 = g(t, n, seed=5)
    out = h0.clone() if mode == K.ADD else torch.full((t, n), POISON)
    cfg = K.LinearConfig(block_n=8 if t == 1 else 16, block_k=32, swap=swap)
    use_bias = bias if mode == K.STORE else None
    K.linear(x, w, out, mode=mode, norm=norm, bias=use_bias, eps=1e-6, cfg=cfg, pdl=peel)
    y = rms_norm(x, norm, 1e-6) @ w.T
    if mode == K.STORE:
        ref = y + bias
    elif mode == K.ADD:
        ref = h0 + y
    else:
        gate, up = y.split(n, dim=-1)
        ref = torch.nn.functional.silu(gate) * up
    assert not out.isnan().any()
    assert rel(out, ref) < 1e-5


@pytest.mark.parametrize(("t", "bn", "swap"), [(1, 8, False), (3, 16, False), (9, 16, True)])
def test_a_greedy_output_projection_gives_the_argmax_without_writing_logits(
        t: int, bn: int, swap: bool) -> None:
    n, k = 203, 72  # 26 or 13 programs, the last one partly masked
    x, w, norm = g(t, k, seed=1), g(n, k, seed=2), g(k, seed=3) + 1
    w[150] = w[40]  # token 0's maximum twice, in different programs: the first column wins
    w[41] = w[40]  # and twice in one program
    x[0] = w[40] * 10
    cfg = K.LinearConfig(block_n=bn, block_k=32, swap=swap)
    part = K.argmax_partials(t, n, cfg, "cpu").fill_(POISON)
    K.linear(x, w, part, mode=K.ARGMAX, norm=norm, eps=1e-6, cfg=cfg)
    assert not part.isnan().any()  # every program wrote its pair for every token
    ids = K.argmax_merge(part, torch.full((t,), -1, dtype=torch.int64))
    logits = rms_norm(x, norm, 1e-6) @ w.T
    assert logits[0, 40] == logits[0, 150] == logits[0, 41] == logits[0].max()
    assert ids.tolist() == logits.argmax(-1).tolist() and ids[0] == 40


def test_the_argmax_merge_takes_the_first_largest_across_chunks() -> None:
    """More programs than one chunk of the merge (2048): equal maxima in different chunks."""
    n_prog = 5000
    vals = g(2, n_prog, seed=7)
    vals[0, 3000] = vals[0, 4500] = 9.0  # token 0: first in the second chunk
    vals[1, 10] = vals[1, 4999] = 9.0  # token 1: first in the first chunk
    part = torch.stack([vals, torch.arange(n_prog).float().expand(2, -1) * 3], -1).reshape(2, -1)
    ids = K.argmax_merge(part.contiguous(), torch.zeros(2, dtype=torch.int64))
    assert ids.tolist() == [9000, 30]


def test_an_argmax_it_cannot_write_is_refused_with_the_reason() -> None:
    x, w = g(1, 72, seed=1), g(40, 72, seed=2)
    cfg = K.LinearConfig(block_n=8, block_k=32)
    with pytest.raises(ValueError, match=r"float32 partials \[1, 10\]"):
        K.linear(x, w, torch.empty(1, 40), mode=K.ARGMAX, cfg=cfg)
    with pytest.raises(ValueError, match="int64 ids"):
        K.argmax_merge(K.argmax_partials(1, 40, cfg, "cpu"), torch.zeros(1, dtype=torch.int32))


def test_the_int8_screen_bounds_every_logit_of_the_rows_it_was_made_from() -> None:
    w, x = g(300, 72, seed=2) * 0.1, g(50, 72, seed=1) * 3
    w[7] = 0.0  # a row of zeros: scale at its floor, no error
    scr = K.screen_weights(w, rows_at_once=64)  # (several slices)
    assert scr.q.dtype == torch.int8 and scr.q.abs().max() == 127
    exact = x.double() @ w.double().T
    approx = (x.double() @ scr.q.double().T) * scr.scale.double()
    bound = x.double().norm(dim=1, keepdim=True) * scr.err.double()
    assert ((exact - approx).abs() <= bound).all()
    assert (exact[:, 7] == approx[:, 7]).all()
    assert float(((exact - approx).abs() / bound)[:, 8:].max()) > 0.05  # not a wild bound
    assert scr.nbytes == 300 * 72 + 2 * 300 * 4


@pytest.mark.parametrize(("t", "bn", "rows", "at_once", "near_first", "imma", "scale"),
                         [(1, 8, 16, 2, False, 0, 1.0), (1, 32, 1024, 2, True, 0, 1.0),
                          (3, 16, 32, 4, False, 0, 1.0), (17, 32, 64, 2, True, 0, 1.0),
                          (1, 64, 16, 2, False, 2, 1.0), (3, 64, 1024, 2, True, 2, 1.0),
                          (3, 64, 16, 2, False, 2, 1e-25), (3, 16, 32, 2, True, 0, 1e-25)])
def test_a_screened_greedy_projection_picks_the_exact_argmax(
        t: int, bn: int, rows: int, at_once: int, near_first: bool, imma: int, scale: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``imma`` 2: the GPU's integer path (x in three int8 limbs), run by the interpreter.
    ``scale``: a final residual so small that x * x underflows float32 (the bound's ||x||
    must not)."""
    monkeypatch.setattr(K, "SCREEN_IMMA", imma)
    n, k = 203, 72
    h, w, norm = g(t, k, seed=1), g(n, k, seed=2), g(k, seed=3) + 1
    w[150] = w[40]  # a maximum twice, far apart: the first column wins
    w[41] = w[40]  # and twice side by side
    for j in range(60, 68):  # rows the int8 screen cannot tell apart from row 90's
        w[j] = w[90] + 1e-5 * g(k, seed=j)
    w[64] = w[90] + 1e-4 * w[90].sign()  # the best of them by a hair, in exact arithmetic
    tie, near = (1, 0) if near_first else (0, 1)
    if tie < t:
        h[tie] = w[40] / norm * 10
    if near < t:
        h[near] = w[90] / norm * 10
    h *= scale
    scr = K.screen_weights(w)
    cfg = K.LinearConfig(block_n=bn, block_k=32)
    bufs = K.screen_buffers(t, n, k, cfg, "cpu", rows=rows)
    for b in (bufs.up, bufs.lo, bufs.partials, bufs.stats):
        b.fill_(POISON)
    bufs.limbs.fill_(-128)  # (no limb is ever -128)
    part = K.screen(h, norm, scr, bufs, w, eps=1e-6, cfg=cfg, rows=rows, at_once=at_once,
                    evict=".cg" if imma else "")
    assert not part.isnan().any() and not bufs.lo.isnan().any()  # every program wrote
    if imma:  # the limbs' kernel wrote every limb and statistic
        assert not (bufs.limbs == -128).any() and not bufs.stats.isnan().any()
    ids = K.argmax_merge(part, torch.full((t,), -1, dtype=torch.int64))
    logits = rms_norm(h.double(), norm.double(), 1e-6) @ w.double().T
    # the bounds themselves, against float64: int8 logit +- err * ||x|| (x = h * g), * 1/RMS
    inv = torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    xg = h.double() * norm.double()
    s8 = inv * (xg @ (scr.q.double() * scr.scale.double()[:, None]).T)
    b8 = inv * xg.norm(dim=1, keepdim=True) * scr.err.double()
    tol = 1e-5 * (s8.abs() + b8)
    assert ((bufs.up.double() - (s8 + b8)).abs() <= tol).all()
    lo8 = (s8 - b8)[:, : (n // bn) * bn].reshape(t, n // bn, bn).max(-1).values
    assert ((bufs.lo.double()[:, : n // bn] - lo8).abs() <= 1e-5 * lo8.abs() + 1e-9).all()
    assert ids.tolist() == logits.argmax(-1).tolist()
    if tie < t:
        assert ids[tie] == 40
    if near < t:
        assert ids[near] == 64
        assert int((bufs.up[near] >= bufs.lo[near].max()).sum()) >= 8  # all of them rescored


def test_a_screen_it_cannot_run_is_refused_with_the_reason() -> None:
    w, h, norm = g(40, 72, seed=2), g(1, 72, seed=1), g(72, seed=3)
    scr = K.screen_weights(w)
    cfg = K.LinearConfig(block_n=8, block_k=32)
    with pytest.raises(ValueError, match=r"buffers for T = 1, 40 rows of 72 and this tile"):
        K.screen(h, norm, scr, K.screen_buffers(1, 40, 72, K.LinearConfig(16, 32), "cpu"), w,
                 cfg=cfg)
    with pytest.raises(ValueError, match=r"an OutScreen of \[V, 72\]"):
        K.screen(h, norm, K.screen_weights(g(40, 64)), K.screen_buffers(1, 40, 72, cfg, "cpu"), w,
                 cfg=cfg)
    with pytest.raises(ValueError, match="must be a power of two of at least 8"):
        K.screen(h, norm, scr, K.screen_buffers(1, 40, 72, cfg, "cpu", rows=12), w, cfg=cfg,
                 rows=12)
    bad = w.clone()
    bad[3, 5] = float("inf")
    with pytest.raises(ValueError, match="NaN or an infinity"):
        K.screen_weights(bad)


@pytest.mark.parametrize(("prefetch", "segments"), [(False, 1), (True, 1), (False, 4),
                                                    (True, 2)])
@pytest.mark.parametrize(("peel", "split"), [(0, 1), (3, 1), (0, 3), (7, 2), (7, 4)])
@pytest.mark.parametrize("mode", [K.STORE, K.ADD, K.SWIGLU])
def test_one_token_products_in_the_row_layout(mode: int, peel: int, split: int,
                                              prefetch: bool, segments: int) -> None:
    """``LinearConfig.rows`` (x read once a row, sums kept per row), with ``prefetch`` (tile
    k + 1 asked for before tile k is reduced, the last ask masked off), with ``segments`` (a
    row's tile read as 2 or 4 rows of 8 or 4 columns, summed after the loop), with the
    in-loop norm (its 1/RMS from one row's sums; split-K: the weight only). K = 72 in tiles of
    16: the last tile half masked (so are some segments, whole or in part); 3 splits of 32
    (the last holds half a tile), 2 of 48 (the second holds a tile and a half) and 4 of 32
    (the fourth empty); 40 rows in blocks of 16: the last block partly masked. The PDL
    prologue modes (3, 7) load the first tile before the wait (without prefetch it is reduced
    after the wait and the loop takes the tiles after it; an empty split's is masked off
    whole). Same sums as the default loop's."""
    n, k = 40, 72
    if mode != K.ADD:
        split = 1
    x, w = g(1, k, seed=1), g(2 * n if mode == K.SWIGLU else n, k, seed=2)
    norm, h0 = g(k, seed=3) + 1, g(1, n, seed=5)
    outs = []
    for rows in (False, True):
        out = h0.clone() if mode == K.ADD else torch.full((1, n), POISON)
        cfg = K.LinearConfig(16, 16, split_k=split, rows=rows, prefetch=prefetch and rows,
                             segments=segments if rows else 1)
        K.linear(x, w, out, mode=mode, norm=norm, eps=1e-6, cfg=cfg, pdl=peel,
                 norm_scale=split == 1)
        outs.append(out)
    xn = rms_norm(x, norm, 1e-6) if split == 1 else x * norm
    y = xn @ w.T
    if mode == K.SWIGLU:
        gate, up = y.split(n, dim=-1)
        ref = torch.nn.functional.silu(gate) * up
    else:
        ref = h0 + y if mode == K.ADD else y
    assert not outs[1].isnan().any()
    assert rel(outs[1], ref) < 1e-5
    assert rel(outs[1], outs[0]) < 1e-6


@pytest.mark.parametrize(("prefetch", "segments", "peel", "split"),
                         [(False, 1, 0, 1), (True, 1, 3, 1), (False, 1, 3, 1), (False, 2, 0, 3),
                          (True, 2, 7, 2)])
@pytest.mark.parametrize("mode", [K.STORE, K.ADD, K.SWIGLU])
def test_one_token_products_summed_a_lane_at_a_time(mode: int, prefetch: bool, segments: int,
                                                     peel: int, split: int) -> None:
    """``LinearConfig.lanes``: each tile's products kept as one partial a lane ([rows, 32],
    8 columns each) and the lanes summed after the loop give the row layout's sums. K = 600 in
    tiles of 256 or 512 (2 segments of 256): the last tile partly masked; 3 splits of 256 (the
    third holds 88 columns) and 2 of 512; the PDL prologue modes too."""
    n, k = 24, 600
    if mode != K.ADD:
        split = 1
    x, w = g(1, k, seed=1), g(2 * n if mode == K.SWIGLU else n, k, seed=2)
    norm, h0 = g(k, seed=3) + 1, g(1, n, seed=5)
    outs = []
    for lanes in (False, True):
        out = h0.clone() if mode == K.ADD else torch.full((1, n), POISON)
        cfg = K.LinearConfig(8, 256 * segments, split_k=split, rows=True, prefetch=prefetch,
                             segments=segments, lanes=lanes)
        K.linear(x, w, out, mode=mode, norm=norm, eps=1e-6, cfg=cfg, pdl=peel,
                 norm_scale=split == 1)
        outs.append(out)
    assert not outs[1].isnan().any() and (outs[1] != POISON).all()
    assert rel(outs[1], outs[0]) < 1e-6


def test_lanes_without_the_row_layout_or_whole_lanes_are_refused() -> None:
    for bad in (dict(lanes=True), dict(rows=True, lanes=True, block_k=128),
                dict(rows=True, lanes=True, block_k=512, segments=4)):
        with pytest.raises(ValueError, match="lanes needs rows=True"):
            K.LinearConfig(**{"block_n": 8, "block_k": 256, **bad})


def test_an_l2_prefetch_it_cannot_ask_for_is_refused_with_the_reason() -> None:
    """``kernels.l2_prefetch`` (``Runner.l2_prefetch``) asks the GPU's L2 only: on the CPU, or
    for a region outside the tensor, it says so instead of asking for other memory."""
    w = g(64, 32, seed=1)
    with pytest.raises(ValueError, match="needs the GPU"):
        K.l2_prefetch(w, (0,), 64, 4)
    for starts, count, progs in (((0, 2000), 64, 4), ((0, 1, 2), 8, 4), ((-1,), 8, 4),
                                 ((0,), 0, 4), ((0,), 8, 0), ((0,), 2049, 4)):
        with pytest.raises(ValueError, match="inside a contiguous tensor"):
            K.l2_prefetch(w, starts, count, progs)
    with pytest.raises(ValueError, match="inside a contiguous tensor"):
        K.l2_prefetch(w.t(), (0,), 8, 4)


def test_a_prefetch_or_segments_without_the_row_layout_are_refused() -> None:
    with pytest.raises(ValueError, match="prefetch needs rows=True"):
        K.LinearConfig(8, 16, prefetch=True)
    for bad in (dict(segments=2), dict(rows=True, segments=3), dict(rows=True, segments=32),
                dict(rows=True, segments=0)):
        with pytest.raises(ValueError, match="needs rows=True and a power of two"):
            K.LinearConfig(8, 16, **bad)


@pytest.mark.parametrize(("t", "peel", "bn"), [(1, 0, 8), (1, 3, 8), (1, 0, 16), (3, 0, 16)])
def test_the_norm_hand_off_from_the_residual_add_to_gate_up(t: int, peel: int, bn: int) -> None:
    """The o-projection adds into h and hands the next RMSNorm to gate/up (h * g, sums of
    squares per program); gate/up computes SwiGLU(RMSNorm(h) W13^T) from them. 40
    columns in tiles of 8 or 16: the last program's columns are partly masked."""
    n, k, f = 40, 72, 24
    x, wo, h0 = g(t, k, seed=1), g(n, k, seed=2), g(t, n, seed=3)
    g2, w13 = g(n, seed=4) + 1, g(2 * f, n, seed=5)
    h = h0.clone()
    n_prog = -(-n // bn)
    hand = K.NormHandoff(torch.full((t, n), POISON), torch.full((t, n_prog), POISON), g2)
    K.linear(x, wo, h, mode=K.ADD, cfg=K.LinearConfig(bn, 32), pdl=peel, hand_out=hand)
    ref_h = h0 + x @ wo.T
    assert rel(h, ref_h) < 1e-5
    assert rel(hand.xg, ref_h * g2) < 1e-5
    assert rel(hand.ss_part.sum(1), (ref_h * ref_h).sum(1)) < 1e-5
    act = torch.full((t, f), POISON)
    K.linear(hand.xg, w13, act, mode=K.SWIGLU, eps=1e-6, cfg=K.LinearConfig(8, 32),
             hand_in=hand)
    gate, up = (rms_norm(ref_h, g2, 1e-6) @ w13.T).split(f, dim=-1)
    assert not act.isnan().any()
    assert rel(act, torch.nn.functional.silu(gate) * up) < 1e-5


def test_a_norm_hand_off_it_cannot_run_is_refused_with_the_reason() -> None:
    t, n, k = 1, 40, 72
    x, wo, h = g(t, k), g(n, k), g(t, n)
    hand = K.NormHandoff(torch.zeros(t, n), torch.zeros(t, 5), g(n))
    count = torch.zeros(5, dtype=torch.int32)
    cases = [
        (dict(cfg=K.LinearConfig(8, 32, split_k=2), hand_out=hand), "needs count"),
        (dict(cfg=K.LinearConfig(8, 32, split_k=2), hand_out=K.NormHandoff(
            torch.zeros(t, n), torch.zeros(t, 5), g(n), torch.zeros(4, dtype=torch.int32))),
         r"one a column block \(5\)"),
        (dict(cfg=K.LinearConfig(8, 32, split_k=2), hand_out=K.NormHandoff(
            torch.zeros(t, n), torch.zeros(t, 5), g(n), count.float())), "int32 zeros"),
        (dict(cfg=K.LinearConfig(8, 32, split_k=2), hand_out=K.NormHandoff(
            torch.zeros(t, n), torch.zeros(t, 5), g(n),
            torch.zeros(1, dtype=torch.int32).expand(5))), "contiguous int32 zeros"),
        (dict(cfg=K.LinearConfig(16, 32), hand_out=hand), "one statistics slot a program"),
        (dict(cfg=K.LinearConfig(8, 32), hand_out=K.NormHandoff(torch.zeros(t, n - 1),
                                                                 torch.zeros(t, 5), g(n))),
         r"contiguous xg \[1, 40\]"),
        (dict(cfg=K.LinearConfig(8, 32), hand_out=hand, hand_in=hand), "one side at a time"),
        (dict(cfg=K.LinearConfig(8, 32), hand_out=hand, norm=g(k)), "instead of a norm"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            K.linear(x, wo, h, mode=K.ADD, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reads x from the hand-off"):
        K.linear(g(t, n), g(16, n), torch.zeros(t, 8), mode=K.SWIGLU, hand_in=hand)


@pytest.mark.parametrize(("t", "swap", "split"), [(3, False, 3), (9, True, 2), (9, False, 1),
                                                  (1, False, 4), (5, True, 1)])
def test_a_split_k_producer_hands_the_norm_off_serially(
        monkeypatch: pytest.MonkeyPatch, t: int, swap: bool, split: int) -> None:
    """Verify steps' o-projection keeps split-K and still hands the norm to gate/up: the last
    split of each column block to count itself in reads the finished columns back and writes
    x * g and the slot (in the weights' dtype here float32), then zeroes its count; a second
    launch on the same counts is right again. One hand-off a column block, not one a split
    (the interpreter runs programs one by one, so a hand-off by every split would end right
    there, and race on a GPU). The swapped consumer takes the hand-off too."""
    handed: list[int] = []
    orig = K._hand_off

    def hand_off(*args: object) -> None:
        handed.append(int(args[-1]))  # type: ignore[call-overload]  # pid
        orig(*args)

    monkeypatch.setattr(K, "_hand_off", hand_off)
    n, k, f = 40, 72, 24
    bn = 16 if swap or t > 1 else 8
    x, wo, h0 = g(t, k, seed=1), g(n, k, seed=2), g(t, n, seed=3)
    g2, w13 = g(n, seed=4) + 1, g(2 * f, n, seed=5)
    n_prog = -(-n // bn)
    count = torch.zeros(n_prog, dtype=torch.int32) if split > 1 else None
    hand = K.NormHandoff(torch.full((t, n), POISON), torch.full((t, n_prog), POISON), g2, count)
    cfg = K.LinearConfig(bn, 16, split_k=split, swap=swap)
    ref_h = h0 + x @ wo.T
    for _ in range(2):
        h = h0.clone()
        hand.xg.fill_(POISON)
        hand.ss_part.fill_(POISON)
        handed.clear()
        K.linear(x, wo, h, mode=K.ADD, cfg=cfg, hand_out=hand)
        assert sorted(handed) == list(range(n_prog))
        assert rel(h, ref_h) < 1e-5
        assert rel(hand.xg, ref_h * g2) < 1e-5
        assert rel(hand.ss_part.sum(1), (ref_h * ref_h).sum(1)) < 1e-5
        assert count is None or not count.any()
    act = torch.full((t, f), POISON)
    K.linear(hand.xg, w13, act, mode=K.SWIGLU, eps=1e-6,
             cfg=K.LinearConfig(16, 32, swap=swap), hand_in=hand)
    gate, up = (rms_norm(ref_h, g2, 1e-6) @ w13.T).split(f, dim=-1)
    assert not act.isnan().any()
    assert rel(act, torch.nn.functional.silu(gate) * up) < 1e-5


def test_split_k_atomics_take_only_the_memory_semantics_there_are() -> None:
    with pytest.raises(ValueError, match="atomic_sem must be one of"):
        K.linear(g(1, 40), g(8, 40), torch.zeros(1, 8), mode=K.ADD, atomic_sem="seq_cst")


@pytest.mark.parametrize("t", [1, 6])
def test_split_k_adds_partial_sums_into_the_residual(t: int) -> None:
    n, k = 24, 200
    x, w, h0 = g(t, k, seed=1), g(n, k, seed=2), g(t, n, seed=3)
    out = h0.clone()
    cfg = K.LinearConfig(block_n=8 if t == 1 else 16, block_k=32, split_k=3)
    K.linear(x, w, out, mode=K.ADD, cfg=cfg)
    assert rel(out, h0 + x @ w.T) < 1e-5
    swapped = h0.clone()
    K.linear(x, w, swapped, mode=K.ADD, cfg=K.LinearConfig(16, 32, split_k=3, swap=True))
    assert rel(swapped, h0 + x @ w.T) < 1e-5


@pytest.mark.parametrize("peel", [0, 3])
@pytest.mark.parametrize("t", [1, 5])
def test_qkv_rope_writes_q_and_the_cache(t: int, peel: int) -> None:
    a = ARGS
    x, w, bias, norm = g(t, a.n_embd, seed=1), g(a.qkv_dim, a.n_embd, seed=2), g(a.qkv_dim, seed=3), g(a.n_embd, seed=4)
    rope = rope_table(a, 64, "cpu")
    start = 9
    q = torch.full((t, a.n_head, a.head_dim), POISON)
    kc = torch.full((a.n_head_kv, 40, a.head_dim), POISON)
    vc = kc.clone()
    K.qkv_rope(x, w, norm, bias, rope, torch.tensor([start]), q, kc, vc, 1e-6, block_k=64,
               pdl=peel)
    y = rms_norm(x, norm, 1e-6) @ w.T + bias
    rq, rk, rv = y.split([a.q_dim, a.kv_dim, a.kv_dim], dim=-1)
    cs = rope[start : start + t]
    assert rel(q, apply_rope(rq.view(t, a.n_head, a.head_dim), cs)) < 1e-5
    rk = apply_rope(rk.view(t, a.n_head_kv, a.head_dim), cs).transpose(0, 1)
    assert rel(kc[:, start : start + t], rk) < 1e-5
    assert rel(vc[:, start : start + t], rv.view(t, a.n_head_kv, a.head_dim).transpose(0, 1)) < 1e-5
    assert kc[:, :start].isnan().all() and kc[:, start + t :].isnan().all()  # nothing else


def _attention_case(t: int, start: int, h: int, hd: int) -> tuple[torch.Tensor, ...]:
    """q [T, H, hd], a two-head cache of 160 positions poisoned past start + T (no result may
    read it) and a poisoned output [T, H * hd]."""
    q = g(t, h, hd, seed=1)
    kc, vc = g(2, 160, hd, seed=2), g(2, 160, hd, seed=3)
    kc[:, start + t :] = POISON
    vc[:, start + t :] = POISON
    return q, kc, vc, torch.full((t, h * hd), POISON)


def _attention_ref(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, start: int) -> torch.Tensor:
    """SDPA of q [T, H, hd] at positions start.. over the cache's first start + T keys, each
    query head reading its group's kv head: [T, H * hd]."""
    t, h, hd = q.shape
    keys = kc.repeat_interleave(h // kc.shape[0], 0)[:, : start + t]
    vals = vc.repeat_interleave(h // kc.shape[0], 0)[:, : start + t]
    mask = torch.arange(start + t)[None, :] <= torch.arange(start, start + t)[:, None]
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys, vals, attn_mask=mask[None]
    ).transpose(0, 1).reshape(t, h * hd)


@pytest.mark.parametrize(
    ("t", "start", "h", "hd", "trim"),
    [(1, 0, 6, 32, True), (1, 77, 6, 32, True), (4, 50, 6, 32, True), (2, 90, 14, 64, True),
     (1, 77, 6, 32, False), (4, 50, 6, 32, False),
     # splits of two blocks (143 keys: 32 a split, 5 of 8 used), and every split used
     (3, 140, 6, 32, True), (1, 120, 6, 32, True)],
)
def test_split_attention(t: int, start: int, h: int, hd: int, trim: bool) -> None:
    q, kc, vc, out = _attention_case(t, start, h, hd)
    nsplit = 8
    # partials of empty splits are not written when trimmed: the merge must not read them
    K.attention(q, kc, vc, torch.tensor([start]), out, torch.full((nsplit, t, h, hd), POISON),
                torch.full((nsplit, t, h, 2), POISON), block_s=16, trim=trim)
    assert not out.isnan().any()
    assert rel(out, _attention_ref(q, kc, vc, start)) < 1e-5


@pytest.mark.parametrize("cols", [2, 4, 8])
def test_a_merge_split_over_the_head_columns_gives_the_same_output(cols: int) -> None:
    """``combine_cols``: each (token, head) merged by ``cols`` programs of hd / cols columns:
    every column written, the same values as one program a (token, head)."""
    t, h, hkv, hd, s, start, nsplit = 3, 6, 2, 32, 96, 70, 8
    q, kc, vc = g(t, h, hd, seed=1), g(hkv, s, hd, seed=2), g(hkv, s, hd, seed=3)
    outs = []
    for c in (1, cols):
        out = torch.full((t, h * hd), POISON)
        K.attention(q, kc, vc, torch.tensor([start]), out, torch.full((nsplit, t, h, hd), POISON),
                    torch.full((nsplit, t, h, 2), POISON), block_s=16, combine_cols=c)
        outs.append(out)
    assert not outs[1].isnan().any()
    assert rel(outs[1], outs[0]) < 1e-6
    with pytest.raises(ValueError, match="combine_cols must divide the head dimension 32"):
        K.attention(q, kc, vc, torch.tensor([start]), outs[0], torch.zeros(nsplit, t, h, hd),
                    torch.zeros(nsplit, t, h, 2), block_s=16, combine_cols=3)


def test_tuned_merge_programs_cover_every_verify_size_and_name_the_one_token_step() -> None:
    """``tuning.combine_cols``: T 0 of ``COMBINE_COLS`` spreads over T = 2..max_t, a T it
    names keeps its own count; a shape without measurements gets none."""
    from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B
    from openjarvis.engine.torch.tuning import COMBINE_COLS, combine_cols

    big = combine_cols(QWEN25_1_5B, 32)
    assert big == {1: COMBINE_COLS[(1536, 8960)][1],
                   **dict.fromkeys(range(2, 33), COMBINE_COLS[(1536, 8960)][0])}
    assert combine_cols(QWEN25_0_5B, 32) == {1: COMBINE_COLS[(896, 4864)][1]}
    assert combine_cols(ARGS, 32) == {}


@pytest.mark.parametrize(("start", "trim"), [(0, True), (70, True), (70, False), (126, True)])
def test_attention_fused_with_the_output_projection(start: int, trim: bool) -> None:
    h, hkv, hd, s, d = 6, 2, 32, 128, 80
    q = g(1, h, hd, seed=1)
    kc, vc = g(hkv, s, hd, seed=2), g(hkv, s, hd, seed=3)
    kc[:, start + 1 :] = POISON
    vc[:, start + 1 :] = POISON
    wo, h0 = g(d, h * hd, seed=4), g(1, d, seed=5)
    out = h0.clone()
    nsplit = 8
    K.attention_out(q, kc, vc, torch.tensor([start]), wo, out,
                    torch.full((nsplit, 1, h, hd), POISON), torch.full((nsplit, 1, h, 2), POISON),
                    block_s=16, block_n=32, trim=trim)
    keys = kc.repeat_interleave(h // hkv, 0)[:, : start + 1]
    vals = vc.repeat_interleave(h // hkv, 0)[:, : start + 1]
    att = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), keys, vals)
    ref = h0 + att.transpose(0, 1).reshape(1, h * hd) @ wo.T
    assert rel(out, ref) < 1e-5


@pytest.mark.parametrize("fuse", [False, True])
def test_triton_runner_matches_the_reference_path(fuse: bool) -> None:
    model = _model()
    seq, ref = _seq_and_ref(model, 12, seed=0)
    fast = Runner(model, 64, kernels="triton", nsplit=4)
    fast.fuse_attn_out = fuse
    rows = [fast.logits(seq[:5], 0).clone()]
    rows += [fast.logits(seq[i : i + 1], i).clone() for i in (5, 6)]  # views: clone
    fast.logits([7, 8, 9], 7)  # a rejected draft, rolled back by position
    rows.append(fast.logits(seq[7:], 7))
    out = torch.cat(rows)
    assert rel(out, ref) < 1e-5


@pytest.mark.parametrize(("kernels", "screen", "imma"),
                         [("triton", True, 0), ("triton", True, 2), ("triton", False, 0),
                          ("torch", False, 0)])
def test_greedy_steps_pick_the_argmax_of_the_logits_among_the_tokenizer_columns(
        kernels: str, screen: bool, imma: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy steps (with the screen: its float path, and its integer path with x's limbs
    written by ``_screen_prep_kernel`` as on the GPU) against the argmax of the logits."""
    if imma:
        monkeypatch.setattr(K, "SCREEN_IMMA", imma)
    model = _model()
    seq = [int(x) for x in torch.randint(0, ARGS.n_vocab, (40,), generator=torch.Generator())]
    full = Runner(model, 64, kernels=kernels, nsplit=4)  # type: ignore[arg-type]
    logits = full.logits(seq, 0)  # 40 tokens: two steps of MAX_STEP = 32 and 8
    fast = Runner(model, 64, kernels=kernels, nsplit=4)  # type: ignore[arg-type]
    assert not fast.screen_out  # the default
    fast.screen_out = screen
    assert fast.argmax(seq[:-1], 0, last_only=True).tolist() == [int(logits[-2].argmax())]
    fast.drop_steps()  # (the same positions again, from the start)
    assert fast.argmax(seq, 0).tolist() == logits.argmax(-1).tolist()
    assert fast.greedy_tokens(seq[-2:], 38, last_only=True) == [int(logits[-1].argmax())]
    cols = int(logits.argmax(-1)[-1])  # the last row's best column is now out of reach
    fast.greedy_cols = cols
    ids = fast.argmax(seq[-3:], 37)
    assert ids.tolist() == logits[-3:, :cols].argmax(-1).tolist() and ids[-1] < cols
    assert fast.logits(seq[-1:], 39)[0].argmax() == cols  # logits steps keep every column
    if kernels == "triton":  # its greedy steps hold per-program maxima, never the logits
        ws = fast._greedy_steps[3]
        assert ws.logits.numel() == 0 and ws.partials is not None
        assert (ws.screen is not None) == screen
        if screen:  # the int8 copy was made anew for the narrower columns
            assert fast._screen is not None and fast._screen[0] == cols
            assert ws.screen is not None and ws.screen.up.shape == (3, cols)
            fast.screen_out = False
            fast.drop_steps()  # (which frees the copy, no step using it now)
            assert fast._screen is None
    with pytest.raises(ValueError, match="greedy_cols must be in 1..101"):
        fast.greedy_cols = 0


def test_a_trimmed_merge_never_reads_partials_left_by_a_longer_sequence() -> None:
    """Short attention blocks, so one-token steps use more splits as the sequence grows; then
    a new sequence from position 0 in the same Runner: its steps use fewer splits again, and
    the partials the longer one left in the unused splits must never be read."""
    model = _model()
    fast = Runner(model, 64, kernels="triton", nsplit=4)
    fast.attn_block_s = 4
    gen = torch.Generator().manual_seed(5)
    for n in (14, 5):  # 14 keys: 4 splits of 4; then 1 and 2 splits
        seq = [int(x) for x in torch.randint(0, ARGS.n_vocab, (n,), generator=gen)]
        ref = model.forward(torch.tensor(seq), torch.arange(n), KVCache(ARGS, 64, torch.float32,
                                                                          "cpu"))
        got = torch.cat([fast.logits(seq[i : i + 1], i).clone() for i in range(n)])
        assert rel(got, ref) < 1e-5


@pytest.mark.parametrize(("max_t", "bk"), [(1, 64), (32, 64), (1, 256)])  # 256: K in one tile
def test_single_launch_step_matches_the_reference_path(max_t: int, bk: int) -> None:
    """The persistent kernel (one program here: every grid barrier passes at once) computes
    what the reference forward does, for one-token steps and (max_t 32) verify-sized steps."""
    from openjarvis.engine.torch.megakernel import MegaConfig

    model = _model()
    w = model.weights
    seq, ref = _seq_and_ref(model, 12, seed=0)
    fast = Runner(model, 64, kernels="triton")
    fast.use_megakernel(MegaConfig(bk=bk, bk_down=bk, nsplit=4, block_s=16, num_warps=4), max_t=max_t)
    assert w.layers[1].wqkv.data_ptr() != w.layers[0].wqkv.data_ptr()  # views of one stack
    assert w.layers[1].wqkv._base is w.layers[0].wqkv._base
    rows = [fast.logits(seq[:5], 0).clone()]
    rows += [fast.logits(seq[i : i + 1], i).clone() for i in (5, 6)]
    fast.logits([7, 8, 9], 7)  # a rejected draft, rolled back by position
    rows.append(fast.logits(seq[7:], 7))
    out = torch.cat(rows)
    assert not out.isnan().any()
    assert rel(out, ref) < 1e-5
    assert (fast._steps[1].mega is not None) and ((fast._steps[5].mega is not None) == (max_t > 1))


@pytest.mark.parametrize("t", [3, 17])
def test_split_k_qkv_equals_the_per_pair_kernel_and_leaves_its_buffer_zero(t: int) -> None:
    a = ARGS
    x, w = g(t, a.n_embd, seed=1), g(a.qkv_dim, a.n_embd, seed=2) * 0.1
    norm, bias = g(a.n_embd, seed=3) + 1, g(a.qkv_dim, seed=4)
    rope = rope_table(a, 64, "cpu")
    start = torch.tensor([5])
    outs = []
    for split in (False, True):
        q = torch.full((t, a.n_head, a.head_dim), POISON)
        kc, vc = g(a.n_head_kv, 64, a.head_dim, seed=8), g(a.n_head_kv, 64, a.head_dim, seed=9)
        if split:
            acc = torch.zeros(t, a.qkv_dim)
            K.qkv_split(x, w, norm, bias, rope, start, q, kc, vc, acc, 1e-6,
                        cfg=K.LinearConfig(16, 32, split_k=3))
            assert not acc.any()  # zero again for the next layer
        else:
            K.qkv_rope(x, w, norm, bias, rope, start, q, kc, vc, 1e-6)
        outs.append((q, kc, vc))
    for ref, got in zip(outs[0], outs[1], strict=True):
        assert not got.isnan().any()
        assert rel(got, ref) < 1e-5


def test_a_rope_kernel_whose_threads_would_share_values_is_refused() -> None:
    """The split-K qkv's RoPE kernel zeroes what it read without a barrier: one warp, or no
    more warps than there are values for (head dimension 32 here: 16 values a half)."""
    a, t = ARGS, 3
    x, w, bias, norm = g(t, a.n_embd), g(a.qkv_dim, a.n_embd), g(a.qkv_dim), g(a.n_embd)
    q, kc = torch.zeros(t, a.n_head, a.head_dim), torch.zeros(a.n_head_kv, 40, a.head_dim)
    with pytest.raises(ValueError, match="rope_warps must be 1, or at most 1 for head dimension 32"):
        K.qkv_split(x, w, norm, bias, rope_table(a, 64, "cpu"), torch.tensor([0]), q, kc,
                    kc.clone(), torch.zeros(t, a.qkv_dim), 1e-6, K.LinearConfig(16, 32, split_k=2),
                    rope_warps=2)


def _scratch_bytes(r: Runner) -> int:
    """Bytes of the distinct buffers behind every step's scratch (h, q, partials, attn, act)
    and logits (a greedy step's: none)."""
    seen: dict[int, int] = {}
    for ws in [*r._steps.values(), *r._greedy_steps.values()]:
        for b in (ws.h, ws.q, ws.o_part, ws.ml_part, ws.attn, ws.act, ws.logits):
            st = b.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def test_steps_of_every_size_share_one_scratch_and_still_match_the_reference() -> None:
    """A warmed engine holds a step of every size (64 on the GPU): their scratch and logits
    are one buffer a kind, sized for the largest step, not one a step (but the one-token
    step's, the decode loop's, which keeps its own). Steps of different sizes interleaved
    over one cache still give the reference logits."""
    model = _model()
    seq, ref = _seq_and_ref(model, 12, seed=0)
    r = Runner(model, 64, kernels="triton", nsplit=4)
    rows = [r.logits(seq[:5], 0).clone(), r.logits(seq[5:6], 5).clone(),
            r.logits(seq[6:9], 6).clone(), r.logits(seq[9:10], 9).clone()]
    assert r.argmax(seq[10:12], 10).tolist() == ref[10:12].argmax(-1).tolist()
    rows.append(r.logits(seq[10:12], 10))
    assert rel(torch.cat(rows), ref) < 1e-5
    shared = _scratch_bytes(r)
    own = Runner(model, 64, kernels="triton", nsplit=4)
    own.shared_scratch = False
    for runner in (r, own):
        for t in range(1, 9):
            runner.logits(seq[:t], 0)
    assert _scratch_bytes(r) == shared  # eight more sizes, no more scratch
    a = ARGS  # one 32-token step's scratch (the largest) against the sum over eight sizes
    per_token = 4 * (a.n_embd + a.n_head * a.head_dim + 4 * a.n_head * (a.head_dim + 2)
                     + a.q_dim + a.n_ff + a.n_vocab)
    assert shared == (MAX_STEP + 1) * per_token  # the one-token step keeps its own (own_scratch_t)
    assert _scratch_bytes(own) == sum(range(1, 9)) * per_token


def test_the_shared_scratch_is_sized_for_the_widest_attention_and_grows_with_it() -> None:
    """Verify steps in more attention splits than the one-token step: the partials' buffer
    holds the widest. Wider splits set later (steps built before keep theirs) give a step that
    needs more a larger buffer; after ``drop_steps`` it is sized anew. Every row matches the
    reference throughout."""
    model = _model()
    seq, ref = _seq_and_ref(model, 44, seed=1)
    a = ARGS
    r = Runner(model, 64, kernels="triton", nsplit=4)
    r.verify_attention = (8, 16)
    rows = [r.logits(seq[:5], 0).clone(), r.logits(seq[5:6], 5).clone()]
    sized = r._arena["o_part"].numel()
    assert sized == 8 * MAX_STEP * a.n_head * a.head_dim  # the verify steps' 8 splits, not 4
    r.verify_attention = (16, 8)
    rows.append(r.logits(seq[6:38], 6).clone())  # 16 splits of 32 tokens: more than it holds
    assert r._arena["o_part"].numel() == 2 * sized
    r.drop_steps()
    rows.append(r.logits(seq[38:44], 38))
    assert r._arena["o_part"].numel() == 2 * sized
    assert rel(torch.cat(rows), ref) < 1e-5


def test_runner_with_split_k_qkv_for_verify_steps_matches_the_reference_path() -> None:
    model = _model()
    seq, ref = _seq_and_ref(model, 12, seed=0)
    fast = Runner(model, 64, kernels="triton", nsplit=4)
    fast.qkv_split = K.LinearConfig(16, 32, split_k=2)
    rows = [fast.logits(seq[:5], 0).clone(), fast.logits(seq[5:6], 5).clone()]
    rows.append(fast.logits(seq[6:], 6))
    assert rel(torch.cat(rows), ref) < 1e-5
    assert fast._steps[5].qkv_acc is not None and not fast._steps[5].qkv_acc.any()


@pytest.mark.parametrize("setting", ["plain", "deterministic", "split_wo", "fused"])
def test_runner_with_the_norm_hand_off_matches_the_reference_path(setting: str) -> None:
    """One-token steps with the o-projection handing the feed-forward norm to gate/up: the
    reference logits; a split-K o-projection tile (no program owns whole columns) falls back
    to the norm inside gate/up, unless deterministic steps unsplit it; so does the o-projection
    fused with the attention's merge; verify steps never hand off."""
    model = _model()
    fast = Runner(model, 64, kernels="triton", nsplit=4)
    fast.norm_handoff = True
    split = 2 if setting in ("split_wo", "deterministic") else 1
    fast.linear_configs[("wo", 1)] = K.LinearConfig(16, 64, split_k=split)
    if setting == "deterministic":
        fast.make_deterministic()  # the split-K tile becomes an unsplit one: hands off again
    fast.fuse_attn_out = setting == "fused"
    seq, ref = _seq_and_ref(model, 9, seed=5)
    rows = [fast.logits(seq[:5], 0).clone()]
    rows += [fast.logits(seq[i : i + 1], i).clone() for i in range(5, 9)]
    assert rel(torch.cat(rows), ref) < 1e-5
    handed = fast._steps[1].ss_part is not None
    assert handed == (setting in ("plain", "deterministic"))
    assert fast._steps[5].ss_part is None
    if setting == "plain":  # new tiles in the same workspace: new slots, the same logits
        fast.linear_configs[("wo", 1)] = K.LinearConfig(8, 64)
        again = fast.logits(seq[8:9], 8)
        assert fast._steps[1].ss_part is not None and fast._steps[1].ss_part.shape[1] == 16  # 128 / 8
        assert rel(again, ref[8:]) < 1e-5


@pytest.mark.parametrize("split", [1, 2])
def test_verify_steps_hand_the_norm_off_and_match_the_reference_path(split: int) -> None:
    """``verify_handoff``: verify steps' o-projection hands the feed-forward norm to their
    (swapped) gate/up, serially where it splits K; the same step again at another position
    reuses the counts, which each launch leaves at zero."""
    model = _model()
    fast = Runner(model, 64, kernels="triton", nsplit=4)
    fast.verify_handoff, fast.qkv_split = True, K.LinearConfig(16, 32, split_k=2)
    fast.linear_configs[("wo", 5)] = K.LinearConfig(16, 64, split_k=split)
    fast.linear_configs[("w13", 5)] = K.LinearConfig(16, 32, swap=True)
    seq, ref = _seq_and_ref(model, 9, seed=7)
    rows = [fast.logits(seq[:5], 0).clone(), fast.logits(seq[5:6], 5).clone(),
            fast.logits(seq[4:9], 4).clone()]
    assert rel(torch.cat(rows), torch.cat([ref[:6], ref[4:9]])) < 1e-5
    ws = fast._steps[5]
    assert ws.ss_part is not None and ws.ss_part.shape[1] == 128 // 16
    assert (ws.hand_count is not None) == (split > 1)
    assert ws.hand_count is None or not ws.hand_count.any()
    assert fast._steps[1].ss_part is None  # norm_handoff (one-token steps) is off


def test_verify_steps_hand_off_x_times_g_in_the_weights_dtype_and_one_token_steps_in_float32(
) -> None:
    """A bfloat16 model: verify steps' x * g is bfloat16 (their gate/up rounds it so for its
    MMA anyway), one-token steps' float32; a split-K o-projection tile gets a count a column
    block, zero. (Buffers only: nothing is launched.)"""
    w = random_weights(ARGS, torch.bfloat16, "cpu", seed=3, scale=0.1)
    r = Runner(Transformer(ARGS, w, n_pos=128), 64, kernels="triton", nsplit=4)
    r.norm_handoff = r.verify_handoff = True
    r.linear_configs[("wo", 3)] = K.LinearConfig(16, 32, split_k=2)
    xg, ss, count = r._handoff_buffers(r._workspace(3)) or (None, None, None)
    assert xg is not None and xg.dtype == torch.bfloat16 and tuple(xg.shape) == (3, 128)
    assert ss is not None and tuple(ss.shape) == (3, 8)
    assert count is not None and count.dtype == torch.int32 and tuple(count.shape) == (8,)
    assert not count.any()
    one = r._handoff_buffers(r._workspace(1))
    assert one is not None and one[0].dtype == torch.float32 and one[2] is None


def test_a_prompt_longer_than_one_step_runs_in_chunks() -> None:
    w = random_weights(ARGS, torch.float32, "cpu", seed=4, scale=0.1)
    model = Transformer(ARGS, w, n_pos=128)
    seq = [int(x) for x in torch.randint(0, ARGS.n_vocab, (40,), generator=torch.Generator())]
    ref = model.forward(torch.tensor(seq), torch.arange(40), KVCache(ARGS, 64, torch.float32, "cpu"))
    fast = Runner(model, 64, kernels="triton", nsplit=4)
    last = fast.logits(seq, 0, last_only=True)
    assert last.shape == (1, ARGS.n_vocab)
    assert rel(last, ref[-1:]) < 1e-5
    fast2 = Runner(model, 64, kernels="triton", nsplit=4)
    assert rel(fast2.logits(seq, 0), ref) < 1e-5


@pytest.mark.parametrize(("t", "start", "h", "hd", "rows", "nsplit"),
                         [(20, 0, 6, 32, 0, 4), (20, 100, 6, 32, 0, 4), (33, 90, 14, 64, 0, 4),
                          (16, 0, 4, 32, 0, 4), (45, 0, 6, 32, 12, 4), (45, 20, 6, 32, 12, 1)])
def test_wide_attention_matches_sdpa_over_blocks_of_a_runs_tokens(
        t: int, start: int, h: int, hd: int, rows: int, nsplit: int) -> None:
    """The wide step's attention: a run's tokens in blocks (the last one partial where T is
    not a multiple), each seeing the keys up to its own position, none past the run. Blocks of
    4 tokens (12 rows) from position 0 over 4 splits: the first blocks' later splits hold no
    key they see, and merge as empty."""
    q, kc, vc, out = _attention_case(t, start, h, hd)
    K.attention_wide(q, kc, vc, torch.tensor([start]), out, torch.full((nsplit, t, h, hd), POISON),
                     torch.full((nsplit, t, h, 2), POISON), block_s=16, rows=rows)
    assert not out.isnan().any()
    assert rel(out, _attention_ref(q, kc, vc, start)) < 1e-5


def test_wide_helpers_refuse_buffers_of_the_wrong_shape_by_name() -> None:
    a, t = ARGS, 4
    q = torch.zeros(t, a.n_head, a.head_dim)
    kc = torch.zeros(a.n_head_kv, 40, a.head_dim)
    with pytest.raises(ValueError, match="attention_wide: partials"):
        K.attention_wide(q, kc, kc, torch.tensor([0]), torch.zeros(t, a.q_dim),
                         torch.zeros(4, t + 1, a.n_head, a.head_dim), torch.zeros(4, t, a.n_head, 2))
    with pytest.raises(ValueError, match="attention_wide: contiguous q .* splits a power of two"):
        K.attention_wide(q, kc, kc, torch.tensor([0]), torch.zeros(t, a.q_dim),
                         torch.zeros(3, t, a.n_head, a.head_dim), torch.zeros(3, t, a.n_head, 2))
    with pytest.raises(ValueError, match="swiglu_rows: contiguous gu"):
        K.swiglu_rows(torch.zeros(t, a.n_ff), torch.zeros(t), torch.zeros(t, a.n_ff))
    with pytest.raises(ValueError, match="rope_kv: qkv must be contiguous"):
        K.rope_kv(torch.zeros(t, a.qkv_dim - 1), torch.zeros(t, a.n_embd), torch.zeros(a.qkv_dim),
                  rope_table(a, 64, "cpu"), torch.tensor([0]), q, kc, kc.clone(), 1e-6)
    with pytest.raises(ValueError, match="rope_kv: inv holds each row's 1/RMS"):
        K.rope_kv(torch.zeros(t, a.qkv_dim), torch.zeros(t, a.n_embd), torch.zeros(a.qkv_dim),
                  rope_table(a, 64, "cpu"), torch.tensor([0]), q, kc, kc.clone(), 1e-6,
                  inv=torch.zeros(t + 1))
    with pytest.raises(ValueError, match="residual_norm: contiguous float32 h"):
        K.residual_norm(torch.zeros(t, a.n_embd, dtype=torch.float64), None, torch.ones(a.n_embd),
                        torch.zeros(t, a.n_embd), torch.zeros(t), 1e-6)


@pytest.mark.parametrize("add", [False, True])
def test_residual_norm_adds_then_hands_the_next_product_h_times_g_and_each_rows_rms(
        add: bool) -> None:
    """Between the wide step's products: h += y, then h * g and 1/RMS(h), which a product of
    h * g needs to become RMSNorm(h) @ W^T; and SwiGLU from such a product."""
    a, t = ARGS, 3
    h0, y, norm = g(t, a.n_embd, seed=1), g(t, a.n_embd, seed=5), g(a.n_embd) + 1
    h = h0.clone()
    xg, inv = torch.full((t, a.n_embd), POISON), torch.full((t,), POISON)
    K.residual_norm(h, y if add else None, norm, xg, inv, 1e-6)
    want = h0 + y if add else h0
    assert rel(h, want) < 1e-6
    assert rel(xg, want * norm) < 1e-6
    assert rel(xg * inv[:, None], rms_norm(want, norm, 1e-6)) < 1e-5
    w = g(2 * a.n_ff, a.n_embd, seed=2) * 0.1
    act = torch.full((t, a.n_ff), POISON)
    K.swiglu_rows(xg @ w.T, inv, act)
    ref = rms_norm(want, norm, 1e-6) @ w.T
    assert rel(act, torch.nn.functional.silu(ref[:, : a.n_ff]) * ref[:, a.n_ff :]) < 1e-5


def _wide_case(n_ctx: int, seed: int) -> tuple[Transformer, list[int], torch.Tensor, KVCache]:
    """A float32 model, a sequence filling a window of ``n_ctx``, and the reference forward's
    logits of it and the cache that forward leaves."""
    model = Transformer(ARGS, random_weights(ARGS, torch.float32, "cpu", seed=4, scale=0.1),
                        n_pos=n_ctx + 32)
    gen = torch.Generator().manual_seed(seed)
    seq = [int(x) for x in torch.randint(0, ARGS.n_vocab, (n_ctx,), generator=gen)]
    ref_cache = KVCache(ARGS, n_ctx, torch.float32, "cpu")
    return model, seq, model.forward(torch.tensor(seq), torch.arange(n_ctx), ref_cache), ref_cache


def test_a_prompt_read_in_wide_steps_leaves_the_reference_cache_and_last_logits() -> None:
    """Runs of at least ``wide`` tokens start with wide steps (products through torch, 1/RMS
    after them), the rest as fixed-size steps (here 40: one of 32 and one of 8): the last
    token's logits and greedy token are the reference forward's, from position 0 and for a
    step ending at the window's last position (its attention over two splits), and the cache
    holds the reference's K/V (what the next steps read). Nothing in the step's buffers is
    read before it is written. Shorter runs, and every row asked for, keep the fixed-size
    steps."""
    n_ctx = 120
    model, seq, ref, ref_cache = _wide_case(n_ctx, seed=5)
    fast = Runner(model, n_ctx, kernels="triton", nsplit=4)
    assert fast.wide == 0  # on by default only on the GPU
    fast.wide = 48
    ww = fast._wide_ws(48)
    for buf in (ww.h, ww.xg, ww.inv, ww.qkv, ww.q, ww.o_part, ww.ml_part, ww.attn, ww.out, ww.gu,
                ww.act, ww.row):
        buf.fill_(POISON)  # nothing read before the step writes it
    assert rel(fast.logits(seq[:88], 0, last_only=True), ref[87:88]) < 1e-5  # 48 + 32 + 8
    assert fast._wide is ww and ww.graph is None  # (the CPU: no graph)
    assert rel(fast.logits(seq[72:], 72, last_only=True), ref[-1:]) < 1e-5  # to the window's end
    assert fast.argmax(seq[72:], 72, last_only=True).tolist() == [int(ref[-1].argmax())]
    for cache, want in ((fast.cache.k, ref_cache.k), (fast.cache.v, ref_cache.v)):
        assert rel(cache[:, :, :n_ctx], want[:, :, :n_ctx]) < 1e-5
    fast.wide = 16  # another width: the step is built anew
    assert fast._wide is None
    assert rel(fast.logits(seq[:40], 0, last_only=True), ref[39:40]) < 1e-5
    assert fast._wide is not None and fast._wide.h.shape[0] == 16
    steps = Runner(model, n_ctx, kernels="triton", nsplit=4)
    steps.wide = 16
    assert rel(steps.logits(seq[:40], 0), ref[:40]) < 1e-5  # every row: fixed-size steps
    assert steps._wide is None
    assert rel(steps.logits(seq[40:55], 40, last_only=True), ref[54:55]) < 1e-5
    assert steps._wide is None  # 15 tokens: shorter than a wide step


def test_a_wide_step_wider_than_wide_step_reads_its_rest_in_narrower_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``wide`` wider than ``WIDE_STEP`` (an engine's longer runs on the GPU) reads a run in
    steps of ``wide``, then of ``WIDE_STEP`` times each power of two below it, then fixed-size
    steps (here 48, 32 and 16: a run of 88 is one of 48, one of 32, then 8), each width with
    its own splits of the sequence over views of one set of buffers: the last logits, greedy
    token and K/V are the reference's, and ``warm_wide`` builds every width that fits the
    window."""
    import openjarvis.engine.torch.generate as G

    monkeypatch.setattr(G, "WIDE_STEP", 16)
    n_ctx = 120
    model, seq, ref, ref_cache = _wide_case(n_ctx, seed=6)
    fast = Runner(model, n_ctx, kernels="triton", nsplit=4)
    fast.wide = 48
    assert fast.wide_widths == (48, 32, 16)
    assert [G.wide_nsplit(t) for t in (48, 32, 16)] == [16, 32, 64]  # (1,024 a split x tokens)
    monkeypatch.setattr(G, "WIDE_SPLIT_TOKENS", 64)  # 1, 2 and 4 splits: the interpreter's time
    for t in (48, 32, 16):
        ww = fast._wide_ws(t)
        for buf in (ww.h, ww.xg, ww.inv, ww.qkv, ww.q, ww.o_part, ww.ml_part, ww.attn, ww.out,
                    ww.gu, ww.act, ww.row):
            buf.fill_(POISON)
    assert [fast._wides[t].o_part.shape[0] for t in (48, 32, 16)] == [1, 2, 4]
    assert fast._wides[16].h.data_ptr() == fast._wides[48].h.data_ptr()  # one arena
    assert rel(fast.logits(seq[:88], 0, last_only=True), ref[87:88]) < 1e-5  # 48 + 32 + 8
    assert fast._wide is fast._wides[32]
    assert rel(fast.logits(seq[88:], 88, last_only=True), ref[-1:]) < 1e-5  # 32
    assert fast.argmax(seq[40:], 40, last_only=True).tolist() == [int(ref[-1].argmax())]
    for cache, want in ((fast.cache.k, ref_cache.k), (fast.cache.v, ref_cache.v)):
        assert rel(cache[:, :, :n_ctx], want[:, :, :n_ctx]) < 1e-5
    assert sorted(fast._wides) == [16, 32, 48]
    fast.wide = 32  # another width: every step is built anew
    assert fast._wides == {} and fast._wide is None and fast._wide_arena == {}
    small = Runner(model, 40, kernels="triton", nsplit=4)
    small.wide = 48
    small.warm_wide()  # the window holds steps of 16 and 32, not one of 48
    assert sorted(small._wides) == [16, 32]


def test_a_window_shorter_than_the_wide_step_never_builds_one() -> None:
    """``warm_wide`` (the engine's load) on a window shorter than the step: nothing to build,
    nothing written past the cache; a negative width is refused."""
    r = Runner(_model(), 8, kernels="triton", nsplit=4)
    r.wide = 16
    r.warm_wide()
    assert r._wide is None
    with pytest.raises(ValueError, match="wide must be 0"):
        r.wide = -1


def test_evict_first_weight_loads_and_the_deterministic_tiles_compute_the_same_logits() -> None:
    """``weight_evict`` changes only a cache hint; ``make_deterministic`` swaps every split-K
    tile (float atomics: the last bits vary on a GPU) for an unsplit one and drops the split-K
    qkv and the fused attention output, and the step still computes the reference logits."""
    model = _model()
    seq, ref = _seq_and_ref(model, 9, seed=2)
    fast = Runner(model, 64, kernels="triton", nsplit=4)
    fast.weight_evict = "evict_first"
    fast.qkv_split = K.LinearConfig(16, 32, split_k=2)
    fast.fuse_attn_out = True
    split = {("w2", 1): K.LinearConfig(8, 32, split_k=4), ("wo", 1): K.LinearConfig(16, 32, split_k=3)}
    split |= {("w2", t): K.LinearConfig(32, 32, split_k=4, swap=True) for t in (2, 3)}
    fast.linear_configs.update(split)
    for deterministic in (False, True):
        if deterministic:
            fast.make_deterministic()
            assert fast.deterministic
            assert fast.tiles("w2", 1) == K.LinearConfig(2, 32)  # 8 / 4 rows, one split
            assert fast.tiles("wo", 1) == K.LinearConfig(4, 32)  # 16 / 3 -> 4: a power of two
            assert fast.tiles("w2", 2) == K.LinearConfig(16, 32, swap=True)  # an MMA needs 16
            assert fast.tiles("w13", 1) is None  # untouched: the default tile
        rows = [fast.logits(seq[:6], 0).clone(), fast.logits(seq[6:7], 6).clone(),
                fast.logits(seq[7:], 7)]
        assert rel(torch.cat(rows), ref) < 1e-5


def test_pdl_modes_never_launch_early_without_waiting() -> None:
    """The launch attribute (start before the previous kernel ends) goes exactly with the modes
    whose kernels wait before they read activations (1, 2 and, with the late trigger, 5, 6,
    or with the trigger after the wait, 9, 10); kernels without a weight prologue get the
    plain wait of the same mode, keeping where it lets the next kernel go."""
    assert [bool(K._launch(m)) for m in range(12)] == [False, True, True, False] * 3
    assert [K._wait(m) for m in range(12)] == [0, 1, 1, 0, 0, 5, 5, 0, 0, 9, 9, 0]
    for bad in (13, 14, 16, -1):  # both triggers at once, or no mode at all
        with pytest.raises(ValueError, match=f"PDL mode {bad}: use 0-3"):
            K._launch(bad)


def test_dropped_steps_go_at_once_not_at_a_later_garbage_collection() -> None:
    """A CUDA graph that the garbage collector frees in the middle of another capture fails
    that capture (seen on the H200, session 6 run 53), so a dropped step must be freed when it
    is dropped: nothing in a workspace may refer back to it (it names its path instead of
    holding a closure)."""
    r = Runner(_model(), 64, kernels="triton", nsplit=4)

    def alive() -> int:
        return sum(type(o) is Workspace for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        base = alive()
        r._workspace(1)
        r._workspace(3)
        assert alive() == base + 2
        r.drop_steps(3)
        assert alive() == base + 1 and list(r._steps) == [1]
        r.drop_steps()
        assert alive() == base and not r._steps
    finally:
        gc.enable()


def test_each_kernel_launch_gets_its_pdl_mode_cache_policy_and_tiles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch plan of a step, recorded instead of run: one-token steps launch early (PDL 1)
    with qkv and wo loading weights first (2); verify steps use PDL only for the kernels named
    in ``verify_pdl``; a deterministic step launches no split-K and no fused attention output."""
    r = Runner(_model(), 64, kernels="triton", nsplit=4)
    w = r.model.weights
    r.pdl_by_t, r.pdl_prologue = {1: 1}, frozenset({"qkv", "wo"})
    r.verify_pdl = {"attn": 1, "combine": 1}
    r.weight_evict = "evict_first"
    r.qkv_split = K.LinearConfig(16, 32, split_k=2)
    r.linear_configs[("w2", 1)] = K.LinearConfig(8, 32, split_k=4)
    names = {id(t): n for lw in w.layers for n, t in (("wo", lw.wo), ("w13", lw.w13), ("w2", lw.w2))}
    names[id(w.out)] = "out"
    calls: list[tuple[str, dict[str, object]]] = []

    def record(kind: str):  # noqa: ANN202
        def launch(*args: object, **kw: object) -> None:
            name = names.get(id(args[1]), kind) if kind == "linear" else kind
            calls.append((name, kw))
        return launch

    for kind in ("linear", "qkv_rope", "qkv_split", "attention", "attention_out", "embed"):
        monkeypatch.setattr(K, kind, record(kind))

    def plan(t: int) -> list[tuple[str, dict[str, object]]]:
        calls.clear()
        r.drop_steps()
        r._run(r._workspace(t))
        return calls[:7]  # the embedding and the first layer

    def modes(steps: list[tuple[str, dict[str, object]]]) -> list[tuple[str, object]]:
        return [(n, kw.get("pdl")) for n, kw in steps]

    one = plan(1)
    assert modes(one) == [("embed", 1), ("qkv_rope", 2), ("attention", 1), ("wo", 2),
                          ("w13", 1), ("w2", 1), ("qkv_rope", 2)]
    assert all(kw["evict"] == "evict_first" for n, kw in one[1:] if n != "attention")
    assert one[5][1]["cfg"] == K.LinearConfig(8, 32, split_k=4)
    verify = plan(3)
    assert modes(verify) == [("embed", 0), ("qkv_split", 0), ("attention", 1), ("wo", 0),
                             ("w13", 0), ("w2", 0), ("qkv_split", 0)]
    assert verify[1][1]["pdl_rope"] == 0 and verify[2][1]["pdl_combine"] == 1
    # the GPU default: each kernel lets the next launch after its main loop (+4), but the
    # attention, its merge, gate/up and the down-projection let theirs launch at their start,
    # and the down-projection loads its first weight tile before it waits
    r.pdl_by_t, r.one_token_pdl = dict(DEFAULT_PDL_BY_T), dict(DEFAULT_ONE_TOKEN_PDL)
    late = plan(1)
    assert modes(late) == [("embed", 5), ("qkv_rope", 6), ("attention", 1), ("wo", 6),
                           ("w13", 1), ("w2", 2), ("qkv_rope", 6)]
    assert late[2][1]["pdl_combine"] == 1 and late[2][1]["combine_warps"] == 1
    r.combine_warps = {3: 2}  # the merge's warps per T
    assert plan(3)[2][1]["combine_warps"] == 2 and plan(1)[2][1]["combine_warps"] == 1
    assert late[2][1]["combine_cols"] == 1
    r.combine_cols = {1: 4, 3: 2}  # the merge's programs a (token, head) per T (COMBINE_COLS)
    assert plan(3)[2][1]["combine_cols"] == 2 and plan(1)[2][1]["combine_cols"] == 4
    assert plan(2)[2][1]["combine_cols"] == 1
    r.combine_cols = {}
    assert late[2][1]["num_warps"] == 4
    r.attn_warps = {1: 2}  # the attention's own warps per T
    assert plan(1)[2][1]["num_warps"] == 2 and plan(3)[2][1]["num_warps"] == 4
    assert plan(1)[1][1]["num_warps"] == 4
    r.qkv_warps = {1: 2}  # the per-pair qkv kernel's warps per T
    assert plan(1)[1][1]["num_warps"] == 2 and plan(1)[-1][1]["num_warps"] == 2
    r.rope_warps, r.verify_attention = {3: 4}, (2, 16)  # verify steps' own attention tiles
    verify = plan(3)
    assert verify[1][1]["rope_warps"] == 4
    assert verify[2][1]["block_s"] == 16 and r._steps[3].o_part.shape[0] == 2
    one = plan(1)
    assert one[2][1]["block_s"] == r.attn_block_s and r._steps[1].o_part.shape[0] == 4
    r.fuse_attn_out = True
    assert [n for n, _ in plan(1)][:4] == ["embed", "qkv_rope", "attention_out", "w13"]
    r.make_deterministic()
    det = plan(1)
    assert [n for n, _ in det][:4] == ["embed", "qkv_rope", "attention", "wo"]
    assert det[5][1]["cfg"] == K.LinearConfig(2, 32)
    assert [n for n, _ in plan(3)][1] == "qkv_rope"  # no split-K qkv either
    r.norm_handoff = True  # one-token steps: wo hands the feed-forward norm to gate/up
    one = plan(1)
    assert one[3][1]["hand_out"] is one[4][1]["hand_in"] is not None
    assert one[4][1].get("norm") is None and one[3][1]["hand_out"].weight is w.layers[0].ffn_norm
    assert plan(3)[3][1]["hand_out"] is None and "hand_in" not in plan(3)[4][1]
    r.verify_handoff = True
    r.linear_configs[("wo", 3)] = K.LinearConfig(16, 32, split_k=2)
    hand = plan(3)[3][1]["hand_out"]  # deterministic: the tile is unsplit, no counts
    assert hand is not None and hand.count is None
    r.deterministic = False
    verify = plan(3)
    assert verify[3][1]["hand_out"].count is not None and verify[4][1]["hand_in"] is not None
    r.atomic_sem = "acq_rel"  # every split-K launch takes the Runner's atomic semantics
    assert {kw["atomic_sem"] for n, kw in plan(3) if n in ("qkv_split", "wo", "w2")} == {"acq_rel"}
    r.fuse_attn_out = True
    assert plan(1)[2][0] == "attention_out" and plan(1)[2][1]["atomic_sem"] == "acq_rel"


class _PdlWatch:
    """Watches the interpreter run a step's kernels: in a kernel launched early (PDL), a program
    may read only what no kernel of the step writes (weights, the RoPE table, ``start``) before
    its wait (``_gdc``); reading an activation or the KV cache there reads a value that the
    kernel before it may not have written yet, a bug only a race on the GPU would show. It sees
    loads only: an atomic or a store before the wait goes unseen."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from triton.runtime import interpreter as I

        self.ranges: list[tuple[int, int]] = []
        self.kernel, self.early, self.waited = "", False, False
        self.early_launches: list[str] = []
        self.violations: list[str] = []
        builder = I.interpreter_builder
        load, set_idx, call = builder.create_masked_load, builder.set_grid_idx, I.GridExecutor.__call__

        def masked_load(ptrs, mask, other, cache_policy, is_volatile):  # noqa: ANN001, ANN202
            if self.early and not self.waited:
                addr = ptrs.data[mask.data.astype(bool)].astype("int64")
                if any(((addr >= lo) & (addr < hi)).any() for lo, hi in self.ranges):
                    self.violations.append(f"{self.kernel} {builder.grid_idx}")
            return load(ptrs, mask, other, cache_policy, is_volatile)

        def set_grid_idx(x: int, y: int, z: int) -> None:
            self.waited = False  # a new program
            set_idx(x, y, z)

        def grid_call(ex, *args, **kwargs):  # noqa: ANN001, ANN202
            self.kernel, self.early = ex.fn.__name__, bool(kwargs.get("launch_pdl"))
            if self.early:
                self.early_launches.append(self.kernel)
            return call(ex, *args, **kwargs)

        def gdc(pdl: int) -> None:
            if pdl % 4 in (1, 2):
                self.waited = True

        monkeypatch.setattr(builder, "create_masked_load", masked_load)
        monkeypatch.setattr(builder, "set_grid_idx", set_grid_idx)
        monkeypatch.setattr(I.GridExecutor, "__call__", grid_call)
        monkeypatch.setattr(K, "_gdc", gdc)  # the interpreter has no PDL: the wait is a mark
        monkeypatch.setattr(K, "_gdc_late", lambda pdl: None)

    def guard(self, tensors: list[torch.Tensor]) -> None:
        """Watch reads of these from now on."""
        self.ranges = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]
        self.early_launches.clear()


@pytest.mark.parametrize("setting", ["default", "fused", "deterministic", "verify_handoff",
                                     "prefetch"])
def test_kernels_launched_early_read_activations_only_after_their_wait(
        monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    """The GPU's PDL settings (one-token steps late-triggered with qkv, wo and the
    down-projection loading weights before the wait; verify steps all launched early, the
    merge letting the o-projection launch after its wait), the split-K
    qkv, the norm hand-off: in every program of every kernel launched early, no read of the
    residual, the scratch buffers or the KV cache comes before the program's wait."""
    from openjarvis.engine.torch.tuning import VERIFY_PDL

    model = _model()
    seq, ref = _seq_and_ref(model, 7, seed=6)
    r = Runner(model, 64, kernels="triton", nsplit=4)
    r.pdl_by_t, r.one_token_pdl = dict(DEFAULT_PDL_BY_T), dict(DEFAULT_ONE_TOKEN_PDL)
    r.pdl_prologue, r.verify_pdl = frozenset({"qkv", "wo"}), dict(VERIFY_PDL[(896, 4864)])
    r.qkv_split, r.norm_handoff = K.LinearConfig(16, 32, split_k=2), True
    r.fuse_attn_out = setting == "fused"
    if setting == "deterministic":
        r.make_deterministic()
    if setting == "verify_handoff":  # serially, from a split-K o-projection
        r.verify_handoff = True
        r.linear_configs[("wo", 5)] = K.LinearConfig(16, 32, split_k=2)
        r.linear_configs[("w13", 5)] = K.LinearConfig(16, 32, swap=True)
    if setting == "prefetch":  # wo: with its weight prologue; K = 128 and 160: 2 or more tiles
        r.linear_configs.update({(m, 1): K.LinearConfig(16, 64, rows=True, prefetch=True,
                                                        segments=2 if m == "w2" else 1)
                                 for m in ("wo", "w13", "w2", "out")})
    watch = _PdlWatch(monkeypatch)
    r.logits(seq[:5], 0)  # builds both workspaces' buffers, then watch their reads
    r.logits(seq[5:6], 5)
    guarded = [r.cache.k, r.cache.v]
    for ws in r._steps.values():
        # (not ws.hand_count: only atomics and stores touch it, and the watch sees loads)
        guarded += [b for b in (ws.h, ws.q, ws.o_part, ws.ml_part, ws.attn, ws.act, ws.logits,
                                ws.qkv_acc, ws.xg, ws.ss_part) if b is not None]
    watch.guard(guarded)
    got = torch.cat([r.logits(seq[:5], 0).clone(), r.logits(seq[5:6], 5).clone(),
                     r.logits(seq[6:7], 6).clone()])
    assert rel(got, ref) < 1e-5
    kinds = {"_qkv_rope_kernel", "_linear_kernel", "_attn_split_kernel"}
    kinds |= set() if setting == "deterministic" else {"_rope_kv_kernel"}  # split-K qkv
    assert kinds <= set(watch.early_launches)  # the watch saw early launches of each kind
    assert not watch.violations, sorted(set(watch.violations))[:5]


def test_a_shared_memory_floor_is_the_least_that_caps_an_sm_and_zero_undoes_it() -> None:
    """``kernels.shared_floor_for(n)`` lets exactly n programs share a 228 KB SM (each also
    takes the system's 1 KB), not n + 1; ``floor_shared`` raises a compiled kernel's launch
    shared memory to the floor, never below its own need, puts it back with 0, and refuses a
    Triton whose packed launch metadata does not carry the shared memory third."""
    sm = 228 * 1024
    for n in (1, 3, 5, 10, 16):
        floor = K.shared_floor_for(n)
        assert sm // (floor + 1024) == n and sm // (floor - 256 + 1024) == n + 1
    with pytest.raises(ValueError, match="at least 1"):
        K.shared_floor_for(0)

    class Meta:
        shared = 2048

    class Compiled:
        metadata = Meta()
        packed_metadata: tuple[int, ...] = (4, 1, 2048)
        function = 1

    ck = Compiled()
    K.floor_shared(ck, 20224)
    assert ck.packed_metadata == (4, 1, 20224)
    K.floor_shared(ck, 1024)  # below its own need: its own
    assert ck.packed_metadata == (4, 1, 2048)
    K.floor_shared(ck, 20224)
    K.floor_shared(ck, 0)
    assert ck.packed_metadata == (4, 1, 2048)
    K.floor_shared(None, 20224)  # the interpreter launches return no compiled kernel
    ck.packed_metadata = (4, 1)
    with pytest.raises(RuntimeError, match="shared memory third"):
        K.floor_shared(ck, 20224)


def test_tuned_verify_floors_are_sized_by_the_gpu_and_left_off_where_unmeasured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``generate.verify_floors`` (``tuning.VERIFY_SMEM_CAPS``): on an sm_90 GPU a cap of 2
    programs an SM becomes the bytes that let 2 fit and not 3 in its shared memory an SM (the
    H200's 228 KB: 77,056); none on the CPU, on another architecture, where Triton's launch
    metadata is not understood, or where the floor exceeds what one program may ask for."""
    from types import SimpleNamespace

    from openjarvis.engine.torch import generate as G

    h200 = SimpleNamespace(shared_memory_per_multiprocessor=233472,
                           shared_memory_per_block_optin=232448)
    caps = {"combine": 2, "wo": 2, "qkv": 4}
    cuda = torch.device("cuda", 0)
    assert G.verify_floors(caps, torch.device("cpu")) == {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: h200)
    monkeypatch.setattr(K, "floor_supported", lambda: True)
    floors = G.verify_floors(caps, cuda)
    assert floors == {("combine", True): 77056, ("wo", True): 77056, ("qkv", True): 45824}
    for n, nbytes in ((2, 77056), (4, 45824)):
        assert (233472 // (nbytes + 1024), 233472 // (nbytes - 256 + 1024)) == (n, n + 1)
    assert G.verify_floors({}, cuda) == {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    assert G.verify_floors(caps, cuda) == {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    small = SimpleNamespace(shared_memory_per_multiprocessor=233472,
                            shared_memory_per_block_optin=49152)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: small)
    assert G.verify_floors(caps, cuda) == {}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: h200)
    monkeypatch.setattr(K, "floor_supported", lambda: False)
    assert G.verify_floors(caps, cuda) == {}


def test_a_runner_refuses_a_shared_memory_floor_its_step_would_drop() -> None:
    """``Runner.smem_floor``: a kernel the step does not launch (a typo; the RoPE kernel in a
    step whose qkv is not split over K) is refused with a line naming it, not timed as the
    default; floors on kernels it launches compute the reference logits (the interpreter
    launches no compiled kernel to floor), and a bad cache policy is refused the same way."""
    model = _model()
    seq, ref = _seq_and_ref(model, 9, seed=2)
    r = Runner(model, 64, kernels="triton", nsplit=4)
    r.smem_floor = {("out", False): 1024}
    with pytest.raises(ValueError, match="the kernels are qkv, rope, combine, wo, w13 and w2"):
        r.logits(seq[:1], 0)
    r.smem_floor = {("rope", True): 1024}
    with pytest.raises(ValueError, match="does not launch that kernel"):
        r.logits(seq[:6], 0)
    r.qkv_split = K.LinearConfig(16, 32, split_k=2)
    r.smem_floor = {("qkv", False): 40960, ("w13", True): 20224, ("w2", False): 1024,
                    ("combine", True): 75776, ("combine", False): 1024, ("qkv", True): 1024,
                    ("rope", True): 1024}
    rows = [r.logits(seq[:6], 0).clone(), r.logits(seq[6:7], 6).clone(), r.logits(seq[7:], 7)]
    assert rel(torch.cat(rows), ref) < 1e-5
    r.weight_evict = "cg"
    r.drop_steps()
    with pytest.raises(ValueError, match="cache policy"):
        r.logits(seq[:1], 0)


def test_the_trace_gives_each_launch_the_next_slots_and_refuses_to_overflow() -> None:
    """``kernels._trace`` (scripts/trace_step.py): off, a launch gets no slots and no TRACE
    constant; on, consecutive launches get consecutive ranges of ``progs`` slots, and a launch
    past the buffer's end is refused rather than writing past it."""
    dummy = torch.zeros(1)
    assert K._trace(dummy) == ((dummy, 0), {})
    with K.tracing(3, 8, "cpu") as buf:
        assert tuple(buf.shape) == (3 * 8, K.TRACE_WIDTH)
        for i in range(3):
            (ptr, base), const = K._trace(dummy)
            assert ptr is buf and base == 8 * i and const == {"TRACE": 8}
        with pytest.raises(ValueError, match="holds 3 launches"):
            K._trace(dummy)
    assert K._trace(dummy) == ((dummy, 0), {})  # closed: off again


@pytest.mark.parametrize("mode", [0, 3])
def test_the_read_ceiling_kernel_sums_every_byte_and_reads_no_more_than_asked(mode: int) -> None:
    # scripts/bench_read_size.py's times are a ceiling only if its kernel reads exactly the
    # product's bytes: checked here, in Triton's interpreter, on a size no tile divides, in
    # several tiles a program (mode 3: the first before the wait, the loop the rest; the PDL
    # calls themselves left out, as the interpreter has none)
    import bench_read_size as br

    nbytes, programs = 2 * 10_007, 5
    per = br.layout(nbytes, programs)
    assert per % 16 == 0 and nbytes <= programs * per * 2 <= nbytes + programs * 32
    w = torch.randn(programs * per, dtype=torch.bfloat16)
    out = torch.full((programs,), float("nan"))
    br._read[(programs,)](w, out, per, MODE=mode, BLOCK=512, GDC=0)
    assert torch.allclose(out, w.float().view(programs, per).sum(1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("mode", [0, 3])
def test_the_flat_gate_up_candidate_computes_swiglu_with_ragged_rows_and_columns(mode: int) -> None:
    # scripts/bench_gateup.py times it against ours only after this check passes on the GPU;
    # here its masks are checked where no tile divides the shape, in two K tiles (mode 3: the
    # first tile's weights before the wait, without the PDL calls the interpreter lacks)
    import bench_gateup as bg

    n, k = 13, 300
    w = (torch.randn(2 * n, k) * 0.1).to(torch.bfloat16)
    x = torch.randn(1, k)
    out = torch.full((1, n), float("nan"))
    bg._flat_swiglu[((n + 3) // 4,)](x, w, out, n, k, MODE=mode, RB=4, BK=256, GDC=0)
    want = bg.reference(x, w)
    assert torch.allclose(out.reshape(-1), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("swiglu", "mode", "blocks"),
                         [(False, 0, 1), (False, 3, 2), (True, 0, 4), (True, 3, 2)])
def test_the_q4k_product_reads_gguf_blocks_as_llama_cpp_decodes_them(swiglu: bool, mode: int,
                                                                      blocks: int) -> None:
    # scripts/bench_q4k.py times a product that reads Q4_K blocks as the file lays them out;
    # here it must agree with a float32 product over dequant.py's decode of the same bytes
    # (the backend's load path): rows no tile divides, three blocks a row taken 1, 2 or 4 an
    # iteration (the last chunk partly past the row), mode 3 (the first chunk's bytes before
    # the wait, the loop the rest), every 6-bit scale and min form (sub-blocks 0-3 and 4-7)
    # exercised by random bytes; then adding into a residual, also split over K
    import bench_q4k as bq

    n, k, nb = 5, 3 * 256, 3
    g = torch.Generator().manual_seed(7)
    w = bq.random_blocks(2 * n if swiglu else n, k, "cpu", g)
    x = torch.randn(k, generator=g)
    want = bq.reference(x, bq.decoded(w, k), swiglu)
    w32 = w.view(torch.int32)
    out = torch.full((n,), POISON)
    bq._q4k_product[((n + 3) // 4, 1)](x, w32, out, n, w32.shape[1], nb, SWIGLU=swiglu,
                                        ADD=False, MODE=mode, RB=4, BB=blocks, SPLIT=1, GDC=0)
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-5)
    out = torch.full((n,), POISON)  # x in nibble order, the loop in the words' layout
    bq._q4k_product[((n + 1) // 2, 1)](bq.nibble_order(x), w32, out, n, w32.shape[1], nb,
                                        SWIGLU=swiglu, ADD=False, MODE=mode, RB=2, BB=blocks,
                                        SPLIT=1, XP=1, GDC=0)
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-5)
    for magic in (0, 1):  # run 228's kernel, kept to compare, with and without I2F
        out = torch.full((n,), POISON)
        bq._q4k_bytes[((n + 3) // 4, 1)](x, w, w32, out, n, w.shape[1], nb, SWIGLU=swiglu,
                                          ADD=False, MODE=mode, RB=4, BB=blocks, SPLIT=1,
                                          MAGIC=magic, GDC=0)
        assert torch.allclose(out, want, rtol=1e-4, atol=1e-5)
    if swiglu:
        return
    for split, xp in ((1, 0), (2, 0), (2, 1)):
        base = torch.randn(n, generator=g)
        out = base.clone()
        bq._q4k_product[((n + 1) // 2, split)](bq.nibble_order(x) if xp else x, w32, out, n,
                                                w32.shape[1], nb, SWIGLU=False, ADD=True,
                                                MODE=mode, RB=2, BB=1, SPLIT=split, XP=xp,
                                                GDC=0)
        assert torch.allclose(out, base + want, rtol=1e-4, atol=1e-5)
    for split, magic in ((1, 0), (2, 1)):  # run 228's kernel through its wrapper, adding
        base = torch.randn(n, generator=g)
        out = base.clone()
        bq.q4k_bytes(x, w, out, swiglu=False, add=True, mode="pre" if mode else "pdl", rows=2,
                     blocks=2, split=split, warps=1, magic=bool(magic), gdc=False)
        assert torch.allclose(out, base + want, rtol=1e-4, atol=1e-5)
    out = torch.full((n,), POISON)  # and the word forms' wrapper
    bq.q4k_product(bq.nibble_order(x), w, out, swiglu=False, add=False, mode="pdl", rows=4,
                   blocks=2, split=1, warps=1, xp=True, gdc=False)
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-5)


def _assert_adds_into_the_residual(launch: Callable[[torch.Tensor, int], None],
                                   want: torch.Tensor, splits: tuple[int, ...],
                                   g: torch.Generator) -> None:
    """A product that adds (``launch(out, split)``) must leave residual + its product, whole
    or split over K."""
    for split in splits:
        base = torch.randn(want.numel(), generator=g)
        out = base.clone()
        launch(out, split)
        assert torch.allclose(out, base + want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("swiglu", "mode"), [(False, "pdl"), (False, "pre"), (True, "pre")])
def test_the_repacked_q4k_product_computes_the_blocks_times_int8_x(swiglu: bool,
                                                                   mode: str) -> None:
    # run 231's form: the blocks repacked rows-contiguous and x quantized to int8 words a group
    # of 32; its products must equal, to float32 rounding, the file's decode (dequant.py) times
    # the x those words stand for (the mins times x itself), for rows no tile divides, three
    # blocks a row taken 1, 2 or 4 an iteration, SwiGLU pairs interleaved, and adding into a
    # residual whole or split over K; and stay within x's int8 rounding of the float product
    import bench_q4k as bq

    n, k = 10, 3 * 256
    g = torch.Generator().manual_seed(11)
    w = bq.random_blocks(2 * n if swiglu else n, k, "cpu", g)
    x = torch.randn(k, generator=g)
    xq = bq.quantize_x(x)
    assert xq[0].view(torch.int8).reshape(-1, 32).abs().amax(1).eq(127).all()  # full scale
    want = bq.reference_q(xq, x, w, swiglu)
    packed = bq.repack(w, swiglu)
    for rows, blocks in ((8, 1), (16, 2), (32, 4)):
        out = torch.full((n,), POISON)
        bq.q4kr_product(xq, packed, out, swiglu=swiglu, add=False, mode=mode, rows=rows,
                        blocks=blocks, split=1, warps=1, gdc=False)
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
    exact = bq.reference(x, bq.decoded(w, k), swiglu)
    assert ((out - exact).norm() / exact.norm()).item() < 2e-2
    if swiglu:
        return
    def q4kr(out: torch.Tensor, split: int) -> None:
        bq.q4kr_product(xq, packed, out, swiglu=False, add=True, mode=mode, rows=8, blocks=1,
                        split=split, warps=1, gdc=False)

    _assert_adds_into_the_residual(q4kr, want, (1, 2), g)


@pytest.mark.parametrize("mode", ["pdl", "pre"])
def test_the_repacked_q6k_product_computes_the_blocks_times_int8_x(mode: str) -> None:
    # run 232's Q6_K form: ql's nibbles and qh's 2-bit pairs regrouped so that a thread's
    # words make whole sub-blocks, the offset of 32 taken off through x's int8 sums; it must
    # equal dequant.py's decode times the x the int8 words stand for, stored or added (also
    # split over K), for rows no tile divides and three blocks taken 1, 2 or 4 at a time
    import bench_q4k as bq

    n, k = 10, 3 * 256
    g = torch.Generator().manual_seed(5)
    w = bq.random_blocks6(n, k, "cpu", g)
    w.view(n, -1, bq.Q6_BYTES)[::2, :, 209] |= 0x80  # d negative in half the rows (as files)
    x = torch.randn(k, generator=g)
    xq = bq.quantize_x(x)
    want = bq.reference6(xq, w)
    packed = bq.repack6(w)
    for rows, blocks in ((8, 1), (16, 2), (32, 4)):
        out = torch.full((n,), POISON)
        bq.q6kr_product(xq, packed, out, add=False, mode=mode, rows=rows, blocks=blocks,
                        split=1, warps=1, gdc=False)
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
    exact = bq._q6_k(w.reshape(-1, bq.Q6_BYTES)).reshape(n, k) @ x
    assert ((out - exact).norm() / exact.norm()).item() < 2e-2
    for split in (1, 2):
        base = torch.randn(n, generator=g)
        out = base.clone()
        bq.q6kr_product(xq, packed, out, add=True, mode=mode, rows=8, blocks=1, split=split,
                        warps=1, gdc=False)
        assert torch.allclose(out, base + want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="do not match x"):
        bq.q6kr_product(bq.quantize_x(torch.randn(512)), packed, out, add=True, mode=mode,
                        rows=8, blocks=1, split=1, warps=1, gdc=False)


def test_the_quantizing_kernel_writes_what_quantize_x_computes() -> None:
    # bench_q4k --layers quantizes each product's input on the GPU: the same int8 words and
    # int sums as quantize_x (rounding half to even, IEEE division), the same scales, the
    # groups' float sums to summation order; an all-zero group, a last program partly past
    # the groups, float32 and bf16 inputs
    import bench_q4k as bq

    g = torch.Generator().manual_seed(3)
    x = torch.randn(50 * 32, generator=g) * 3
    x[32:64] = 0
    x[64:96] = torch.linspace(-1.0, 1.0, 32)  # group 2: a scale of 1/127, exactly
    x[70] = 62.5 / 127  # (x / s = 62.5 exactly: half to even rounds to 62, away from zero 63)
    for xx in (x, x.to(torch.bfloat16)):
        want = bq.quantize_x(xx.float())
        got = bq.empty_xq(xx.numel(), "cpu")
        bq.quantize_into(xx, got, groups=8, gdc=False)
        if xx.dtype == torch.float32:
            assert got[0].view(torch.int8)[70] == 62
        assert torch.equal(got[0], want[0]) and torch.equal(got[3], want[3])
        assert torch.equal(got[1], want[1])
        assert torch.allclose(got[2], want[2], rtol=1e-6, atol=1e-5)


def test_the_repacked_gate_up_can_write_its_output_quantized() -> None:
    # --layers' fused variant: gate/up in 64 interleaved rows a program (32 outputs, one group)
    # also writes its SwiGLU output as the down projection's int8 input, exactly what
    # quantize_x makes of the outputs it stores
    import bench_q4k as bq

    n, k = 64, 2 * 256
    g = torch.Generator().manual_seed(13)
    w = bq.random_blocks(2 * n, k, "cpu", g)
    xq = bq.quantize_x(torch.randn(k, generator=g))
    out = torch.full((n,), POISON)
    qout = bq.empty_xq(n, "cpu")
    bq.q4kr_product(xq, bq.repack(w, True), out, swiglu=True, add=False, mode="pre", rows=64,
                    blocks=1, split=1, warps=2, qout=qout, gdc=False)
    want = bq.quantize_x(out)
    assert not out.isnan().any()
    for got, exp in zip(qout, want, strict=True):
        assert torch.allclose(got.float(), exp.float(), rtol=1e-6, atol=1e-6)
    assert torch.equal(qout[0], want[0])
    with pytest.raises(ValueError, match="quantized output"):
        bq.q4kr_product(xq, bq.repack(w, True), out, swiglu=True, add=False, mode="pre",
                        rows=32, blocks=1, split=1, warps=1, qout=qout, gdc=False)


@pytest.mark.parametrize(("fmt", "swiglu"),
                         [("q5_0", False), ("q5_0", True), ("q8_0", False), ("q8_0", True)])
def test_the_repacked_32_weight_blocks_compute_the_decode_times_int8_x(fmt: str,
                                                                       swiglu: bool) -> None:
    # run 237's forms for the 0.5B's file: Q5_0 (its fifth bits regrouped so that a word's
    # four sit at one bit of each byte) and Q8_0, blocks of 32 four to a tile; equal to
    # dequant.py's decode times the x the int8 words stand for, rows no tile divides, three
    # superblocks of 128 taken 1, 2 or 4 at a time, SwiGLU pairs, added whole or split, and a
    # SwiGLU output quantized for the next product
    import bench_q4k as bq

    n, k = 10, 3 * 128
    g = torch.Generator().manual_seed(17)
    w = bq.random_blocks32(2 * n if swiglu else n, k, fmt, "cpu", g)
    size = bq.Q8_BYTES if fmt == "q8_0" else bq.Q5_BYTES
    w.view(w.shape[0], -1, size)[:, 1::3, 1] |= 0x80  # some blocks' d negative
    x = torch.randn(k, generator=g)
    xq = bq.quantize_x(x)
    xd = bq.x_words(xq)
    want = bq.reference(xd, bq.decoded32(w, k, fmt), swiglu)
    packed = bq.repack32(w, fmt, swiglu)
    for rows, blocks in ((8, 1), (16, 2), (32, 4)):
        out = torch.full((n,), POISON)
        bq.q32r_product(xq, packed, out, fmt=fmt, swiglu=swiglu, add=False, rows=rows,
                        blocks=blocks, split=1, warps=1, gdc=False)
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
    if swiglu:
        n = 64
        w = bq.random_blocks32(2 * n, k, fmt, "cpu", g)
        out = torch.full((n,), POISON)
        qout = bq.empty_xq(n, "cpu")
        bq.q32r_product(xq, bq.repack32(w, fmt, True), out, fmt=fmt, swiglu=True, add=False,
                        rows=64, blocks=1, split=1, warps=2, qout=qout, gdc=False)
        assert torch.allclose(out, bq.reference(xd, bq.decoded32(w, k, fmt), True), rtol=1e-5,
                              atol=1e-6)
        assert torch.equal(qout[0], bq.quantize_x(out)[0])
        return
    def q32r(out: torch.Tensor, split: int) -> None:
        bq.q32r_product(xq, packed, out, fmt=fmt, swiglu=False, add=True, rows=8, blocks=1,
                        split=split, warps=1, gdc=False)

    _assert_adds_into_the_residual(q32r, want, (1, 3), g)
    with pytest.raises(ValueError, match="do not match x"):
        bq.q32r_product(bq.quantize_x(torch.randn(256)), packed, out, fmt=fmt, swiglu=False,
                        add=True, rows=8, blocks=1, split=1, warps=1, gdc=False)


@pytest.mark.parametrize("swiglu", [False, True])
def test_the_repacked_q4k_probe_adds_the_products_of_several_rows_of_x(swiglu: bool) -> None:
    # --tprobe times a verify step's arithmetic on one step's bytes: T rows of x, each row's
    # product (its own int8 scales) added into one, so the result is the sum of the rows'
    # products (SwiGLU over the summed halves); a row count x does not hold is refused
    import bench_q4k as bq

    n, k, t = 10, 3 * 256, 3
    g = torch.Generator().manual_seed(19)
    w = bq.random_blocks(2 * n if swiglu else n, k, "cpu", g)
    x = torch.randn(t, k, generator=g) * torch.tensor([[1.0], [10.0], [0.1]])
    lin = sum(bq.reference_q(bq.quantize_x(r), r, w, False) for r in x)
    want = torch.nn.functional.silu(lin[:n]) * lin[n:] if swiglu else lin
    out = torch.full((n,), POISON)
    packed = bq.repack(w, swiglu)
    bq.q4kr_product(bq.quantize_rows(x), packed, out, swiglu=swiglu, add=False, mode="pre",
                    rows=16, blocks=2, split=1, warps=1, gdc=False, tokens=t)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="3 rows"):
        bq.q4kr_product(bq.quantize_rows(x[:2]), packed, out, swiglu=swiglu, add=False,
                        mode="pre", rows=16, blocks=2, split=1, warps=1, gdc=False, tokens=3)


@pytest.mark.parametrize("form", ["q4km", "q4kd", "q4kdw", "q4kdm"])
@pytest.mark.parametrize(("swiglu", "add", "split"),
                         [(False, False, 1), (False, True, 1), (False, True, 2), (True, False, 1)])
def test_the_q4k_verify_form_gives_each_row_of_x_its_own_product(form: str, swiglu: bool,
                                                                  add: bool, split: int) -> None:
    # session 28's verify forms: T rows of x through a matrix product a sub-block, q4km in
    # int8, q4kd over the weights decoded to bf16 in registers (q4kdw: one product a block, x
    # in the nibbles' order; q4kdm: the nibbles made floats by their bits); each row's output
    # must equal,
    # to float32 rounding, the file's decode times the x its own int8 words stand for (the
    # mins times x itself), or the bf16 weights load-time decoding gives times bf16 x, for
    # rows no tile divides (40 in tiles of 32), rows of x at three scales, a negative d,
    # SwiGLU pairs interleaved, stored, added or split over K; the padded rows of the tile are
    # never written
    import bench_q4k as bq

    n, k, t = 40 if not swiglu else 20, 3 * 256, 3
    g = torch.Generator().manual_seed(23)
    w = bq.random_blocks(2 * n if swiglu else n, k, "cpu", g)
    w.view(-1, 3, bq.BLOCK_BYTES)[:, 1, 1] |= 0x80  # block 1's d negative in every row
    x = torch.randn(t, k, generator=g) * torch.tensor([[1.0], [10.0], [0.1]])
    if form == "q4km":
        want = torch.stack([bq.reference_q(bq.quantize_x(r), r, w, swiglu) for r in x])
        xm = bq.quantize_cols(x)
    else:
        want = bq.reference_d(x, w, swiglu)
        xm = bq.bf16_cols(x, nibble=form == "q4kdw")
    base = torch.randn(t + 1, n, generator=g) if add else torch.full((t + 1, n), POISON)
    out = base.clone()
    bq.q4km_product(xm, bq.repack_mma(w, swiglu), out, tokens=t, swiglu=swiglu, add=add,
                    rows=32, split=split, warps=1, gdc=False, whole=form == "q4kdw",
                    bits=form == "q4kdm")
    assert torch.allclose(out[:t], (base[:t] if add else 0) + want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[t:].isnan(), base[t:].isnan())  # the row past T untouched
    if add:
        assert torch.equal(out[t:], base[t:])
    exact = torch.stack([bq.reference(r, bq.decoded(w, k), swiglu) for r in x])
    assert ((want - exact).norm() / exact.norm()) < 3e-2  # x's rounding, no more


@pytest.mark.parametrize("form", ["q4km", "q4kdw"])
def test_the_q4k_verify_forms_split_a_swiglu_product_as_plain_rows(form: str) -> None:
    # run_mma's _lin: the SwiGLU product's interleaved rows (gate 0, up 0, gate 1, ...) as a
    # plain product split over K into float32, a full tile of 16 rows of x; and the SwiGLU
    # product itself into bf16 (the real output type) for one row of x
    import bench_q4k as bq

    n, k = 24, 3 * 256
    g = torch.Generator().manual_seed(29)
    w = bq.random_blocks(2 * n, k, "cpu", g)
    packed = bq.repack_mma(w, True)
    x = torch.randn(16, k, generator=g)
    wl = bq.interleaved(w)
    if form == "q4km":
        xm = bq.quantize_cols(x)
        want = torch.stack([bq.reference_q(bq.quantize_x(r), r, wl, False) for r in x])
    else:
        xm = bq.bf16_cols(x, nibble=True)
        want = bq.reference_d(x, wl, False)
    out = torch.zeros(16, 2 * n)
    bq.q4km_product(xm, packed, out, tokens=16, swiglu=False, add=True, rows=16, split=3,
                    warps=1, gdc=False, whole=form == "q4kdw")
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)
    one = torch.full((1, n), POISON, dtype=torch.bfloat16)
    xm1 = (bq.quantize_cols(x[:1]) if form == "q4km"
           else bq.bf16_cols(x[:1], nibble=True))
    bq.q4km_product(xm1, packed, one, tokens=1, swiglu=True, add=False, rows=16, split=1,
                    warps=1, gdc=False, whole=form == "q4kdw")
    lin = want[0]
    act = torch.nn.functional.silu(lin[0::2]) * lin[1::2]
    assert torch.allclose(one.float()[0], act, rtol=1e-2, atol=1e-3)  # (bf16 output)


def test_the_q4k_verify_form_refuses_what_it_cannot_hold() -> None:
    import bench_q4k as bq

    w = bq.repack_mma(bq.random_blocks(32, 512, "cpu"), False)
    with pytest.raises(ValueError, match="do not fit a tile of 16"):
        bq.quantize_cols(torch.randn(17, 512))
    with pytest.raises(ValueError, match="do not fit a tile of 16"):
        bq.bf16_cols(torch.randn(17, 512))
    with pytest.raises(ValueError, match="do not match x"):
        bq.q4km_product(bq.quantize_cols(torch.randn(2, 256)), w, torch.zeros(2, 32), tokens=2,
                        swiglu=False, add=False, rows=32, split=1, warps=1, gdc=False)
    with pytest.raises(ValueError, match="do not match x"):  # more tokens than the tile holds
        bq.q4km_product(bq.quantize_cols(torch.randn(2, 512), bt=2), w, torch.zeros(3, 32),
                        tokens=3, swiglu=False, add=False, rows=32, split=1, warps=1,
                        gdc=False)
    with pytest.raises(ValueError, match="adds into float32"):
        bq.q4km_product(bq.quantize_cols(torch.randn(2, 512)), w, torch.zeros(2, 32), tokens=2,
                        swiglu=False, add=False, rows=32, split=2, warps=1, gdc=False)
    with pytest.raises(ValueError, match="does not hold"):
        bq.q4km_product(bq.quantize_cols(torch.randn(2, 512)), w, torch.zeros(2, 16), tokens=2,
                        swiglu=False, add=False, rows=32, split=1, warps=1, gdc=False)
    with pytest.raises(ValueError, match="powers of two"):
        bq.q4km_product(bq.quantize_cols(torch.randn(2, 512)), w, torch.zeros(2, 32), tokens=2,
                        swiglu=False, add=False, rows=24, split=1, warps=1, gdc=False)
    with pytest.raises(ValueError, match="are q4kd's"):
        bq.q4km_product(bq.bf16_cols(torch.randn(2, 512)), w, torch.zeros(2, 32), tokens=2,
                        swiglu=False, add=False, rows=32, split=1, warps=1, gdc=False,
                        whole=True, bits=True)
    with pytest.raises(ValueError, match="needs bf16 x"):
        bq.q4km_product(bq.quantize_cols(torch.randn(2, 512)), w, torch.zeros(2, 32), tokens=2,
                        swiglu=False, add=False, rows=32, split=1, warps=1, gdc=False,
                        whole=True)


def test_the_repacked_q4k_product_refuses_mismatched_shapes() -> None:
    import bench_q4k as bq

    w = bq.random_blocks(4, 512, "cpu")
    packed = bq.repack(w, False)
    with pytest.raises(ValueError, match="do not match x"):
        bq.q4kr_product(bq.quantize_x(torch.randn(256)), packed, torch.zeros(4), swiglu=False,
                        add=False, mode="pdl", rows=8, blocks=1, split=1, warps=1, gdc=False)
    with pytest.raises(ValueError, match="adds into float32"):
        bq.q4kr_product(bq.quantize_x(torch.randn(512)), packed, torch.zeros(4), swiglu=False,
                        add=False, mode="pdl", rows=8, blocks=1, split=2, warps=1, gdc=False)


def test_the_q4k_product_refuses_rows_that_are_not_whole_blocks() -> None:
    import bench_q4k as bq

    w = torch.zeros(4, 144, dtype=torch.uint8)
    with pytest.raises(ValueError, match="Q4_K blocks"):
        bq.q4k_product(torch.zeros(512), w, torch.zeros(4), swiglu=False, add=False,
                       mode="pdl", rows=4, blocks=1, split=1, warps=1, gdc=False)
    with pytest.raises(ValueError, match="adds into float32"):
        bq.q4k_product(torch.zeros(256), w, torch.zeros(4), swiglu=False, add=False,
                       mode="pdl", rows=4, blocks=1, split=2, warps=1, gdc=False)
    with pytest.raises(ValueError, match="adds into float32"):
        bq.q4k_bytes(torch.zeros(256), w, torch.zeros(4, dtype=torch.bfloat16), swiglu=False,
                     add=True, mode="pdl", rows=4, blocks=1, split=2, warps=1, magic=False,
                     gdc=False)
