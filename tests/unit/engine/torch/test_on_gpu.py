"""The GPU steps themselves, on a CUDA GPU (skipped elsewhere, so in CI): the Triton kernels in
every PDL mode, the default Triton steps and the persistent CUDA step, each against float32 of
the same random bf16 weights. ``scripts/bench_*.py`` print the same checks beside their
timings; these assert them. Run on the lent H200 with
``python3 -m pytest -q tests/unit/engine/torch/test_on_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from openjarvis.engine.torch.config import QWEN25_0_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer, rms_norm  # noqa: E402
from openjarvis.engine.torch.weights import cast, random_weights  # noqa: E402

#: bf16 against float32 of the same weights: the step's own rounding (about 5e-3 measured for
#: the default pair's shapes, docs/gpu-notes.md), with room; a kernel reading a buffer before
#: its producer has written it lands far outside.
BF16_REL = 2e-2
A = QWEN25_0_5B


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def pdl_modes() -> list[int]:
    from openjarvis.engine.torch.kernels import PDL_AFTER_WAIT, PDL_LATE, pdl_supported

    return [0, 3, 3 + PDL_LATE] + ([1, 2, 1 + PDL_LATE, 2 + PDL_LATE, 1 + PDL_AFTER_WAIT,
                                    2 + PDL_AFTER_WAIT] if pdl_supported() else [])


#: Tiles the test below runs besides the default: the swapped MMA operands (T > 1 only), and
#: the one-token row layout (T = 1 only; the 1.5B's gate/up and down) with prefetch and segments,
#: and its sums kept a lane at a time (``LinearConfig.lanes``).
_TILES = ("default", "swap", "rows", "rows_prefetch", "segments_prefetch", "lanes",
          "lanes_prefetch")


@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("t", [1, 9])
def test_linear_kernels_agree_with_float32_in_every_pdl_mode(t: int, tile: str) -> None:
    """Each mode launches and waits differently (the prologue modes load the first weight tile
    before the wait); the sums must not change (real 0.5B widths: K = 896, three and a half
    256-wide tiles in the row layout)."""
    from openjarvis.engine.torch import kernels as K

    if tile == "swap" and t == 1:
        pytest.skip("swapped operands serve T > 1 only")
    if tile not in ("default", "swap") and t > 1:
        pytest.skip("the row layout serves T = 1 only")
    cfg = {"default": None, "swap": K.LinearConfig(64, 64, 4, 3, swap=True),
           "rows": K.LinearConfig(8, 256, rows=True),
           "rows_prefetch": K.LinearConfig(8, 256, rows=True, prefetch=True),
           "segments_prefetch": K.LinearConfig(4, 512, rows=True, prefetch=True, segments=2),
           "lanes": K.LinearConfig(8, 256, rows=True, lanes=True),
           "lanes_prefetch": K.LinearConfig(8, 256, rows=True, prefetch=True, lanes=True),
           }[tile]
    g = torch.Generator(device="cuda").manual_seed(0)
    n, k = A.n_ff, A.n_embd
    x = torch.randn(t, k, device="cuda", generator=g)
    w = (torch.randn(2 * n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    norm = torch.rand(k, device="cuda", generator=g) + 0.5
    y = rms_norm(x, norm, 1e-6) @ w.float().T
    ref = torch.nn.functional.silu(y[:, :n]) * y[:, n:]
    for mode in pdl_modes():
        out = torch.full((t, n), float("nan"), device="cuda")
        K.linear(x, w, out, mode=K.SWIGLU, norm=norm, eps=1e-6, cfg=cfg, pdl=mode)
        torch.cuda.synchronize()
        assert not out.isnan().any(), f"PDL mode {mode} left outputs unwritten"
        assert rel(out, ref) < 1e-2, f"PDL mode {mode}"


@pytest.fixture(scope="module")
def pair() -> tuple[Transformer, Runner, list[int], torch.Tensor]:
    """0.5B shapes, random bf16 weights; a float32 reference of the same weights over a prompt
    and the tokens the tests step through."""
    model, toks, expect = _bf16_case(n_pos=512, n=320, seed=0)
    return model, Runner(model, 256), toks, expect


def _bf16_case(n_pos: int, n: int, seed: int) -> tuple[Transformer, list[int], torch.Tensor]:
    """0.5B shapes with random bf16 weights, n random tokens, and the logits of every one of
    them from a float32 copy of the same weights (the torch reference, uncaptured)."""
    a: ModelArgs = A
    w = random_weights(a, torch.bfloat16, "cuda", seed=seed)
    model = Transformer(a, w, n_pos=n_pos)
    gen = torch.Generator().manual_seed(seed + 1)
    toks = torch.randint(0, a.n_vocab, (n,), generator=gen).tolist()
    ref = Runner(Transformer(a, cast(w, torch.float32), n_pos=n_pos), n_pos - 128,
                 kernels="torch", graphs=False)
    return model, toks, ref.logits(toks, 0).clone()


def test_default_triton_steps_agree_with_float32(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    """A prompt in chunks, one-token steps, then a k = 8 verify step, with the GPU defaults
    (PDL with late triggers, tuned tiles, split-K qkv): close to float32, same top-1 almost
    everywhere, every logit written."""
    model, r, toks, expect = pair
    assert r.kernels == "triton" and r.graphs
    got = [r.logits(toks[:150], 0).clone()]
    for i in range(150, 160):
        got.append(r.logits(toks[i : i + 1], i).clone())
    got.append(r.logits(toks[160:169], 160).clone())
    out = torch.cat(got)
    ref = expect[:169]
    assert torch.isfinite(out).all()
    assert rel(out, ref) < BF16_REL
    assert float((out.argmax(-1) == ref.argmax(-1)).float().mean()) > 0.95


@pytest.mark.parametrize("setting", ["handoff", "plain"])
def test_one_token_steps_with_and_without_the_norm_hand_off_agree_with_float32(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], setting: str) -> None:
    """The o-projection handing the feed-forward norm to gate/up (the default for these shapes),
    and gate/up normalizing itself: the same closeness to float32 (PDL, tuned tiles)."""
    model, _, toks, expect = pair
    r = Runner(model, 256)
    assert r.norm_handoff  # tuning.NORM_HANDOFF holds the default pair's shapes
    r.norm_handoff = setting != "plain"
    r.logits(toks[:170], 0)
    out = torch.cat([r.logits(toks[i : i + 1], i).clone() for i in range(170, 180)])
    assert (r._steps[1].ss_part is not None) == r.norm_handoff  # the hand-off ran, or did not
    assert torch.isfinite(out).all()
    assert rel(out, expect[170:180]) < BF16_REL
    assert float((out.argmax(-1) == expect[170:180].argmax(-1)).float().mean()) > 0.95


@pytest.mark.parametrize("warps", [1, 2, 4, 8])
def test_one_token_steps_with_the_qkv_kernel_on_any_warps_agree_with_float32(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], warps: int) -> None:
    """``Runner.qkv_warps`` (the 0.5B's one-token default is one warp, ``tuning.QKV_WARPS``:
    its reductions then cross no warps): the same closeness to float32 on every count."""
    model, _, toks, expect = pair
    r = Runner(model, 256)
    assert r.qkv_warps == {1: 1}  # tuning.QKV_WARPS holds the 0.5B's shapes
    r.qkv_warps = {1: warps}
    r.logits(toks[:170], 0)
    out = torch.cat([r.logits(toks[i : i + 1], i).clone() for i in range(170, 180)])
    assert torch.isfinite(out).all()
    assert rel(out, expect[170:180]) < BF16_REL
    assert float((out.argmax(-1) == expect[170:180].argmax(-1)).float().mean()) > 0.95


@pytest.mark.parametrize("after", [0, 1, 2])
def test_one_token_steps_asking_l2_for_gate_up_compute_the_same_logits(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], after: int) -> None:
    """``Runner.l2_prefetch`` (the 1.5B's default, ``tuning.L2_PREFETCH``; here on the 0.5B's
    shapes, from each point of the layer it can start at): its side stream joins the step's
    graph, and the logits are bit for bit those of the same deterministic step without it.
    With the merge fused into the o-projection (atomics: not bit-reproducible), as close to
    float32 as the default."""
    model, _, toks, expect = pair
    outs = []
    for pf, fused in ((None, False), ((2.0, 64, after), False), ((2.0, 64, after), True)):
        r = Runner(model, 256)
        if fused:
            r.fuse_attn_out = True
        else:
            r.make_deterministic()
        r.l2_prefetch = pf
        r.logits(toks[:170], 0)
        outs.append(torch.cat([r.logits(toks[i : i + 1], i).clone() for i in range(170, 180)]))
        assert (r._prefetch_stream is not None) == (pf is not None)  # the prefetch ran
    assert torch.equal(outs[0], outs[1])
    for out in outs[1:]:
        assert rel(out, expect[170:180]) < BF16_REL
        assert float((out.argmax(-1) == expect[170:180].argmax(-1)).float().mean()) > 0.95
    r.l2_prefetch = (2.0, 64, 3)  # no such point
    r.drop_steps(1)  # (a captured step replays its graph: the setting is read as it is built)
    with pytest.raises(ValueError, match="after in 0-2"):
        r.logits(toks[180:181], 180)


def test_a_persisting_l2_set_aside_past_the_gpus_largest_is_refused_by_name() -> None:
    """``cuda_step.set_persisting_l2`` (``bench_l2_keep.py``): the driver's own answer to too
    large a set-aside is "invalid argument" (session 36's run 302 met it at 40 MiB); ours names
    the largest the GPU grants. The largest itself is granted, and the set-aside given back."""
    from openjarvis.engine.torch import cuda_step

    most = cuda_step.max_persisting_l2()
    try:
        with pytest.raises(ValueError, match=rf"more than this GPU grants \({most} bytes"):
            cuda_step.set_persisting_l2(most + 2**20)
        assert cuda_step.set_persisting_l2(most) == most
    finally:
        cuda_step.set_persisting_l2(0)


def test_one_token_steps_with_gate_up_held_in_shared_memory_agree_with_float32(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    """scripts/bench_hold.py's held feed-forward (``Runner.ffn_hook``, session 19): each
    layer's gate/up computed on a side stream from weights a block an SM copied into shared
    memory during the chain, handed on through two flags: as close to float32 as the default
    step, no spin gave up, and the flags back at zero after every step (graph replays too)."""
    import bench_hold

    model, _, toks, expect = pair
    r = Runner(model, 256)
    hook = bench_hold.HeldFFN(model.args, bench_hold.HoldKernel(torch.device("cuda"), 100),
                              spread_us=4.0)
    calls = []
    gate_up = hook.gate_up
    hook.gate_up = lambda *a: (calls.append(a[0]), gate_up(*a))  # type: ignore[method-assign]
    r.ffn_hook = hook
    r.logits(toks[:170], 0)
    out = torch.cat([r.logits(toks[i : i + 1], i).clone() for i in range(170, 180)])
    torch.cuda.synchronize()
    assert calls[: model.args.n_layer] == list(range(model.args.n_layer))  # the hook ran
    assert int(hook.err.item()) == 0 and hook.flags.tolist() == [0, 0]
    assert torch.isfinite(out).all()
    assert rel(out, expect[170:180]) < BF16_REL
    assert float((out.argmax(-1) == expect[170:180].argmax(-1)).float().mean()) > 0.95
    r.fuse_attn_out = True  # no hand-off for the hook to read: refused, not silently skipped
    r.drop_steps(1)
    with pytest.raises(ValueError, match="ffn_hook needs the o-projection's norm hand-off"):
        r.logits(toks[180:181], 180)


@pytest.mark.parametrize("t", [1, 9])
def test_greedy_steps_give_the_argmax_of_the_deterministic_logits_steps(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], t: int) -> None:
    """``Runner.argmax`` (the output projection keeping only each program's maximum, then a
    merge kernel) against the argmax of the same deterministic step's logits: the same tokens
    wherever the logits' top two differ, which bit-identical logits make everywhere; among the
    tokenizer's columns only; and the greedy step's graph, replayed, gives them again."""
    model, _, toks, _ = pair
    r = Runner(model, 256)
    r.make_deterministic()
    r.screen_out = False  # (the screened pick: the tests after this one)
    r.greedy_cols = A.n_vocab - 271  # the tokenizer's 151,665 of 151,936 rows
    r.logits(toks[:150], 0)
    for i in range(150, 190, t):
        logits = r.logits(toks[i : i + t], i)[:, : r.greedy_cols].clone()
        ids = r.argmax(toks[i : i + t], i)
        assert ids.tolist() == logits.argmax(-1).tolist()
        r.replay(t, greedy=True)
        assert ids.tolist() == logits.argmax(-1).tolist()
        # the graph's own copy of them into page-locked memory (``graph_io``)
        assert r.graph_io and r.greedy_tokens(toks[i : i + t], i) == ids.tolist()
    assert r._greedy_steps[t].logits.numel() == 0  # no logits were written
    assert r.host(ids).tolist() == ids.tolist() and not r.host(ids).is_pinned()  # bytes
    pinned = r.host(logits)  # 600 KB a row: through page-locked memory (``pinned_io``)
    r.pinned_io = False
    pageable = r.host(logits)
    assert pinned.is_pinned() and not pageable.is_pinned() and torch.equal(pinned, pageable)
    want = r.argmax(toks[190 : 190 + t], 190).tolist()
    r.graph_io = False  # the copies around the graph instead: the same tokens
    assert not r._greedy_steps  # (the steps captured with them went)
    assert r.greedy_tokens(toks[190 : 190 + t], 190) == want
    r.graph_io, r.host_ids_direct = True, False  # a copy node instead of the merge's own store
    assert r.greedy_tokens(toks[190 : 190 + t], 190) == want


def _exact_logits(h: torch.Tensor, norm: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The output projection in float64 from the step's own final residual."""
    return rms_norm(h.double(), norm.double(), A.rms_eps) @ w.double().T


def _assert_exact_pick(ids: torch.Tensor, ref: torch.Tensor) -> None:
    """``ids`` are the argmax of ``ref`` (float64 logits), except where its top two are
    within float32 rounding of each other, and then a token of the top two."""
    top2 = ref.topk(2, dim=-1)
    picked = ref.gather(1, ids[:, None].long())[:, 0]
    assert (picked >= top2.values[:, 0] - 1e-4 * top2.values[:, 0].abs().clamp_min(1)).all()
    clear = (top2.values[:, 0] - top2.values[:, 1]) > 1e-3
    assert (ids == top2.indices[:, 0])[clear].all()


@pytest.mark.parametrize("k", [896, 1536, 3584])
@pytest.mark.parametrize("t", [1, 9])
def test_the_screen_picks_the_exact_argmax_in_every_pdl_mode(t: int, k: int) -> None:
    """``kernels.screen`` on the vocabulary's 151,936 rows of the 0.5B's and the 1.5B's widths
    (896, 1536: the screen is on by default for the 1.5B) and a wider one (3584: the limbs'
    kernel on 8 warps), in bf16 through the integer matrix instructions: the exact argmax of
    float64 logits, with rows the int8 copy cannot tell apart planted at the top."""
    from openjarvis.engine.torch import kernels as K

    g = torch.Generator(device="cuda").manual_seed(1)
    n = A.n_vocab
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    h = torch.randn(t, k, device="cuda", generator=g) * 4
    norm = torch.rand(k, device="cuda", generator=g) + 0.5
    for j in range(1, 9):  # near-copies of row 5000, in different rescoring programs
        w[5000 + 1100 * j] = w[5000] + (torch.randn(k, device="cuda", generator=g) * 1e-3
                                        ).to(torch.bfloat16)
    h[0] = w[5000].float() / norm * 3
    scr = K.screen_weights(w)
    ref = _exact_logits(h, norm, w)
    for mode in pdl_modes():
        cfg = K.default_screen_config(t)
        bufs = K.screen_buffers(t, n, k, cfg, "cuda")
        for b in (bufs.up, bufs.lo, bufs.partials, bufs.stats):
            b.fill_(float("nan"))
        bufs.limbs.fill_(-128)  # (no limb is ever -128: a screen reading these would show)
        K.screen(h, norm, scr, bufs, w, eps=A.rms_eps, cfg=cfg, pdl=mode)
        ids = K.argmax_merge(bufs.partials, torch.full((t,), -1, dtype=torch.int64,
                                                        device="cuda"))
        torch.cuda.synchronize()
        assert not bufs.partials.isnan().any() and not bufs.up.isnan().any(), f"mode {mode}"
        assert not (bufs.limbs == -128).any() and not bufs.stats.isnan().any(), f"mode {mode}"
        _assert_exact_pick(ids, ref)
        assert int((bufs.up[0] >= bufs.lo[0].max()).sum()) >= 9  # all near-copies rescored


@pytest.mark.parametrize("t", [1, 9])
def test_screened_greedy_steps_pick_the_exact_argmax_of_their_final_residual(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], t: int) -> None:
    """The screened greedy Triton step (``Runner.screen_out``) over 40 positions: each token
    the argmax of float64 logits of the step's own final residual, the graph replayed alike;
    the unscreened step's token within its bf16 rounding of the same maximum. Replays give
    the same bounds, limbs and statistics bit for bit (the Runner is deterministic)."""
    model, _, toks, _ = pair
    r = Runner(model, 256)
    r.make_deterministic()  # (so the replay below sees the same final residual, bit for bit)
    r.screen_out = True
    r.greedy_cols = A.n_vocab - 271
    plain = Runner(model, 256)
    plain.make_deterministic()
    plain.screen_out = False  # (explicit: tuning.SCREEN_OUT turns it on for some shapes)
    plain.greedy_cols = r.greedy_cols
    r.logits(toks[:150], 0)
    plain.logits(toks[:150], 0)
    w = model.weights
    agree = total = 0
    for i in range(150, 190, t):
        ids = r.argmax(toks[i : i + t], i).clone()
        ref = _exact_logits(r._greedy_steps[t].h, w.out_norm, w.out[: r.greedy_cols])
        _assert_exact_pick(ids, ref)
        ws = r._greedy_steps[t]
        assert ws.screen is not None
        first = [b.clone() for b in (ws.screen.up, ws.screen.lo, ws.screen.limbs,
                                     ws.screen.stats)]
        for _ in range(5 if i > 150 else 50):
            # poisoned first (no limb is ever -128), so that a pass reading a buffer before
            # the one before it has written it gives another bound or token here
            for b in (ws.screen.up, ws.screen.lo, ws.screen.stats):
                b.fill_(float("nan"))
            ws.screen.limbs.fill_(-128)
            r.replay(t, greedy=True)
            assert ws.ids.tolist() == ids.tolist()
            for a, b in zip(first, (ws.screen.up, ws.screen.lo, ws.screen.limbs,
                                    ws.screen.stats), strict=True):
                assert torch.equal(a, b)
        other = plain.argmax(toks[i : i + t], i)
        top = ref.max(dim=-1).values
        assert (ref.gather(1, other[:, None])[:, 0] >= top - 2e-2 * top.abs()).all()
        agree += int((other == ids).sum())
        total += t
    assert r._greedy_steps[t].screen is not None and plain._greedy_steps[t].screen is None
    assert agree >= total // 2  # (most positions have no near-tie to flip)


