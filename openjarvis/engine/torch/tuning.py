"""Tiles picked on the H200 for the default pair's shapes (scripts/bench_gpu.py, run 5 in
docs/gpu-notes.md). Other shapes, or other GPUs, use ``kernels.default_linear_config``."""

from __future__ import annotations

from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.kernels import PDL_AFTER_WAIT, PDL_LATE, LinearConfig

L = LinearConfig
#: Verify steps (T > 1). Session 2 run 14: gate/up, down and output (and the 0.5B's o-proj)
#: with swapped MMA operands (weights as M): k = 8 verify 1.46x -> 1.22x of a step (1.5B).
_VERIFY_1_5B = {
    "wo": L(32, 128, 4, 3, 4), "w2": L(32, 128, 4, 3, 8, swap=True),
    "w13": L(64, 64, 4, 4, swap=True), "out": L(128, 64, 4, 3, swap=True),
}
#: Session 9 run 86, with relaxed atomics and the hand-off: the 0.5B's down projection in 16
#: splits (k = 8: 0.716 -> 0.705 ms @512, 0.760 -> 0.750 @4096).
_VERIFY_0_5B = {
    "wo": L(32, 128, 4, 3, 8, swap=True), "w2": L(32, 128, 4, 3, 16, swap=True),
    "w13": L(64, 64, 4, 4, swap=True), "out": L(128, 64, 4, 3, swap=True),
}