def test_the_l2_restream_probe_times_every_policy_and_set_aside_of_a_small_stream() -> None:
    """``bench_l2_keep.py --restream`` end to end on 1 MB (a smoke test of the instrument, not a
    timing): a cold and a warm time for each policy with and without the set-aside, each a
    positive number of µs, and the set-aside given back."""
    import argparse

    import bench_l2_keep

    from openjarvis.engine.torch import cuda_step

    args = argparse.Namespace(flush=60.0, aside=4.0, reps=1)
    table = bench_l2_keep.restream(args, [1.0])
    assert len(table) == 2 * len(bench_l2_keep.RESTREAM_POLICIES)
    assert sum("and kept" in key for key in table) == len(bench_l2_keep.RESTREAM_POLICIES)
    for row in table.values():
        assert row["cold_us"] > 0 and row["warm_us"] > 0
        assert abs(row["saved_us"] - (row["cold_us"] - row["warm_us"])) < 1e-9
    assert cuda_step.set_persisting_l2(0) == 0


def test_a_streams_access_policy_window_is_set_capped_and_cleared() -> None:
    """``cuda_step.stream_window`` (``bench_l2_keep.py --restream``'s window policies; session
    36's ``Runner.out_window`` used it): the window reads back as set, capped at the device's
    largest (less than 1 GiB), cleared by 0 bytes; a negative size is refused by name."""
    from openjarvis.engine.torch import cuda_step

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    buf = torch.empty(2**30, dtype=torch.int8, device="cuda")
    got = cuda_step.stream_window(side.cuda_stream, buf.data_ptr(), buf.numel())
    assert 0 < got < buf.numel()  # the device's largest window is less than 1 GiB
    assert cuda_step.stream_window_of(side.cuda_stream) == (buf.data_ptr(), got, 1.0,
                                                            cuda_step.ACCESS_STREAMING)
    assert cuda_step.stream_window(side.cuda_stream, 0, 0) == 0
    assert cuda_step.stream_window_of(side.cuda_stream)[1] == 0
    with pytest.raises(ValueError, match="bytes >= 0 with a CUaccessProperty"):
        cuda_step.stream_window(side.cuda_stream, 0, -1)


@pytest.mark.parametrize(("n", "prefetch"), [(1, False), (4, False), (16, False), (8, True)])
def test_a_chained_draft_is_the_greedy_steps_one_by_one(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], n: int,
        prefetch: bool) -> None:
    """``Runner.draft``: n greedy one-token steps in one graph, each step's merge kernel
    feeding its token to the next, against the same deterministic steps one call at a time:
    the same tokens, and the same cache behind them (the logits of the step after). With
    ``l2_prefetch`` (the 1.5B's default) each step of the chain forks and joins its side
    stream."""
    model, _, toks, _ = pair
    r = Runner(model, 256)
    r.make_deterministic()
    r.l2_prefetch = (2.0, 64, 0) if prefetch else None
    r.logits(toks[:150], 0)
    one, tok = [], toks[150]
    for j in range(n):
        tok = r.greedy_tokens([tok], 150 + j)[0]
        one.append(tok)
    after_one = r.logits([one[-1]], 150 + n).clone()
    for _ in range(2):  # the first call captures the chain, the second replays it
        chained = r.draft(toks[150], 150, n)
        assert chained == one
    assert torch.equal(r.logits([one[-1]], 150 + n), after_one)
    assert n in r._chains
    with pytest.raises(ValueError, match="cannot draft"):
        r.draft(1, 250, 16)