#: (n_embd, n_ff) -> {(matrix, T): tiles}; T > 1 entries serve every verify size.
TUNED: dict[tuple[int, int], dict[tuple[str, int], object]] = {
    (1536, 8960): {
        # w13 in the row layout (a row a warp: no block barrier in its K loop) and w2 in it
        # prefetching (session 11 run 108, against L(8, 256, 4, 2) and L(2, 1024, 4, 2, 2):
        # 1.068 -> 1.052 ms @512, 1.162 -> 1.145 @4096)
        ("w2", 1): L(2, 1024, 4, 2, 2, rows=True, prefetch=True),
        # wo on 4 warps, not 8 (session 23 runs 212-213, 7 and 9 rounds: -0.20 / -0.79 % and
        # -0.19 / -0.90 % @512 / @4096; on 2 warps +0.03 / -0.79 % and +0.08 / -0.98 %; run
        # 214, adopted, 8 warps again: +0.16 / +0.82 %)
        ("wo", 1): L(2, 2048, 4, 2),
        # w13's sums kept a lane at a time (``lanes``: no shuffles in its loop; session 22 runs
        # 205-206, 7 and 9 rounds: -0.38 / -0.37 % and -0.32 / -0.33 % @512 / @4096, the tile
        # without lanes as an A/A check +0.07 / -0.01 % and +0.06 / +0.01 %)
        ("w13", 1): L(8, 256, 4, 2, rows=True, lanes=True),
        # qkv in one K tile (session 3 run 18): all its weights load before the PDL wait
        ("out", 1): L(16, 256, 4, 2), ("qkv", 1): (1, 2048),
        **{(k, 0): v for k, v in _VERIFY_1_5B.items()}, ("qkv", 0): (16, 256),
    },
    (896, 4864): {
        # w2: 2 rows a program in 4 splits (session 9 run 86, relaxed atomics: 0.522 -> 0.513
        # ms @512, 0.579 -> 0.555 @4096; 8 rows in 4 splits before)
        # w13: 8 rows a program (session 10 run 103: 0.511 -> 0.483 ms @512, 0.561 -> 0.534
        # @4096); the 2-row tile's 2432 programs of 4 warps did not fit the SMs in one wave
        # beside the kernels around it, and its last programs passed their wait 4.6 us late.
        # Since gate/up lets the down projection launch at its start (session 12), 4 rows on
        # 2 warps (runs 122-123: -1.8 / -2.0 % and -1.9 / -2.0 % against 8 rows on 4 warps;
        # under the PDL before, run 104: +0.6 / -0.2 %)
        ("wo", 1): L(2, 1024, 4, 2), ("w2", 1): L(2, 1024, 4, 2, 4), ("w13", 1): L(4, 1024, 2, 2),
        ("out", 1): L(32, 128, 4, 2), ("qkv", 1): (1, 1024),
        **{(k, 0): v for k, v in _VERIFY_0_5B.items()}, ("qkv", 0): (16, 64),
    },
}
#: (n_embd, n_ff) -> tiles of the split-K qkv product of verify steps (T > 1; session 2 run 13:
#: k = 8 verify 1.60x -> 1.45x of a step for the 1.5B, 1.67x -> 1.49x for the 0.5B). Its RoPE
#: kernel stays: the attention finishing the product's sums instead lost 6-9 %, the product
#: summing the squares for it was even at best (session 16 runs 153-156; commits 0dfbe26 and
#: 9ead307 hold both).
QKV_SPLIT: dict[tuple[int, int], LinearConfig] = {
    (1536, 8960): L(32, 64, 4, 3, 8), (896, 4864): L(32, 64, 4, 3, 8),
}
#: (n_embd, n_ff) -> kernels that load their first weight tile (for qkv and wo with K in one
#: tile: all of it) before the PDL wait, overlapping the latency-bound kernel before them
#: (session 3 run 18, one-token step: 1.5B 1.244 -> 1.175 ms, 0.5B 0.624 -> 0.583 ms with
#: ``WEIGHT_EVICT``).
PDL_PROLOGUE: dict[tuple[int, int], frozenset[str]] = {
    (1536, 8960): frozenset({"qkv", "wo"}), (896, 4864): frozenset({"qkv", "wo"}),
}
#: (n_embd, n_ff) -> PDL mode per kernel in verify steps (T > 1), where the rest run without:
#: every kernel launched early, waiting before it loads anything (no weight prologue: that
#: was what made PDL lose in the 1.5B's verify steps, session 3 run 19 and session 6 runs
#: 52-53), and letting the next one launch after its main loop (``kernels.PDL_LATE``).
#: Session 6 runs 57-58, with ``VERIFY_ATTENTION``, k = 8 against the settings before (1.5B:
#: session 5's; 0.5B: run 55's, every kernel late with the weight prologue): 1.5B 1.507 ->
#: 1.465 ms @512, 1.627 -> 1.553 @4096; 0.5B 0.781 -> 0.729, 0.831 -> 0.779. Against session
#: 5's for both: BENCHMARKS.md, run 61.
#: Session 15 (runs 146-148, k = 8 against that): the kernels of the chain from the down
#: projection to the attention's merge let their successor launch at their start instead
#: (mode 1: the successor's programs are resident, waiting, when the kernel ends; the trace of
#: run 145 had every verify boundary releasing in 1.0-1.3 us where the one-token step's
#: release in 0.5-0.8): the down projection (qkv), the split-K qkv product (its RoPE kernel),
#: the RoPE kernel (the attention), the attention (its merge), and for the 0.5B the merge (the
#: o-projection). Run 148, 7 rounds: 1.5B 1.307x -> 1.254x one step @512, 1.286x -> 1.245x
#: @4096; 0.5B 1.488x -> 1.381x, 1.455x -> 1.363x. Lost (runs 146-152): gate/up letting the
#: down projection launch at its start (+1.5 to +5.0 %), the 1.5B's merge letting the
#: o-projection launch (+1.2 to +4.8 %); the o-projection letting gate/up launch was even for
#: the 1.5B (+0.0 / +0.1 %) and lost for the 0.5B (+2.0 / +2.9 %).
#: Session 17 (runs 166-167, 9 rounds each): the merge letting the o-projection launch right
#: after its PDL wait (``kernels.PDL_AFTER_WAIT``): the 1.5B's instead of after its loop,
#: -1.2 / -1.2 % and -1.0 / -1.0 % @512 / @4096; the 0.5B's instead of at its start, -0.8 /
#: -0.9 % (run 166 ran the 0.5B's as an A/A check: +0.0 / +0.0 %). The o-projection the same
#: way: +0.0 / +0.1 % (1.5B), +2.8 / +2.2 % (0.5B); the RoPE kernel and the attention after
#: their wait instead of at their start: -0.6 to +5.5 %.
_ALL_LATE = {k: 1 + PDL_LATE for k in
             ("embed", "qkv", "rope_kv", "attn", "combine", "wo", "w13", "w2", "out")}