def test_long_drafts_run_as_several_chains_and_chains_can_be_captured_ahead(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    """A draft longer than ``MAX_CHAIN`` runs as a chain of 16 then one of 4, each from the last
    token of the one before: the same tokens as 20 deterministic steps one by one.
    ``warm_chains`` captures chains before their first use."""
    from openjarvis.engine.torch.generate import MAX_CHAIN

    model, _, toks, _ = pair
    r = Runner(model, 256)
    r.make_deterministic()
    r.logits(toks[:150], 0)
    r.warm_chains([2, 3], 150)
    assert set(r._chains) == {2, 3}
    one, tok = [], toks[150]
    for j in range(MAX_CHAIN + 4):
        tok = r.greedy_tokens([tok], 150 + j)[0]
        one.append(tok)
    assert r.draft(toks[150], 150, MAX_CHAIN + 4) == one
    assert set(r._chains) == {2, 3, 4, MAX_CHAIN}


def test_verify_steps_with_the_serial_norm_hand_off_agree_with_float32(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    """Verify steps whose split-K o-projection hands the feed-forward norm to gate/up through
    per-column-block counts (``verify_handoff``): close to float32 over three k = 8 steps, the
    counts back at zero. (A race here is too rare to catch by running it: the memory order is
    checked in the compiled code, test_ptx_order.py.)"""
    model, _, toks, expect = pair
    r = Runner(model, 256)
    r.verify_handoff = True
    r.logits(toks[:150], 0)
    out = torch.cat([r.logits(toks[150 + 9 * i : 159 + 9 * i], 150 + 9 * i).clone()
                     for i in range(3)])
    ws = r._steps[9]
    assert ws.hand_count is not None and not ws.hand_count.any()  # the 0.5B's wo splits K
    ref = expect[150:177]
    assert torch.isfinite(out).all()
    assert rel(out, ref) < BF16_REL
    assert float((out.argmax(-1) == ref.argmax(-1)).float().mean()) > 0.95


@pytest.mark.parametrize("t", [1, 9])
def test_a_traced_step_stamps_every_program_in_order_and_computes_the_same(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], t: int) -> None:
    """scripts/trace_step.py's instrument: with ``kernels.TRACE`` set while a step is captured,
    every program of its launches (6 a layer for one token; 7 for a verify step, whose qkv is a
    split-K product and a RoPE kernel) and of the output projection stamps entry, past the PDL
    wait, past the main loop and done, in that order, and the SM it ran on; its logits stay within the float32
    reference's tolerance, and a step captured after tracing is switched off writes nothing."""
    from openjarvis.engine.torch import kernels as K

    model, _, toks, expect = pair
    r = Runner(model, 256)
    r.logits(toks[:170], 0)
    progs = 16384
    n_launch = (6 if t == 1 else 7) * model.args.n_layer + 1
    p0, p1, p2 = 170, 170 + t, 170 + 2 * t
    with K.tracing(n_launch, progs, "cuda") as buf:
        r.drop_steps(t)
        r.logits(toks[p0:p1], p0)  # captured with tracing: launch slots 0 .. n_launch - 1
        assert K.TRACE["next"] == n_launch
    assert K.TRACE["buf"] is None
    buf.zero_()
    got = r.logits(toks[p1:p2], p1).clone()  # a replay of the traced graph
    torch.cuda.synchronize()
    rec = buf.view(n_launch, progs, K.TRACE_WIDTH)
    st = rec[:, :, :4]
    seen = st[:, :, 0] > 0
    assert seen.any(1).all()  # every launch stamped
    stamped = st[seen]
    assert (stamped > 0).all()  # every program that entered stamped all four events
    assert (stamped[:, 1:] >= stamped[:, :-1]).all()  # entry <= waited <= looped <= done
    sms = rec[:, :, K.TRACE_SM][seen]  # and the SM it ran on
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    assert int(sms.min()) >= 0 and int(sms.max()) < n_sm
    assert len(torch.unique(sms)) > n_sm // 2  # a step's programs spread over the SMs
    assert rel(got, expect[p1:p2]) < BF16_REL
    r.drop_steps(t)
    buf.zero_()
    r.logits(toks[p2:p2 + t], p2)
    torch.cuda.synchronize()
    assert not buf.any()  # captured untraced: no stamps


@pytest.mark.parametrize("screened", [False, True])
@pytest.mark.parametrize("t", [1, 9])
def test_a_traced_greedy_step_stamps_its_pick_launches_and_picks_the_same(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor], t: int,
        screened: bool) -> None:
    """``trace_step.py --greedy``: a greedy step's launches after the last layer (the
    ``ARGMAX`` projection and its merge; or the limbs' kernel, the screen, the rescoring and
    the merge) stamp every program's four events in order, as the layers' do, and the traced
    step picks the tokens the untraced one picks."""
    from openjarvis.engine.torch import kernels as K

    model, _, toks, _ = pair
    r = Runner(model, 256)
    r.make_deterministic()  # (the traced and untraced steps then see the same residual)
    r.screen_out = screened
    r.logits(toks[:170], 0)
    p0 = 170
    want = r.argmax(toks[p0 : p0 + t], p0).clone()
    progs = 16384
    tails = 4 if screened else 2
    # (6 a layer at every T: a deterministic verify step runs the per-pair qkv, not split-K)
    n_launch = 6 * model.args.n_layer + tails
    with K.tracing(n_launch, progs, "cuda") as buf:
        r.drop_steps(t)
        r.argmax(toks[p0 : p0 + t], p0)  # captured with tracing
        assert K.TRACE["next"] == n_launch
    buf.zero_()
    got = r.argmax(toks[p0 : p0 + t], p0).clone()  # a replay of the traced graph
    torch.cuda.synchronize()
    assert got.tolist() == want.tolist()
    st = buf.view(n_launch, progs, K.TRACE_WIDTH)[-tails:, :, :4]
    seen = st[:, :, 0] > 0
    assert seen.any(1).all()  # every pick launch stamped
    assert seen[-1].sum() == t  # the merge: a program a token
    if screened:
        assert seen[0].sum() == t  # the limbs' kernel: a program a token
    stamped = st[seen]
    assert (stamped > 0).all()
    assert (stamped[:, 1:] >= stamped[:, :-1]).all()  # entry <= waited <= looped <= done
    first_in = st[:, :, 1].masked_fill(~seen, 2**62).amin(1)
    last_done = st[:, :, 3].amax(1)
    assert (first_in[1:] >= last_done[:-1]).all()  # each past its wait after the one before


def test_a_shared_memory_floor_caps_the_programs_an_sm_takes_and_computes_the_same(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    """``Runner.smem_floor`` (``kernels.floor_shared``): the one-token qkv kernel launched with
    the shared memory that lets at most 5 of its programs share an SM puts at most 5 on any SM
    in every layer (the trace's SM slot; the 0.5B's 576 programs took up to 12 without it,
    session 20), and the step's logits stay within the float32 reference's tolerance."""
    from openjarvis.engine.torch import kernels as K

    model, _, toks, expect = pair
    r = Runner(model, 256)
    r.smem_floor = {("qkv", False): K.shared_floor_for(5)}
    r.logits(toks[:170], 0)
    progs, n_launch = 16384, 6 * model.args.n_layer + 1
    with K.tracing(n_launch, progs, "cuda") as buf:
        r.drop_steps(1)
        r.logits(toks[170:171], 170)  # warm-up runs compile and floor, then the capture
    buf.zero_()
    got = r.logits(toks[171:172], 171).clone()
    torch.cuda.synchronize()
    rec = buf.view(n_launch, progs, K.TRACE_WIDTH)
    for layer in range(model.args.n_layer):
        qkv = rec[6 * layer]  # a layer's launches: qkv first
        seen = qkv[:, 0] > 0
        per_sm = torch.bincount(qkv[seen, K.TRACE_SM])
        assert int(seen.sum()) == 576 and int(per_sm.max()) <= 5, (layer, per_sm.max())
    assert rel(got, expect[171:172]) < BF16_REL


def test_the_1_5b_verify_steps_floor_their_merge_and_o_projection_to_two_an_sm() -> None:
    """``tuning.VERIFY_SMEM_CAPS`` (session 40): on a GPU the 1.5B's shapes' verify steps launch
    the attention's merge and the o-projection with the shared memory that lets at most 2 of
    their programs share an SM, so each spreads over the SMs instead of piling where it finds
    room (the merge had filled 37 SMs 12 deep); the trace shows at most 2 an SM in every layer,
    and the logits stay within float32's tolerance, as do one-token steps, which are not
    floored. (The 0.5B's floored split-K qkv runs in every default verify step of the tests
    above.)"""
    from dataclasses import replace

    from openjarvis.engine.torch import kernels as K
    from openjarvis.engine.torch.config import QWEN25_1_5B

    if not K.floor_supported() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("shared-memory floors measured on sm_90 with a Triton that packs them")
    a = replace(QWEN25_1_5B, n_layer=2)
    w = random_weights(a, torch.bfloat16, "cuda", seed=4)
    model = Transformer(a, w, n_pos=512)
    gen = torch.Generator().manual_seed(5)
    toks = torch.randint(0, a.n_vocab, (200,), generator=gen).tolist()
    ref = Runner(Transformer(a, cast(w, torch.float32), n_pos=512), 384, kernels="torch",
                 graphs=False).logits(toks, 0).clone()
    r = Runner(model, 384)
    assert set(r.smem_floor) == {("combine", True), ("wo", True)}
    r.logits(toks[:170], 0)
    progs, n_launch = 16384, 7 * a.n_layer + 1  # a verify layer: qkv, RoPE, attention, merge,
    with K.tracing(n_launch, progs, "cuda") as buf:  # o-projection, gate/up, down
        r.drop_steps(9)
        r.logits(toks[170:179], 170)  # warm-up runs compile and floor, then the capture
    buf.zero_()
    got = r.logits(toks[179:188], 179).clone()
    one = r.logits(toks[188:189], 188).clone()
    torch.cuda.synchronize()
    rec = buf.view(n_launch, progs, K.TRACE_WIDTH)
    for layer in range(a.n_layer):
        for slot, name, n_prog in ((3, "merge", 9 * a.n_head * 2), (4, "wo", 192)):
            launch = rec[7 * layer + slot]
            seen = launch[:, 0] > 0
            per_sm = torch.bincount(launch[seen, K.TRACE_SM])
            assert int(seen.sum()) == n_prog, (layer, name, int(seen.sum()))
            assert int(per_sm.max()) <= 2, (layer, name, int(per_sm.max()))
    assert rel(got, ref[179:188]) < BF16_REL
    assert rel(one, ref[188:189]) < BF16_REL


def test_cuda_step_agrees_with_float32_and_replays_bit_identical(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    from openjarvis.engine.torch import cuda_step

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the CUDA step needs sm_90 or later")
    model, _, toks, expect = pair
    r = Runner(model, 256)
    try:
        r.use_cuda_step()
    except cuda_step.CudaStepError as exc:
        pytest.skip(f"no compiler for the CUDA step here: {exc}")
    r.logits(toks[:180], 0)
    got = [r.logits(toks[i : i + 1], i).clone() for i in range(180, 190)]
    out = torch.cat(got)
    assert torch.isfinite(out).all()
    assert rel(out, expect[180:190]) < BF16_REL
    again = r.logits(toks[189:190], 189)
    assert torch.equal(again, got[-1])  # no float atomics: the same bits on every replay
    # replaced (a cached build): the old step's graph goes, then its module is unloaded
    first = r.cuda_step
    assert first is not None
    r.use_cuda_step()
    assert torch.equal(r.logits(toks[189:190], 189), got[-1])
    with pytest.raises(cuda_step.CudaStepError, match="closed"):
        first(r._steps[1].inputs)


def test_the_engine_captures_at_load_every_step_a_request_runs(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    """After the engine's warm-up, a prompt that leaves 18-31 tokens after its steps of 32 and
    the model drafter's catch-up runs (argmaxes only) capture nothing new, nor do runs long
    enough for a wide step of any width the window holds: before session 24 they captured (and
    on a first start compiled) steps inside the first requests."""
    from openjarvis.engine.torch.engine import WARM_GREEDY, WARM_STEPS

    model, _, toks, _ = pair
    r = Runner(model, 384)
    r.warmup(WARM_STEPS)
    r.warmup(WARM_GREEDY, greedy=True)
    r.warm_wide()
    steps, greedy = set(r._steps), set(r._greedy_steps)
    assert sorted(r._wides) == [128, 256]  # (512 and 1,024 do not fit the window)
    graphs = {t: ww.graph for t, ww in r._wides.items()}
    assert all(g is not None for g in graphs.values())
    for n in (50, 63, 81, 95, 150, 300):
        r.logits(toks[:n], 0, last_only=True)
    for n in (20, 31, 116, 190, 270):
        r.greedy_tokens(toks[:n], 0, last_only=True)
    assert set(r._steps) == steps and set(r._greedy_steps) == greedy
    assert {t: ww.graph for t, ww in r._wides.items()} == graphs


def test_a_prompt_read_in_wide_steps_agrees_with_float32(
        pair: tuple[Transformer, Runner, list[int], torch.Tensor]) -> None:
    """The GPU default reads a prompt's runs in wide steps of 1,024 to 128 tokens
    (``Runner.wide``, products through cuBLAS), the rest in fixed-size steps: the last token's
    logits as close to float32 as the steps', at position 0 and past it; its greedy token that
    row's argmax; the K/V close to what the fixed-size steps leave; the one-token steps after
    it still close."""
    model, _, toks, expect = pair
    r = Runner(model, 384)
    assert r.wide == 1024 and r.wide_widths == (1024, 512, 256, 128)
    got = r.logits(toks[:128], 0, last_only=True).clone()  # one wide step, captured
    assert r._wide is r._wides[128] and r._wide.graph is not None
    assert rel(got, expect[127:128]) < BF16_REL
    assert rel(r.logits(toks[:200], 0, last_only=True), expect[199:200]) < BF16_REL  # + 72
    got = r.logits(toks[:300], 0, last_only=True).clone()  # 256 + 32 + 12
    assert r._wides[256].o_part.shape[0] == 4 and r._wides[128].o_part.shape[0] == 8
    assert rel(got, expect[299:300]) < BF16_REL
    plain = Runner(model, 384)
    plain.wide = 0
    plain.logits(toks[:300], 0, last_only=True)
    assert rel(r.cache.k[:, :, :300], plain.cache.k[:, :, :300]) < BF16_REL
    r.logits(toks[:40], 0, last_only=True)
    got = r.logits(toks[40:168], 40, last_only=True).clone()  # a wide step at 40
    assert torch.isfinite(got).all()
    assert rel(got, expect[167:168]) < BF16_REL
    assert r.argmax(toks[40:168], 40, last_only=True).tolist() == [int(got.argmax())]
    steps = Runner(model, 256)
    steps.wide = 0
    steps.logits(toks[:168], 0, last_only=True)
    for a, b in ((r.cache.k, steps.cache.k), (r.cache.v, steps.cache.v)):
        assert rel(a[:, :, :168], b[:, :, :168]) < BF16_REL
    out = torch.cat([r.logits(toks[i : i + 1], i).clone() for i in range(168, 176)])
    assert rel(out, expect[168:176]) < BF16_REL
    assert float((out.argmax(-1) == expect[168:176].argmax(-1)).float().mean()) > 0.95


def test_the_default_widest_steps_agree_with_float32_and_split_runs_alike() -> None:
    """The default widths the engine's runs of 1,024 take (1,024 in one split, 512 in two, 256,
    128) on a window that holds them: the last logits of a run of 1,100 (1,024 + 32 + 32 + 12)
    and of a run of 400 after 700 (512 + 128 + 60, then 256 + 128 + 16) as close to float32 as
    bf16 goes, the same top token, and K/V as close to the 32-token steps'; a run of 1,100 read
    as runs of 1,024 and 76 leaves the K/V of one call (the prefix cache's runs)."""
    model, toks, expect = _bf16_case(n_pos=1280, n=1100, seed=3)
    expect = expect[[-1, 699]]  # rows 1,099 and 699
    r = Runner(model, 1152)
    r.make_deterministic()  # (bit for bit below: the 32-token steps' split-K tiles vary)
    assert r.wide_widths == (1024, 512, 256, 128)
    got = r.logits(toks, 0, last_only=True).clone()
    assert sorted(r._wides) == [1024] and r._wides[1024].o_part.shape[0] == 1
    assert rel(got, expect[:1]) < BF16_REL and int(got.argmax()) == int(expect[0].argmax())
    k_one = r.cache.k[:, :, :1100].clone()
    r.logits(toks[:1024], 0, last_only=True)
    r.logits(toks[1024:], 1024, last_only=True)
    assert torch.equal(r.cache.k[:, :, :1100], k_one)  # runs of 1,024 split as one call
    got = r.logits(toks[:700], 0, last_only=True).clone()
    assert rel(got, expect[1:]) < BF16_REL and int(got.argmax()) == int(expect[1].argmax())
    assert r._wides[512].o_part.shape[0] == 2
    got = r.logits(toks[700:], 700, last_only=True).clone()
    assert sorted(r._wides) == [128, 256, 512, 1024]
    assert rel(got, expect[:1]) < BF16_REL
    plain = Runner(model, 1152)
    plain.wide = 0
    plain.logits(toks, 0, last_only=True)
    for x, y in ((r.cache.k, plain.cache.k), (r.cache.v, plain.cache.v)):
        assert rel(x[:, :, :1100], y[:, :, :1100]) < BF16_REL


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "BF16"])
def test_gguf_blocks_decode_on_the_gpu_as_on_the_cpu(qtype: str, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``load_gguf`` decodes on the device: the same bits as the CPU (which the weights test
    holds to the gguf package's decoders). (The device has no ``gguf``: carry it, as
    ``scripts/bench_pair_gpu.py``'s run does, in ``PYTHONPATH``.)"""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from openjarvis.engine.torch import dequant
    from openjarvis.engine.torch.dequant import dequantize_tensor

    q = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[q]
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (6 * 512 // block, size), dtype=np.uint8)
    for off in {"Q8_0": (0,), "Q5_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}.get(qtype, ()):
        raw[:, off:off + 2] = rng.uniform(1e-3, 5e-2, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_tensor("m.weight", raw.reshape(6, -1), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t = gguf.GGUFReader(path).tensors[0]
    on_gpu = dequantize_tensor(t, "cuda")
    assert on_gpu.is_cuda and on_gpu.shape == (6, 512)
    # (bit patterns: random BF16 bytes hold NaNs)
    assert torch.equal(on_gpu.cpu().view(torch.int32), dequantize_tensor(t, "cpu").view(torch.int32))
    # and straight into bf16, in chunks that end inside rows, as ``load_gguf`` decodes there
    monkeypatch.setattr(dequant, "CHUNK", 300)
    got, ref = dequantize_tensor(t, "cuda", torch.bfloat16).cpu(), on_gpu.cpu().to(torch.bfloat16)
    keep = ~ref.isnan()  # (NaNs' payloads may round differently; random BF16 bytes hold some)
    assert torch.equal(got.view(torch.int16)[keep], ref.view(torch.int16)[keep])