_EARLY_CHAIN = {"w2": 1, "qkv": 1, "rope_kv": 1, "attn": 1, "combine": 1 + PDL_AFTER_WAIT}
VERIFY_PDL: dict[tuple[int, int], dict[str, int]] = {
    (1536, 8960): {**_ALL_LATE, **_EARLY_CHAIN},
    (896, 4864): {**_ALL_LATE, **_EARLY_CHAIN},
}
#: (n_embd, n_ff) -> (attention splits, keys per block) of verify steps where they differ from
#: ``ATTENTION`` (session 6 run 58: 1.5B -2.0 % @4096, +1.5 % @512; 0.5B even).
VERIFY_ATTENTION: dict[tuple[int, int], tuple[int, int]] = {
    (1536, 8960): (64, 32), (896, 4864): (64, 32),
}
#: (n_embd, n_ff) -> {T: programs of the attention's merge a (token, head)}, each merging
#: head_dim / n of its columns (``Runner.combine_cols``); T 0 stands for every verify size.
#: Session 16 runs 158-160 (7, 9 and 7 rounds, against one program a (token, head)), @512 /
#: @4096: the 1.5B's k = 8 verify in 2 of one warp (-1.0 / -0.4 %, -1.2 / -0.5 %, -1.0 /
#: -0.5 %, against one program of two warps: session 6 run 60's ``VERIFY_COMBINE_WARPS``,
#: now gone, which had taken k = 8 1.454 -> 1.420 ms @512, 1.542 -> 1.507 @4096); the
#: 0.5B's one-token step in 4 (-0.9 / -1.7 %, -0.8 / -1.7 %, -0.5 / -1.6 %). Left at one
#: then: the 1.5B's one-token merge (in 2: -0.2 / -0.5 %, -1.2 / -0.9 %, then +0.9 / +0.6 %;
#: in 4 since run 162, with ``ATTENTION``'s 64 splits) and the 0.5B's verify merge (-0.6 /
#: +0.7 %, -0.4 / +0.8 %). A merge reads 17-64 splits' partials per (token, head); a program
#: that reads fewer columns of them waits less on its loads. Session 17 runs 164-165 (7 and 9
#: rounds): the 1.5B's one-token merge in 8 programs of 16 columns against 4, -1.0 / -0.5 %
#: and -1.1 / -0.5 %; the 0.5B's in 8 -0.0 / +0.3 % (left at 4).
COMBINE_COLS: dict[tuple[int, int], dict[int, int]] = {
    (1536, 8960): {1: 8, 0: 2}, (896, 4864): {1: 4},
}
#: (n_embd, n_ff) -> {T: warps of each program of the per-pair qkv kernel} where not 4
#: (``Runner.qkv_warps``). The 0.5B's one-token qkv on one warp: its reductions (the norm's
#: squares, each pair's two dot products) then need no block barrier (17 in the PTX on 2 or
#: more warps; none on one), at 151 registers and no spill (session 23 run 210, 7 rounds:
#: -1.21 / -0.40 % @512 / @4096; 2 warps -0.03 / -0.08 %, 8 +1.8 / +1.8 %; run 211, adopted,
#: 4 warps again: +1.25 / +0.26 %). Its other products on one warp lost (run 212). The 1.5B's on
#: one warp spills its 2048-wide tile (+0.24 / +0.26 %; with a 1024-wide tile, its second half
#: read after the wait, +5.0 / +4.9 %; 2 warps +0.9 / +0.9 %, 8 +4.9 / +4.8 %).
QKV_WARPS: dict[tuple[int, int], dict[int, int]] = {(896, 4864): {1: 1}}
#: (n_embd, n_ff) -> {kernel: programs an SM} of verify steps (T > 1): each of the kernel's
#: programs launched with the shared memory that lets at most that many share an SM
#: (``kernels.shared_floor_for`` of the device's shared memory an SM; ``Runner.smem_floor``).
#: Launched early, the merge's 216 programs (k = 8) had filled 37 SMs 12 deep, and the
#: o-projection's 192, let in at the merge's wait, 108 SMs 2 deep (run 342's trace, 1.5B
#: @4096). Floored to 2 an SM the merge spreads over 109 SMs (loop 2.21 -> 1.28 us), and the
#: o-projection must be floored too, or it piles 7 an SM on 68 SMs (loop 2.78 -> 5.02 us).
#: Session 40 runs 342-343 (5 rounds each, the 1.5B's k = 8 verify over its one-token step,
#: @512 / @4096): both at 2 -1.6 / -2.4 % and -1.5 / -2.5 %; the merge alone at 2 / 3 / 4
#: +0.3 / -0.3 / -0.4 % and -0.7 / -1.3 / -1.3 %; the o-projection at 3 or 4 with the merge
#: at 2: -0.6 / -1.7 %; at 1 (two waves) +4.7 / +3.1 %; k = 4 -0.2 / -0.5 %, k = 16 -0.0 /
#: -1.3 %. The 0.5B's verify steps lose with the o-projection at 2 (+0.9 to +1.3 %) and are
#: even with both at 3 or 4 (-0.1 to -0.4 %); one-token merges floored at 1-3 an SM were even
#: or slower for both (-0.1 to +0.4 %). Runs 344-345 (5 and 7 rounds), on top of those: the
#: 0.5B's split-K qkv product (288 programs) at 4 an SM -0.87 / -0.68 % and -0.93 / -0.89 %
#: (at 3: -0.2 / +0.0 %); the 1.5B's (512) at 4 or 5 and either model's RoPE kernel at 2
#: -0.2 to +0.5 %; qkv and RoPE both floored +0.3 to +3.6 %.
VERIFY_SMEM_CAPS: dict[tuple[int, int], dict[str, int]] = {
    (1536, 8960): {"combine": 2, "wo": 2}, (896, 4864): {"qkv": 4},
}
#: The most tokens a step floored by ``VERIFY_SMEM_CAPS`` has: the verify sizes measured (k =
#: 4, 8 and 16). The merge's programs grow with T (at T = 32 the 1.5B's would be 768, three
#: waves at 2 an SM), so the prompt's 32-token steps run unfloored, as before.
VERIFY_SMEM_MAX_T = 17
#: (n_embd, n_ff) whose one-token steps hand the feed-forward RMSNorm from the o-projection
#: to gate/up (``kernels.NormHandoff``; session 8 run 81: 1.5B 1.122 -> 1.084 ms @512, 1.217 ->
#: 1.177 @4096; 0.5B 0.550 -> 0.536, 0.615 -> 0.583).
NORM_HANDOFF: frozenset[tuple[int, int]] = frozenset({(1536, 8960), (896, 4864)})
#: (n_embd, n_ff) whose verify steps hand it off too, serially from the split-K o-projection
#: (``Runner.verify_handoff``; session 9 run 84, k = 8: 1.5B 1.386 -> 1.347 ms @512, 1.461 ->
#: 1.425 @4096; 0.5B 0.723 -> 0.712, 0.767 -> 0.759).
VERIFY_HANDOFF: frozenset[tuple[int, int]] = frozenset({(1536, 8960), (896, 4864)})
#: Cache policy of the weight loads: each weight is read once a step, so it may leave L2 first
#: (session 3 run 18: 0.5B 0.624 -> 0.605 ms alone; 1.5B unchanged).
WEIGHT_EVICT = "evict_first"
#: (n_embd, n_ff) -> ``Runner.l2_prefetch`` of one-token steps, (MiB, programs a half, after):
#: the last 6 MiB (8 until session 35) of each layer's gate/up rows asked into L2 from a side
#: stream of the step's graph in one short burst (128 programs a half) as the layer before
#: ends, so it lands before qkv's loop needs L2 (session 13, 1.5B: run 130 -1.5 % @512,
#: -2.7 % @4096; run 131 -0.6 / -2.4 %; run 132 against session 12's default: 1.037 -> 1.029
#: ms @512, 1.132 -> 1.101 @4096). Longer bursts, more MiB, or asking after qkv or after the merge held up qkv's loop
#: or the attention's by more than gate/up gained (runs 127-129); the 0.5B lost in every form.
#: Session 35, the screened greedy step: the prefetch worth 26-28 µs (none: +28.4 µs @512);
#: 6 MiB against 8: -5.4 / -6.5 µs @512 / @4096 (run 298, 3 copies; run 297 -3.8 / -3.9);
#: 4 / 5 / 7 / 10 / 12 MiB, 64 or 256 programs, points 1 or 2, or evict_first priority lost to
#: 6 (5 and 7 beat 8 slightly: run 298, 0.9998x / 0.9961x of 8 @512, 0.9988x / 0.9967x @4096).
L2_PREFETCH: dict[tuple[int, int], tuple[float, int, int]] = {(1536, 8960): (6.0, 128, 0)}
#: (n_embd, n_ff) whose greedy steps pick through the int8 screen of the output matrix
#: (``Runner.screen_out``; session 33 run 282, the 1.5B's shapes with random weights: one
#: token 1.0284 -> 0.9865 ms @512 (0.959x), 0.956x @4096; T = 9 0.990x. The 0.5B was left
#: off until session 36: its one token even @512 (runs 277-278 1.007-1.016x, later 0.996-
#: 1.005x) and 0.960x @4096. Session 34 put the short positions down to the screen's int8
#: loads entering L2 unhinted on Triton 3.6; session 36 (runs 308-310) marked them streaming
#: by an access policy window, which reaches those loads, and the step @512 stayed even: not
#: the cause. Run 314, 3 copies: the 0.5B screened 1.0026x @512 (+1.2 µs), 1.0019x @1024,
#: 0.991x @2048, 0.962x @4096 (-19.6 µs): on, for a coding assistant's long prompts, at the
#: cost of a 136 MB int8 copy and ~1 µs at short positions).
SCREEN_OUT: frozenset[tuple[int, int]] = frozenset({(1536, 8960), (896, 4864)})
#: (n_embd, n_ff) -> (attention splits, keys per block). The 1.5B's one-token step in 64
#: splits of 32-key blocks with its merge in 4 programs a head (``COMBINE_COLS``), against 32
#: of 64 with one: session 16 run 162 -0.5 / -3.2 % @512 / @4096, run 163 -0.5 / -3.2 %
#: (1.037 -> 1.032 ms, 1.110 -> 1.076). Run 95 had found more splits costing the merge what
#: they saved the attention, with the merge a program a head. The 0.5B in 64 x 32 with that
#: merge: -1.0 / +0.8 % (run 162), left.
ATTENTION: dict[tuple[int, int], tuple[int, int]] = {(1536, 8960): (64, 32), (896, 4864): (64, 64)}


def tuned_configs(args: ModelArgs, max_t: int) -> dict[tuple[str, int], object]:
    """Per (matrix, T) tiles for T = 1..max_t, or {} for a shape without measurements."""
    table = TUNED.get((args.n_embd, args.n_ff))
    if table is None:
        return {}
    out: dict[tuple[str, int], object] = {}
    for (name, t), cfg in table.items():
        if t == 1:
            out[(name, 1)] = cfg
        else:
            out.update({(name, tt): cfg for tt in range(2, max_t + 1)})
    return out


def combine_cols(args: ModelArgs, max_t: int) -> dict[int, int]:
    """``COMBINE_COLS`` of the shape as {T: programs} for T = 1..max_t (T 0 spread over every
    verify size, then the sizes it names), or {} for a shape without measurements."""
    cols = COMBINE_COLS.get((args.n_embd, args.n_ff), {})
    out = dict.fromkeys(range(2, max_t + 1), cols[0]) if 0 in cols else {}
    out.update({t: n for t, n in cols.items() if t != 0})
    return out
