"""Verify steps (T = k + 1 tokens) of the Triton backend against its one-token step.

Run on the lent H200 (``device`` tool): ``python3 scripts/bench_verify.py --out $OUT``.
In one process, per model (1.5B and 0.5B shapes, random non-zero bf16 weights):

1. correctness: every variant's T = 9 logits at one position against the default's, from the
   same cache (split-K atomics make two default runs differ by ~6e-3 relative already), and
   against a float32 reference of the same weights (``Runner`` with the torch kernels);
2. timing: the one-token step and the T = 9 step of each variant at positions 512 and 4096, in
   CUDA graphs, in alternating rounds (the machine drifts); each round the median of 7 x 50
   replays, the figure the fastest round; the ratio to the one-token step (fastest to fastest,
   and the median of each round's ratio: a minimum over rounds would take the round whose
   one-token timing happened to be slow, as run 86's did);
   k = 4 and k = 16 for the default and the best variant;
3. where the T = 9 step's time goes: the step re-captured with one kind of launch left out
   (its results are wrong by design), the difference to the whole step what that kind costs
   inside it, launch gaps and overlap included (``--breakdown``, ``--breakdown-t``).

A variant is a JSON object of Runner settings: ``verify_pdl`` (PDL mode per kernel,
``kernels.PDL_LATE`` added for a late trigger), ``verify_attention``
([splits, keys per block]), ``tiles`` ({matrix: LinearConfig fields} for T > 1); one-token
variants ``pdl_by_t`` (keys as strings) and ``one_token_pdl``; for both, ``trim_merge``
(false: the merge reads every split, as before session 7); ``norm_handoff`` (one-token steps:
the o-projection hands the feed-forward norm to gate/up, ``kernels.NormHandoff``);
``atomic_sem`` (split-K atomics: "acq_rel" or "relaxed"); ``verify_handoff`` (verify steps
hand the norm off too, serially from a split-K o-projection). Results go
to ``--out``/verify.json; ``--norm-cost`` instead prices the norm inside each normed product.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import copy_bandwidth, log, step_floor_ms, time_ms  # noqa: E402  # the same timer and floor

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import DEFAULT_ONE_TOKEN_PDL, Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer  # noqa: E402
from openjarvis.engine.torch.tuning import VERIFY_PDL  # noqa: E402
from openjarvis.engine.torch.weights import cast, random_weights  # noqa: E402

RES: dict[str, Any] = {}
LATE = K.PDL_LATE
#: Every verify kernel launched early, the next one let go after the main loop; the kernels
#: with weights load their first tile before waiting.
ALL_LATE = {"embed": 1 + LATE, "qkv": 2 + LATE, "rope_kv": 1 + LATE, "attn": 1 + LATE,
            "combine": 1 + LATE, "wo": 2 + LATE, "w13": 2 + LATE, "w2": 2 + LATE,
            "out": 2 + LATE}
ALL_EARLY = {k: v - LATE for k, v in ALL_LATE.items()}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "late": {"verify_pdl": ALL_LATE},
    "early": {"verify_pdl": ALL_EARLY},
    "late_attn64x32": {"verify_pdl": ALL_LATE, "verify_attention": [64, 32]},
}
#: One-token variants timed beside the default one-token step (``pdl_by_t``,
#: ``one_token_pdl``).
T1_VARIANTS: dict[str, dict[str, Any]] = {"t1_late": {"pdl_by_t": {"1": 1 + LATE}}}


def each_variants(default_pdl: dict[str, int]) -> dict[str, dict[str, Any]]:
    """One change at a time from the verify step of ``default_pdl`` (runs 53-54 passed session
    5's: the attention and its merge early, the rest without PDL): PDL with the late trigger
    and the weight prologue (dropped from the swapped kernel since) at one kernel boundary,
    attention tiles, big-matrix tiles."""
    out: dict[str, dict[str, Any]] = {}
    chain = ("embed", "qkv", "rope_kv", "attn", "combine", "wo", "w13", "w2", "qkv")
    for before, after in zip(chain, chain[1:], strict=False):
        pair = {before: ALL_LATE[before], after: ALL_LATE[after]}
        out[f"late_{before}_{after}"] = {"verify_pdl": {**default_pdl, **pair}}
    out["late_w2_out"] = {"verify_pdl": {**default_pdl, "w2": ALL_LATE["w2"],
                                         "out": ALL_LATE["out"]}}
    for sp, bs in ((64, 32), (128, 32), (32, 32)):
        out[f"attn{sp}x{bs}"] = {"verify_attention": [sp, bs]}
    for cfg in ((32, 64, 4, 4, 1, True), (32, 128, 4, 3, 1, True), (16, 128, 4, 3, 1, True)):
        out["w13_" + "_".join(str(int(c)) for c in cfg[:2])] = {"tiles": {"w13": list(cfg)}}
    for cfg in ((32, 128, 4, 3, 4, True), (16, 128, 4, 3, 8, True)):
        out["w2_" + "_".join(str(int(c)) for c in (cfg[0], cfg[4]))] = {"tiles": {"w2": list(cfg)}}
    return out


#: The 0.5B's one-token down-projection tile before session 9 (``by_width``: that model only).
_W2_0_5B_S8_T1 = {"t1_tiles": {"w2": [8, 1024, 8, 2, 4]}}
#: ``--set``: named lists of variants.
_T1_LATE = {"pdl_by_t": {"1": 1 + LATE}, "one_token_pdl": {}}
_T1_MIXES: dict[str, dict[str, Any]] = {
    "t1_late": _T1_LATE,
    # late everywhere but w2 and the merge, whose successors (qkv, wo) load weights early
    "t1_mix": {**_T1_LATE, "one_token_pdl": {"w2": 1, "combine": 1}},
    "t1_mix_w2": {**_T1_LATE, "one_token_pdl": {"w2": 1}},
    "t1_mix_combine": {**_T1_LATE, "one_token_pdl": {"combine": 1}},
    "t1_mix_attn": {**_T1_LATE, "one_token_pdl": {"w2": 1, "combine": 1, "attn": 1}},  # adopted
    "t1_mix_qkv": {**_T1_LATE, "one_token_pdl": {"w2": 1, "combine": 1, "qkv": 2}},
}
_T1_TILES: dict[str, dict[str, Any]] = {
    **{f"t1_attn{sp}x{bs}": {"attention": [sp, bs]}
       for sp, bs in ((64, 64), (64, 32), (128, 32), (16, 64))},
    "t1_fuse_attn_out": {"fuse_attn_out": True},
    **{"t1_w13_" + "_".join(map(str, c[:3])): {"t1_tiles": {"w13": list(c)}}
       for c in ((4, 512, 4, 2), (16, 256, 8, 2), (8, 512, 8, 2), (8, 128, 4, 2),
                 (16, 128, 4, 2), (8, 256, 4, 3))},
    **{"t1_w2_" + "_".join(map(str, (c[0], c[1], c[4]))): {"t1_tiles": {"w2": list(c)}}
       for c in ((2, 1024, 4, 2, 1), (4, 1024, 4, 2, 2), (8, 512, 4, 2, 4), (4, 512, 4, 2, 4))},
}
#: ``--set attn`` (session 7): the merge reading every split (``trim_merge`` off, as before
#: session 7), and split counts that a trimmed merge may favour, one-token steps here. (Runs
#: 63-64 also loaded the attention's first K/V block before the PDL wait, and split the
#: merge over blocks of a head: both lost or were even, and were removed.)
_T1_ATTN: dict[str, dict[str, Any]] = {
    "t1_no_trim": {"trim_merge": False},
    **{f"t1_attn{sp}x{bs}": {"attention": [sp, bs]} for sp, bs in ((64, 64), (16, 64))},
}
#: ``--set ffn`` (session 7): the gate/up and down products of one-token steps loading their
#: first weight tile before the PDL wait (as qkv and wo do); the merge fused into wo again,
#: now that it reads only the splits that hold keys.
_T1_FFN: dict[str, dict[str, Any]] = {
    "t1_w13p": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, "w13": 2 + LATE}},
    "t1_w2p": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, "w2": 2}},
    "t1_w13p_w2p": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, "w13": 2 + LATE, "w2": 2}},
    "t1_fuse_attn_out": {"fuse_attn_out": True},
}
T1_SETS: dict[str, dict[str, dict[str, Any]]] = {
    "each": _T1_MIXES, "t1": _T1_MIXES, "tiles": _T1_TILES, "attn": _T1_ATTN, "ffn": _T1_FFN,
    "one_tile": {},  # verify variants only
    # the one-token defaults of sessions 5 (every next kernel launched at the start), 6, 7, 8
    "final": {"t1_session5": {"pdl_by_t": {"1": 1}, "one_token_pdl": {}, "trim_merge": False,
                              "norm_handoff": False, "atomic_sem": "acq_rel",
                              "by_width": {"896": _W2_0_5B_S8_T1}},
              "t1_session6": {"trim_merge": False, "norm_handoff": False, "atomic_sem": "acq_rel",
                              "by_width": {"896": _W2_0_5B_S8_T1}},
              "t1_session7": {"norm_handoff": False, "atomic_sem": "acq_rel",
                              "by_width": {"896": _W2_0_5B_S8_T1}},
              "t1_session8": {"atomic_sem": "acq_rel", "by_width": {"896": _W2_0_5B_S8_T1}}},
}
T1_SETS["handoff"] = dict(T1_SETS["final"])
#: ``--set fuse`` (session 9, run 83): split-K atomics with Triton's default acq_rel, as before
#: session 9 (relaxed is the default since). Run 83 also timed the one-token feed-forward in
#: one launch (gate/up, SwiGLU and the down projection split over F, float atomics into h;
#: commit 5daee8c): +19 % (1.5B) and +13 % (0.5B) at its best tile, up to +150 %; removed.
T1_SETS["fuse"] = {"t1_acq_rel": {"atomic_sem": "acq_rel"}}
#: ``--set tiles``: split-K qkv tiles of verify steps (with the one-token tile variants).
TILES_VARIANTS: dict[str, dict[str, Any]] = {
    "qkv_" + "_".join(map(str, (c[0], c[1], c[4]))): {"qkv_split": list(c)}
    for c in ((32, 64, 4, 3, 4), (64, 64, 4, 3, 8), (16, 64, 4, 3, 8), (32, 128, 4, 3, 4))
}
#: ``--set final``: the verify defaults of sessions 5 and 6 beside the current ones.
SESSION5_VERIFY_PDL = {"attn": 1, "combine": 1}
#: The verify default of sessions 6-14: every kernel early and late (the same for both shapes).
_ALL_LATE_NOW = {k: 1 + LATE for k in
                 ("embed", "qkv", "rope_kv", "attn", "combine", "wo", "w13", "w2", "out")}
_W2_0_5B_S8 = {"896": {"tiles": {"w2": [32, 128, 4, 3, 8, True]}}}  # verify, before session 9
FINAL_VARIANTS: dict[str, dict[str, Any]] = {
    "session5": {"verify_pdl": SESSION5_VERIFY_PDL, "verify_attention": None,
                 "combine_warps": {}, "trim_merge": False, "atomic_sem": "acq_rel",
                 "verify_handoff": False, "by_width": _W2_0_5B_S8},
    "session6": {"verify_pdl": _ALL_LATE_NOW, "trim_merge": False, "atomic_sem": "acq_rel",
                 "verify_handoff": False, "by_width": _W2_0_5B_S8},
    "session8": {"verify_pdl": _ALL_LATE_NOW, "atomic_sem": "acq_rel", "verify_handoff": False,
                 "by_width": _W2_0_5B_S8},
}
#: ``--set attn``: the same for verify steps.
ATTN_VARIANTS: dict[str, dict[str, Any]] = {
    "no_trim": {"trim_merge": False},
    **{f"attn{sp}x{bs}": {"verify_attention": [sp, bs]} for sp, bs in ((32, 64), (64, 64))},
}
#: ``--set ffn``: the per-pair qkv kernel instead of split-K qkv and its RoPE kernel (one
#: launch fewer), and gate/up's first weight tile before the wait, in verify steps.
FFN_VARIANTS: dict[str, dict[str, Any]] = {
    "per_pair_qkv": {"qkv_split": False},
    "w13p": {"verify_pdl": {**_ALL_LATE_NOW, "w13": 2 + LATE}},
}
#: ``--set one_tile`` (session 8, run 75; all lost or even): split-K tiles of one K tile a
#: program for qkv, wo and down, so that with PDL mode 6 all of a program's weights load before
#: the wait, as in the one-token step (session 6 found the prologue losing where it broke a
#: pipelined loop; here there is no loop). Run 75 also timed the RoPE kernel's early loads
#: (adopted since) as a variant.
_PRO = {**_ALL_LATE_NOW, "qkv": 2 + LATE, "wo": 2 + LATE}
ONE_TILE_VARIANTS: dict[str, dict[str, Any]] = {
    "qkv1": {"qkv_split": [32, 256, 4, 1, 6], "verify_pdl": {**_ALL_LATE_NOW, "qkv": 2 + LATE}},
    "qkv1_wait": {"qkv_split": [32, 256, 4, 1, 6]},
    "wo1": {"tiles": {"wo": [32, 256, 4, 1, 6]}, "verify_pdl": {**_ALL_LATE_NOW, "wo": 2 + LATE}},
    "wo1_wait": {"tiles": {"wo": [32, 256, 4, 1, 6]}},
    "w2_1": {"tiles": {"w2": [32, 256, 4, 1, 35]}, "verify_pdl": {**_ALL_LATE_NOW, "w2": 2 + LATE}},
    "qkv1_wo1": {"qkv_split": [32, 256, 4, 1, 6], "tiles": {"wo": [32, 256, 4, 1, 6]},
                 "verify_pdl": _PRO},
}
#: ``--set handoff`` (session 8, run 79): ``final``'s variants and the unsplit o-projection
#: tile a hand-off in verify steps would need (run 79 also ran that hand-off, since removed:
#: +0.4 to +2.1 %).
HANDOFF_VARIANTS: dict[str, dict[str, Any]] = {
    **FINAL_VARIANTS, "wo16_128": {"tiles": {"wo": [16, 128, 4, 3, 1]}},
}
#: ``--set fuse``: the same in verify steps (split-K qkv, wo, down); ``--set serial`` times
#: acq_rel too, beside its hand-off variants.
FUSE_VARIANTS: dict[str, dict[str, Any]] = {"acq_rel": {"atomic_sem": "acq_rel"}}
#: ``--set serial`` (session 9, run 84): verify steps without the feed-forward norm handed from
#: the split-K o-projection to gate/up (``verify_handoff``, adopted in run 84), with it and
#: gate/up's K tile doubled, or the o-projection in 8 splits; Triton's acq_rel atomics again.
SERIAL_VARIANTS: dict[str, dict[str, Any]] = {
    "no_handoff": {"verify_handoff": False},
    "handoff_w13_128": {"tiles": {"w13": [64, 128, 4, 3, 1, True]}},
    "handoff_wo8": {"tiles": {"wo": [32, 128, 4, 3, 8]}},
    "acq_rel": {"atomic_sem": "acq_rel"},
}
T1_SETS["serial"] = {"t1_acq_rel": {"atomic_sem": "acq_rel"}}
#: (Run 85's --set qkv, verify steps' qkv in one split-K launch of the per-pair kernel
#: finished by the last split of each pair block, no RoPE kernel, lost: +1.7 % @4096 at best,
#: +8 to +18 % for most tiles, 0.5B +2 to +13 %; removed, kept in history as 6344f41.)
#: ``--set atomics`` (session 9, run 86): split-K tiles again now that the partials' atomics
#: are relaxed and verify steps hand the norm off: more or fewer splits for the one-token down
#: projection and the verify steps' down, o-projection and qkv products. The 0.5B's tiles before:
#: one token w2 (8, 1024, 8, 2, 4), verify w2 8 splits; adopted: (2, 1024, 4, 2, 4), 16 splits.
T1_SETS["atomics"] = {
    "t1_w2_" + "_".join(map(str, (c[0], c[1], c[4]))): {"t1_tiles": {"w2": list(c)}}
    for c in ((2, 1024, 4, 2, 2), (8, 1024, 8, 2, 4), (2, 1024, 4, 2, 4), (4, 1024, 4, 2, 4),
              (4, 512, 4, 2, 8), (2, 2048, 4, 2, 1))
}
ATOMICS_VARIANTS: dict[str, dict[str, Any]] = {
    "w2_16": {"tiles": {"w2": [32, 128, 4, 3, 16, True]}},
    "w2_8": {"tiles": {"w2": [32, 128, 4, 3, 8, True]}},
    "w2_4": {"tiles": {"w2": [32, 128, 4, 3, 4, True]}},
    "wo_2": {"tiles": {"wo": [32, 128, 4, 3, 2]}},
    "wo_4": {"tiles": {"wo": [32, 128, 4, 3, 4]}},
    "wo_64_4": {"tiles": {"wo": [64, 128, 4, 3, 4, True]}},
    "qkv_32_64_16": {"qkv_split": [32, 64, 4, 3, 16]},
    "qkv_32_128_4": {"qkv_split": [32, 128, 4, 3, 4]},
}
#: (Run 89's ``--set pairs``, verify steps' qkv in one split-K launch over Wqkv with RoPE pairs
#: side by side, finished by the last split of each column block, lost: +1.6 % at best, and a
#: race made it wrong on the GPU for some tiles (its finish zeroed the sums of squares it had
#: read, which threads holding copies of them could still be reading); removed, kept in
#: history as cbf4ed2. The verify down tiles it also timed: 64 x 128 in 16 splits -0.8 % @512,
#: -0.7 % @4096 for the 1.5B, within the run-to-run spread; not adopted.)
#: (Session 10's ``--set prefetch``, run 92, lost everywhere and was removed; commit d43eb3c
#: holds it: one-token steps asking L2 for the next product's weights from the launch before,
#: +1 to +18 % growing with the bytes asked for; the attention's first K/V block loaded before
#: its PDL wait with the step's own rows after it, +1.4 to +3.3 %.)
#: ``--set boundary`` (session 10, run 94): one-token PDL triggers that stop the early-launch
#: cascade at the attention, and the 0.5B's down projection without its empty fourth K split.
#: (Run 94 also left the attention's K/V loop out, ``ATTN_SKELETON`` in commit 879197f, timing
#: only: it costs the 1.5B 1.9 us a layer @512 and 5.2 @4096, the 0.5B 1.1 and 3.2.)
T1_SETS["boundary"] = {
    "t1_attn_late": {"one_token_pdl": {"attn": 5, "combine": 1, "w2": 1}},
    "t1_qkv_early_attn_late": {"one_token_pdl": {"qkv": 2, "attn": 5, "combine": 1, "w2": 1}},
    "t1_merge_late": {"one_token_pdl": {"attn": 1, "combine": 5, "w2": 1}},
    "t1_w2_split3": {"by_width": {"896": {"t1_tiles": {"w2": [2, 1024, 4, 2, 3]}},
                                  "1536": {"t1_tiles": {"w2": [2, 1024, 4, 2, 2]}}}},
}
#: ``--set splits`` (session 10, run 95): more attention splits in one-token steps, whose loop run 94
#: priced at 5.2 us a layer @4096 (1.5B) for 44 programs, with the merge on more warps (its
#: [splits, head dim] tile on one warp spills as the splits grow).
T1_SETS["splits"] = {
    f"t1_attn{sp}x{bs}_m{w}": {"attention": [sp, bs], "combine_warps": {"1": w}}
    for sp, bs, w in ((32, 64, 4), (64, 64, 4), (64, 32, 4), (128, 32, 4), (128, 32, 8),
                      (256, 16, 8), (128, 16, 8))
}
#: ``--set stages`` (session 10, run 98): block_s 128, and the 1.5B's one-token down projection
#: in three even K splits (its two splits are 5 and 3.75 tiles of 1024). (Run 98 also piped the
#: attention's K/V loop 2, 4 and 5 deep, ``ATTN_STAGES`` in commit 879197f: 4 and 5 +0.1 to
#: +0.8 %, 2 -1.3 % @512 but +2.5 % @4096.)
T1_SETS["stages"] = {
    "t1_attn32x128": {"attention": [32, 128]},
    "t1_w2_split3": {"t1_tiles": {"w2": [2, 1024, 4, 2, 3]}},
    "t1_w2_512_2": {"t1_tiles": {"w2": [2, 512, 4, 2, 2]}},
    "t1_w2_4x1024_3": {"t1_tiles": {"w2": [4, 1024, 4, 2, 3]}},
}
#: ``--set waves`` (session 10, run 103): one-token tiles re-timed in the step where run 97's
#: trace saw programs pass their wait late (a grid of more warps than an SM holds with the
#: kernels around it: the 0.5B's gate/up, 2432 programs of 4 warps, let its last programs go
#: 4.6 us after its first and streamed at 59 % of copy bandwidth), and the qkv kernel with fewer
#: programs (each of its 1024 reads the whole residual from L2 after its wait).
_W: dict[str, dict[str, Any]] = {"896": {}, "1536": {}}
T1_SETS["waves"] = {
    "t1_w13_4x1024_4w": {"by_width": {**_W, "896": {"t1_tiles": {"w13": [4, 1024, 4, 2]}}}},
    "t1_w13_2x1024_2w": {"by_width": {**_W, "896": {"t1_tiles": {"w13": [2, 1024, 2, 2]}}}},
    "t1_w13_4x1024_2w": {"by_width": {**_W, "896": {"t1_tiles": {"w13": [4, 1024, 2, 2]}}}},
    "t1_w13_8x1024_4w": {"by_width": {**_W, "896": {"t1_tiles": {"w13": [8, 1024, 4, 2]}}}},
    "t1_w2_2x1024_2w": {"by_width": {"896": {"t1_tiles": {"w2": [2, 1024, 2, 2, 4]}},
                                     "1536": {"t1_tiles": {"w2": [2, 1024, 2, 2, 2]}}}},
    "t1_qkv_2": {"by_width": {"896": {"t1_tiles": {"qkv": [2, 1024]}},
                              "1536": {"t1_tiles": {"qkv": [2, 2048]}}}},
    "t1_wo_4w": {"by_width": {"896": {"t1_tiles": {"wo": [2, 1024, 2, 2]}},
                              "1536": {"t1_tiles": {"wo": [2, 2048, 4, 2]}}}},
}
#: ``--set waves2`` (session 10, run 104): the 0.5B's one-token gate/up around run 103's pick,
#: now the default, against the tile before it.
T1_SETS["waves2"] = {
    "t1_w13_2x1024_4w_s9": {"t1_tiles": {"w13": [2, 1024, 4, 2]}},
    "t1_w13_4x1024_2w": {"t1_tiles": {"w13": [4, 1024, 2, 2]}},
    "t1_w13_16x1024_4w": {"t1_tiles": {"w13": [16, 1024, 4, 2]}},
    "t1_w13_16x1024_8w": {"t1_tiles": {"w13": [16, 1024, 8, 2]}},
    "t1_w13_8x1024_8w": {"t1_tiles": {"w13": [8, 1024, 8, 2]}},
    "t1_w13_8x1024_2w": {"t1_tiles": {"w13": [8, 1024, 2, 2]}},
}
#: ``--set prefetch`` (session 11): one-token products with the next K tile's loads issued before
#: this tile's reduction (``LinearConfig.prefetch``; lists are LinearConfig's fields in order:
#: block_n, block_k, warps, stages, split_k, swap, rows, prefetch). Run 97's trace and the down
#: projection's PTX: each program waits one DRAM round trip a K tile. ptxas registers (sm_90a):
#: down 2 x 1024 38 -> 44, 4 x 1024 64; gate/up 8 x 256 40 -> 61, 8 x 128 48; output 16 x 256
#: 56 -> 72, 16 x 128 56, 32 x 128 54 -> 96.
#: (swap, rows, prefetch): the row layout alone, and prefetching in it (runs 105-106 ran
#: prefetch without the row layout; it now needs it)
_R, _RP = [False, True, False], [False, True, True]
T1_SETS["prefetch"] = {
    "t1_w2_pf": {"by_width": {"896": {"t1_tiles": {"w2": [2, 1024, 4, 2, 4, *_RP]}},
                              "1536": {"t1_tiles": {"w2": [2, 1024, 4, 2, 2, *_RP]}}}},
    "t1_w2_4x1024_pf": {"by_width": {"896": {"t1_tiles": {"w2": [4, 1024, 4, 2, 4, *_RP]}},
                                     "1536": {"t1_tiles": {"w2": [4, 1024, 4, 2, 2, *_RP]}}}},
    "t1_w2_2048": {"t1_tiles": {"w2": [2, 2048, 4, 2, 2]}},
    "t1_w2_pf_b": {"by_width": {"896": {"t1_tiles": {"w2": [2, 1024, 4, 2, 2, *_RP]}},
                                "1536": {"t1_tiles": {"w2": [2, 512, 4, 2, 2, *_RP]}}}},
    "t1_w13_pf": {"by_width": {**_W, "1536": {"t1_tiles": {"w13": [8, 256, 4, 2, 1, *_RP]}}}},
    "t1_w13_8x128_pf": {"by_width": {**_W, "1536": {"t1_tiles": {"w13": [8, 128, 4, 2, 1, *_RP]}}}},
    "t1_out_pf": {"by_width": {"896": {"t1_tiles": {"out": [32, 128, 4, 2, 1, *_RP]}},
                               "1536": {"t1_tiles": {"out": [16, 256, 4, 2, 1, *_RP]}}}},
    "t1_out_16x128_pf": {"t1_tiles": {"out": [16, 128, 4, 2, 1, *_RP]}},
    "t1_w2_w13_pf": {"by_width": {"896": {"t1_tiles": {"w2": [2, 1024, 4, 2, 4, *_RP]}},
                                  "1536": {"t1_tiles": {"w2": [2, 1024, 4, 2, 2, *_RP],
                                                        "w13": [8, 256, 4, 2, 1, *_RP]}}}},
}
#: ``--set prefetch2`` (session 11): the down projection's prefetching tiles again, x now loaded in
#: the iteration rather than carried (run 105 carried it: registers 44 for 2 x 1024, 64 for
#: 4 x 1024; now 40 and 55), and the 4-row tiles without prefetch to tell the two apart.
T1_SETS["prefetch2"] = {
    "t1_w2_pf": T1_SETS["prefetch"]["t1_w2_pf"],
    "t1_w2_4x1024_pf": T1_SETS["prefetch"]["t1_w2_4x1024_pf"],
    "t1_w2_4x1024": {"by_width": {"896": {"t1_tiles": {"w2": [4, 1024, 4, 2, 4]}},
                                  "1536": {"t1_tiles": {"w2": [4, 1024, 4, 2, 2]}}}},
    "t1_w2_4x1024_pf_b": {"by_width": {"896": {"t1_tiles": {"w2": [4, 1024, 4, 2, 2, *_RP]}},
                                       "1536": {"t1_tiles": {"w2": [4, 1024, 4, 2, 3, *_RP]}}}},
    "t1_w2_4x1024_8w_pf": {"by_width": {"896": {"t1_tiles": {"w2": [4, 1024, 8, 2, 4, *_RP]}},
                                        "1536": {"t1_tiles": {"w2": [4, 1024, 8, 2, 2, *_RP]}}}},
    "t1_w2_2x1024_pf3": {"by_width": {"896": {"t1_tiles": {"w2": [2, 1024, 4, 2, 3, *_RP]}},
                                      "1536": {"t1_tiles": {"w2": [2, 1024, 4, 2, 2]}}}},
}


def _both(name: str, w1536: list[Any], w896: list[Any]) -> dict[str, Any]:
    """A one-token tile for each model's shape."""
    return {"by_width": {"1536": {"t1_tiles": {name: w1536}}, "896": {"t1_tiles": {name: w896}}}}


#: ``--set rows`` (session 11): one-token products in the row layout (``LinearConfig.rows``: x read
#: in the weight tile's layout, sums per row until after the loop; with a row a warp, i.e. 256
#: bfloat16 columns, the K loop has no block barrier), with and without prefetch. Lists:
#: block_n, block_k, warps, stages, split_k, swap, rows, prefetch. ptxas registers (sm_90a):
#: down 4 x 256 24 (26 prefetching), 8 x 256 on 8 warps 26; gate/up 8 x 256 46 (64), 8 x 128
#: 39; output 16 x 128 52, 8 x 256 40 (52).
T1_SETS["rows"] = {
    "t1_w2_r4x256_pf": _both("w2", [4, 256, 4, 2, 2, *_RP], [4, 256, 4, 2, 4, *_RP]),
    "t1_w2_r4x256": _both("w2", [4, 256, 4, 2, 2, *_R], [4, 256, 4, 2, 4, *_R]),
    "t1_w2_r8x256_8w_pf": _both("w2", [8, 256, 8, 2, 2, *_RP], [8, 256, 8, 2, 4, *_RP]),
    "t1_w2_r4x256_pf_b": _both("w2", [4, 256, 4, 2, 4, *_RP], [4, 256, 4, 2, 2, *_RP]),
    "t1_w2_r2x256_2w_pf": _both("w2", [2, 256, 2, 2, 4, *_RP], [2, 256, 2, 2, 4, *_RP]),
    "t1_w13_r8x256_pf": {"t1_tiles": {"w13": [8, 256, 4, 2, 1, *_RP]}},
    "t1_w13_r8x256": {"t1_tiles": {"w13": [8, 256, 4, 2, 1, *_R]}},
    "t1_w13_r8x128_pf": {"t1_tiles": {"w13": [8, 128, 4, 2, 1, *_RP]}},
    "t1_out_r16x128_pf": {"t1_tiles": {"out": [16, 128, 4, 2, 1, *_RP]}},
    "t1_out_r8x256_pf": {"t1_tiles": {"out": [8, 256, 4, 2, 1, *_RP]}},
    "t1_out_r8x256": {"t1_tiles": {"out": [8, 256, 4, 2, 1, *_R]}},
}
#: ``--set rows2`` (session 11, the 1.5B): run 107's one win (gate/up in the row layout, 8 x 256,
#: -1.1 / -1.0 %) against other row tiles (registers: 16 x 256 on 8 warps 46, on 4 warps 54;
#: 4 x 256 on 2 warps 46), and the down projection's 2 x 1024 tile in the row layout (its rows
#: span warps: a barrier a tile still), with and without prefetch.
T1_SETS["rows2"] = {
    "t1_w13_r8x256": {"t1_tiles": {"w13": [8, 256, 4, 2, 1, *_R]}},
    "t1_w13_r16x256_8w": {"t1_tiles": {"w13": [16, 256, 8, 2, 1, *_R]}},
    "t1_w13_r16x256": {"t1_tiles": {"w13": [16, 256, 4, 2, 1, *_R]}},
    "t1_w13_r4x256_2w": {"t1_tiles": {"w13": [4, 256, 2, 2, 1, *_R]}},
    "t1_w2_r2x1024_pf": {"t1_tiles": {"w2": [2, 1024, 4, 2, 2, *_RP]}},
    "t1_w2_r2x1024": {"t1_tiles": {"w2": [2, 1024, 4, 2, 2, *_R]}},
    "t1_w13_r8x256_w2_r2x1024_pf": {"t1_tiles": {"w13": [8, 256, 4, 2, 1, *_R],
                                                 "w2": [2, 1024, 4, 2, 2, *_RP]}},
}
#: ``--set warps`` (session 11): the one-token attention's programs on 1, 2 or 8 warps (4 since
#: session 1, never timed otherwise: at 512 positions a program has one 64-key block, and its
#: softmax reduces across warps behind block barriers); session 10's one-token tiles against the
#: row-layout ones now the 1.5B's default; the 0.5B's down projection and gate/up in the row
#: layout (run 108's 1.5B pick).
_S10_1536 = {"t1_tiles": {"w13": [8, 256, 4, 2], "w2": [2, 1024, 4, 2, 2]}}
T1_SETS["warps"] = {
    "t1_attn_1w": {"attn_warps": {"1": 1}},
    "t1_attn_2w": {"attn_warps": {"1": 2}},
    "t1_attn_8w": {"attn_warps": {"1": 8}},
    "t1_session10": {"by_width": {"1536": _S10_1536, "896": {}}},
    "t1_w2_r2x1024_pf": {"by_width": {"1536": {}, "896": {
        "t1_tiles": {"w2": [2, 1024, 4, 2, 4, *_RP]}}}},
    "t1_w13_r8x1024": {"by_width": {"1536": {}, "896": {
        "t1_tiles": {"w13": [8, 1024, 4, 2, 1, *_R]}}}},
}
#: ``--set final11`` (session 11, the closing run): the defaults against session 10's one-token
#: tiles, and run 109's near-miss (the 1.5B's one-token attention on 8 warps: -0.2 / -0.6 %).
T1_SETS["final11"] = {
    "t1_session10": {"by_width": {"1536": _S10_1536, "896": {}}},
    "t1_attn_8w": {"by_width": {"1536": {"attn_warps": {"1": 8}}, "896": {}}},
}
#: ``--set seg`` (session 11, built after the session's device time was spent; run 115 in
#: session 12): the down projection's 2 x 1024 tile in the row layout read as 4 segments of 256 a row
#: (``LinearConfig.segments``), so that its rows, wider than a warp's 256 columns, reduce without
#: a block barrier too (sm_90a: 32 registers, 36 prefetching; no `bar.sync` in the loop), with
#: and without prefetch. Lists: block_n, block_k, warps, stages, split_k, swap, rows, prefetch,
#: segments.
T1_SETS["seg"] = {
    "t1_w2_seg4_pf": _both("w2", [2, 1024, 4, 2, 2, *_RP, 4], [2, 1024, 4, 2, 4, *_RP, 4]),
    "t1_w2_seg4": _both("w2", [2, 1024, 4, 2, 2, *_R, 4], [2, 1024, 4, 2, 4, *_R, 4]),
    "t1_w2_4x1024_seg4_pf": _both("w2", [4, 1024, 4, 2, 2, *_RP, 4], [4, 1024, 4, 2, 4, *_RP, 4]),
    "t1_w2_2x2048_seg8_pf": _both("w2", [2, 2048, 4, 2, 2, *_RP, 8], [2, 2048, 4, 2, 2, *_RP, 8]),
    "t1_w2_1x1024_seg4_pf": _both("w2", [1, 1024, 4, 2, 4, *_RP, 4], [1, 1024, 4, 2, 4, *_RP, 4]),
}
#: ``--set prologue12`` (session 12): the down projection's first K tile loaded before its PDL
#: wait (mode 2; 6 with the late trigger), now that the row layout's prefetching loop carries
#: that tile into its first iteration (session 8's run 65 tried it on the loop before: +0.7 to
#: +6 %). Its programs become resident as gate/up's leave, and would then read 4 KB each
#: during gate/up's tail instead of after its flush. Also with gate/up letting it launch at
#: its start (mode 1), and the 0.5B's down in the row layout prefetching (run 109 without the
#: prologue: +1.4 / +2.3 %). Runs 116-117 timed these sets against session 11's PDL
#: (``_S11_PDL``), on which they are built; the default has since become ``_W13E_W2P``.
_S11_PDL = {"attn": 1, "combine": 1, "w2": 1}
_W2P = {**_S11_PDL, "w2": 2}
T1_SETS["prologue12"] = {
    "t1_w2_prologue": {"one_token_pdl": _W2P},
    "t1_w2_prologue_late": {"one_token_pdl": {**_S11_PDL, "w2": 2 + LATE}},
    "t1_w2_prologue_w13_early": {"one_token_pdl": {**_W2P, "w13": 1}},
    "t1_w2_prologue_rp896": {"one_token_pdl": _W2P, "by_width": {"1536": {}, "896": {
        "t1_tiles": {"w2": [2, 1024, 4, 2, 4, *_RP]}}}},
}
#: ``--set prologue12b`` (session 12, after run 116: the down projection's prologue with gate/up
#: letting it launch at gate/up's start: -0.66 / -0.62 % (1.5B), +0.0 / -1.0 % (0.5B); the
#: prologue alone -0.2 / -0.0 %, +0.9 / +1.0 %): that pair again, gate/up's early launch alone
#: as its control, and the pair with the 0.5B's down in the row layout prefetching.
_W13E_W2P = {**_W2P, "w13": 1}
T1_SETS["prologue12b"] = {
    "t1_w2_prologue_w13_early": {"one_token_pdl": _W13E_W2P},
    "t1_w13_early": {"one_token_pdl": {**_S11_PDL, "w13": 1}},
    "t1_w2_prologue_w13_early_rp896": {"one_token_pdl": _W13E_W2P, "by_width": {
        "1536": {}, "896": {"t1_tiles": {"w2": [2, 1024, 4, 2, 4, *_RP]}}}},
}
#: ``--set prologue12c`` (session 12, after run 117 adopted gate/up's early launch with the
#: down projection's prologue, ``generate.DEFAULT_ONE_TOKEN_PDL``): session 11's settings as
#: a control; the same pattern one boundary earlier (gate/up in the row layout prefetching,
#: so its first tile loads before its wait, with the o-projection launching it early or
#: late); the 1.5B's down in 4 x 1024 tiles (8 KB a program before its wait).
_W13P = _both("w13", [8, 256, 4, 2, 1, *_RP], [8, 1024, 4, 2])
T1_SETS["prologue12c"] = {
    "t1_session11": {"one_token_pdl": _S11_PDL},
    "t1_w13_prologue": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, "w13": 2}, **_W13P},
    "t1_wo_early_w13_prologue": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, "w13": 2, "wo": 2},
                                 **_W13P},
    "t1_w2_4x1024_pf": _both("w2", [4, 1024, 4, 2, 2, *_RP], [2, 1024, 4, 2, 4]),
}
#: ``--set prologue12d`` (session 12, 1.5B): gate/up's first K tile before its wait without
#: the prefetching loop's registers (the row layout's prologue, new after run 118: the first
#: tile reduced after the wait, the loop taking the rest), with the o-projection launching it
#: late (as now) or early. Run 118's prologue with prefetch lost 11 % (64 registers).
T1_SETS["prologue12d"] = {
    "t1_w13_prologue_rows": {"by_width": {"1536": {
        "one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, "w13": 2}}, "896": {}}},
    "t1_wo_early_w13_prologue_rows": {"by_width": {"1536": {
        "one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, "w13": 2, "wo": 2}}, "896": {}}},
}
#: ``--set w13_12`` (session 12): gate/up's tiles again now that the down projection's
#: programs launch during it (run 121's trace, 1.5B @512: gate/up's loop 16.6 µs, 78 % of
#: copy bandwidth, against 16.1 before; the down projection's 7.2, 90 %, against 8.5): in the
#: row layout 16 x 256 on 8 warps and 4 x 256 on 2 (run 108: -1.0 / -0.8 %, +0.0 / -0.2 %
#: against session 10's), session 10's 8 x 256; the 0.5B's 4 rows on 2 warps (run 104).
T1_SETS["w13_12"] = {
    "t1_w13_r16x256_8w": _both("w13", [16, 256, 8, 2, 1, *_R], [4, 1024, 2, 2]),
    "t1_w13_r4x256_2w": _both("w13", [4, 256, 2, 2, 1, *_R], [8, 1024, 4, 2]),
    "t1_w13_8x256": _both("w13", [8, 256, 4, 2], [8, 1024, 4, 2]),
}
#: ``--set w13_12b`` (session 12, 0.5B): run 122 gave its gate/up in 4 rows on 2 warps -1.8 /
#: -2.0 % (run 104, under the PDL before: +0.6 / -0.2 %); again, and 2 or 4 rows on 1 warp,
#: 8 rows on 2.
T1_SETS["w13_12b"] = {
    "t1_w13_4x1024_2w": {"t1_tiles": {"w13": [4, 1024, 2, 2]}},
    "t1_w13_2x1024_1w": {"t1_tiles": {"w13": [2, 1024, 1, 2]}},
    "t1_w13_4x1024_1w": {"t1_tiles": {"w13": [4, 1024, 1, 2]}},
    "t1_w13_8x1024_2w": {"t1_tiles": {"w13": [8, 1024, 2, 2]}},
}
#: ``--set l2side`` (session 13): each layer's gate/up weights partly asked into L2 from a side
#: stream of the one-token step's graph (``Runner.l2_prefetch``: the rows of its last programs,
#: [MB, programs]) once the layer before is done, while qkv, the attention, its merge and the
#: o-projection (~10 µs a layer) leave DRAM idle. Every L2 prefetch before asked from a kernel
#: of that chain (sessions 3, 5, 7, 10: runs 16, 66, 67, 92) and lost; this one is on no
#: kernel's path. 1.5B gate/up: 52.5 MB a layer; 0.5B: 16.6 MB.
T1_SETS["l2side"] = {
    f"t1_pf{a}_{p}": {"by_width": {"1536": {"l2_prefetch": [a, p]},
                                   "896": {"l2_prefetch": [b, p]}}}
    for a, b, p in ((8, 4, 16), (16, 8, 16), (24, 12, 16), (16, 8, 32), (32, 16, 32))
}
#: ``--set l2side2`` (session 13, after runs 127-128: asked for once the layer before is done,
#: the prefetch ran beside qkv and held its loop up, 2.3 -> 4.9 / 9.2 µs with 8 / 16 MB, while
#: gate/up's loop gained 0.8 / 1.0 µs; 4 MB from 64 programs, a short burst, gave -0.3 % @512 and
#: -2.4 % @4096): asked for after qkv (1) or after the attention's merge (2) instead, from 16-64
#: programs; [1.5B MB, programs, after] with the 0.5B asking for half the MB.
T1_SETS["l2side2"] = {
    f"t1_pf{a}_{p}_at{at}": {"by_width": {"1536": {"l2_prefetch": [a, p, at]},
                                          "896": {"l2_prefetch": [a / 2, p, at]}}}
    for a, p, at in ((4, 64, 0), (8, 64, 1), (16, 64, 1), (24, 64, 1), (8, 16, 1), (16, 32, 1),
                     (8, 64, 2), (16, 64, 2))
}
#: ``--set l2side3`` (session 13, 1.5B, after run 129: after qkv or after the merge the prefetch
#: held up the attention's loop (3.3 -> 5.6 µs with 16 MB after qkv) or the o-projection's;
#: only a short burst right after the layer before paid, 4 MB from 64 programs: -0.7 % @512,
#: -1.6 % @4096 (run 128: -0.3 / -2.4 %); the 0.5B's 2 MB lost @512): bursts of 2-8 MB from
#: 32-128 programs after the layer before.
T1_SETS["l2side3"] = {
    f"t1_pf{a}_{p}": {"l2_prefetch": [a, p, 0]}
    for a, p in ((2, 64), (4, 64), (6, 64), (4, 32), (4, 128), (8, 128))
}
#: ``--set l2side4`` (session 13, after run 130: 8 MB from 128 programs -1.5 % @512, -2.7 %
#: @4096; the faster the burst, the better): larger bursts from 128-256 programs; the 0.5B
#: asking for a quarter of the 1.5B's MB (its gate/up is 16.6 MB a layer).
T1_SETS["l2side4"] = {
    f"t1_pf{a}_{p}": {"by_width": {"1536": {"l2_prefetch": [a, p, 0]},
                                   "896": {"l2_prefetch": [a / 4, p, 0]}}}
    for a, p in ((8, 128), (8, 256), (12, 128), (12, 256), (16, 256), (24, 256))
}
#: ``--set final13`` (session 13): the default (the 1.5B's gate/up asking L2 for 8 MB from a
#: side stream, ``tuning.L2_PREFETCH``) against session 12's (no prefetch), and 6 MB from 64
#: programs.
T1_SETS["final13"] = {
    "t1_session12": {"l2_prefetch": None},
    "t1_pf6_64": {"by_width": {"1536": {"l2_prefetch": [6, 64, 0]}, "896": {}}},
}
#: (Session 13's ``--set l2v``, run 134, verify steps asking L2 for gate/up's weights the same
#: way, lost: 1.5B +1.4 to +4.3 %, 0.5B -0.3 % at best; removed, commit d5a7a2a holds it.)
#: (Session 13's ``--set mid13``, run 126, gate/up or the down projection letting the next
#: kernel launch partway through its K loop (``kernels.PDL_MID``) instead of at its start,
#: lost: gate/up +2.1 to +4.0 % (1.5B, every j), ±0.2 % (0.5B); the down projection
#: +0.9 to +3.8 %; removed, commit 66ef5ba holds it.)
#: (Session 10's ``--set cluster``, runs 99-100, one-token attention as one thread-block-cluster
#: launch with the splits merged through distributed shared memory, lost: at best +2.8 % @512,
#: +11.8 % @4096 (1.5B), +5.5 / +20 % (0.5B); removed, kept in history as eafbe9b.)
#: (Session 10's ``--set merge_sb``, run 101, more splits with the merge reading the partials
#: 16 or 32 splits at a time, lost: +0.1 to +21 %; commit 98efb21 holds it.)


def _pdl15(**modes: int) -> dict[str, Any]:
    return {"verify_pdl": {**_ALL_LATE_NOW, **modes}}


#: ``--set tiles15`` (session 15, run 145, 1.5B @4096): verify gate/up and down tiles under
#: session 14's default, every verify kernel launching its successor late (all lost or within
#: 0.5 %).
TILES15_VARIANTS: dict[str, dict[str, Any]] = {
    f"{m}_{c[0]}x{c[1]}_s{c[3]}_k{c[4]}": {"tiles": {m: list(c)}, "verify_pdl": _ALL_LATE_NOW}
    for m, cs in (("w13", ((32, 64, 4, 4, 1, True), (64, 64, 4, 6, 1, True),
                           (32, 128, 4, 3, 1, True), (16, 128, 4, 4, 1, True))),
                  ("w2", ((32, 128, 4, 4, 8, True), (64, 128, 4, 3, 8, True),
                          (16, 128, 4, 3, 8, True), (32, 256, 4, 3, 4, True))))
    for c in cs
}
#: ``--set early15`` (session 15, runs 146-148 and 152): one kernel at a time, then together,
#: letting its successor launch at its start (mode 1) instead of after its main loop;
#: ``session14`` is session 14's default (every verify kernel late) against today's. (Runs
#: 146-147's swapped-operand weight prologue and one-launch split-K qkv lost and are gone;
#: commit 890aa4f holds them and their variants.)
EARLY15_VARIANTS: dict[str, dict[str, Any]] = {
    "session14": {"verify_pdl": _ALL_LATE_NOW},
    "w2": _pdl15(w2=1), "qkv": _pdl15(qkv=1), "w13": _pdl15(w13=1), "combine": _pdl15(combine=1),
    "w2_qkv": _pdl15(w2=1, qkv=1),
    "w2_qkv_rope": _pdl15(w2=1, qkv=1, rope_kv=1),
    "w2_qkv_attn": _pdl15(w2=1, qkv=1, attn=1),
    "w2_qkv_rope_w2_64": {**_pdl15(w2=1, qkv=1, rope_kv=1),
                          "tiles": {"w2": [64, 128, 4, 3, 8, True]}},
    "w2_qkv_rope_attn": _pdl15(w2=1, qkv=1, rope_kv=1, attn=1),  # the 1.5B's, adopted
    "qkv_rope": _pdl15(qkv=1, rope_kv=1),
    "w2_qkv_rope_attn_combine": _pdl15(w2=1, qkv=1, rope_kv=1, attn=1, combine=1),  # the 0.5B's
}
#: ``--set after15`` (session 15, runs 150-152), against today's default: one-token steps whose
#: qkv or o-projection lets its successor launch at its start (run 150); verify qkv split,
#: down-projection and attention tiles (run 151); the verify chain's other boundaries early,
#: and no norm hand-off (run 152). All lost or within 0.8 %.


def _chain15(**modes: int) -> dict[str, Any]:
    """Today's verify launches of each model with ``modes`` on top."""
    return {"by_width": {str(w): {"verify_pdl": {**VERIFY_PDL[(w, f)], **modes}}
                         for w, f in ((1536, 8960), (896, 4864))}}


AFTER15_VARIANTS: dict[str, dict[str, Any]] = {
    "w2_64x128": {"tiles": {"w2": [64, 128, 4, 3, 8, True]}},
    **{f"qkv_{c[0]}x{c[1]}_k{c[4]}": {"qkv_split": list(c)}
       for c in ((32, 128, 4, 3, 4), (64, 64, 4, 3, 8), (32, 64, 4, 3, 4), (16, 64, 4, 3, 8))},
    "attn_32x64": {"verify_attention": [32, 64]}, "attn_128x32": {"verify_attention": [128, 32]},
    "w13e": _chain15(w13=1), "woe": _chain15(wo=1), "combine_e": _chain15(combine=1),
    "no_vhand": {"verify_handoff": False},
}
#: ``--set merge16`` (session 16, runs 158-159, timed against session 15's merge: one program
#: a (token, head), of 2 warps in the 1.5B's verify steps): the attention's merge with each
#: (token, head) split over 2 or 4 programs of the head's columns (``Runner.combine_cols``), in
#: verify steps (also with 1 warp a program) and in one-token steps. ``session15`` and
#: ``t1_session15`` are session 15's merge (and one-token attention tiles) against today's
#: default (run 160 ran them before the 1.5B's attention changed).
MERGE16_VARIANTS: dict[str, dict[str, Any]] = {
    "session15": {"combine_cols": {}, "by_width": {"1536": {"combine_warps": 2}}},
    "cols2": {"combine_cols": 2}, "cols4": {"combine_cols": 4},
    "cols2_w1": {"combine_cols": 2, "combine_warps": 1},
    "cols4_w1": {"combine_cols": 4, "combine_warps": 1},
}
#: ``--set splits16`` (session 16, run 162): run 95's more attention splits in one-token steps
#: again, now that a merge can spread a head's columns over programs (``combine_cols``).
T1_SETS["splits16"] = {
    f"t1_attn{sp}x{bs}_c{c}": {"attention": [sp, bs], "combine_cols": {"1": c}}
    for sp, bs, c in ((64, 64, 4), (128, 32, 4), (128, 32, 8), (64, 32, 4), (256, 16, 8))
}
T1_SETS["merge16"] = {"t1_cols2": {"combine_cols": {"1": 2}},
                      "t1_cols4": {"combine_cols": {"1": 4}},
                      "t1_session15": {"combine_cols": {},
                                       "by_width": {"1536": {"attention": [32, 64]}}}}
T1_SETS["tiles15"] = {}
T1_SETS["early15"] = {}
T1_SETS["after15"] = {
    f"t1_{name}": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, **modes}}
    for name, modes in (("qkv_early", {"qkv": 2}), ("wo_early", {"wo": 2}),
                        ("both_early", {"qkv": 2, "wo": 2}))
}
#: ``--set sweep17`` (session 17, run 164; each model ran alone there, so a setting for one
#: model only is an A/A check for the other): verify attention splits under the merge spread
#: over columns, unswapped 16-row o-projection tiles, the 0.5B's verify merge in 2 or 4
#: programs of one warp; one-token merges in 8 programs, the 0.5B's attention in 64 x 32 with
#: its merge in 8 or in 32 x 64 with its merge in 4.
_WO16 = {"by_width": {"896": {"tiles": {"wo": [16, 128, 4, 3, 8]}},
                      "1536": {"tiles": {"wo": [16, 128, 4, 3, 4]}}}}
SWEEP17_VARIANTS: dict[str, dict[str, Any]] = {
    "va128": {"by_width": {"1536": {"verify_attention": [128, 32]}}},
    "va128_c4": {"verify_attention": [128, 32], "combine_cols": 4,
                 "by_width": {"896": {"combine_warps": 1}}},
    "va32x64": {"by_width": {"1536": {"verify_attention": [32, 64]}}},
    "wo16": _WO16,
    "wo16_2": {"by_width": {"1536": {"tiles": {"wo": [16, 128, 4, 3, 2]}},
                            "896": {"tiles": {"wo": [16, 128, 4, 3, 4]}}}},
    "c2w1": {"by_width": {"896": {"combine_cols": 2, "combine_warps": 1}}},
    "c4w1": {"by_width": {"896": {"combine_cols": 4, "combine_warps": 1}}},
}
T1_SETS["sweep17"] = {
    "t1_c8": {"combine_cols": {"1": 8}},
    "t1_a64x32_c8": {"by_width": {"896": {"attention": [64, 32], "combine_cols": {"1": 8}}}},
    "t1_a32x64_c4": {"by_width": {"896": {"attention": [32, 64], "combine_cols": {"1": 4}}}},
    "t1_c4": {"combine_cols": {"1": 4}},
}
#: ``--set early17`` (session 17, run 165): verify gate/up letting the down projection launch
#: at its start (run 152's loss again), also with the down projection letting qkv go only
#: after its loop (stopping the early-launch cascade there); the 0.5B's o-projection in 16
#: unswapped rows, 8 or 16 splits.
_VPDL = {k: 1 + K.PDL_LATE for k in ("embed", "combine", "wo", "out")} | {
    "qkv": 1, "rope_kv": 1, "attn": 1}
EARLY17_VARIANTS: dict[str, dict[str, Any]] = {
    "w13e": {"verify_pdl": {**_VPDL, "w13": 1, "w2": 1},
             "by_width": {"896": {"verify_pdl": {**_VPDL, "combine": 1, "w13": 1, "w2": 1}}}},
    "w13e_w2late": {"verify_pdl": {**_VPDL, "w13": 1, "w2": 1 + K.PDL_LATE},
                    "by_width": {"896": {"verify_pdl": {**_VPDL, "combine": 1, "w13": 1,
                                                        "w2": 1 + K.PDL_LATE}}}},
    "wo16": {"by_width": {"896": {"tiles": {"wo": [16, 128, 4, 3, 8]}}}},
    "wo16_16": {"by_width": {"896": {"tiles": {"wo": [16, 128, 4, 3, 16]}}}},
}
T1_SETS["early17"] = {"t1_c8": {"combine_cols": {"1": 8}}, "t1_c4": {"combine_cols": {"1": 4}}}
#: ``--set wait17`` (session 17, run 166): kernels that let their successor launch after their
#: main loop letting it go right after their PDL wait instead (``kernels.PDL_AFTER_WAIT``):
#: one-token qkv and o-projection, whose loops are one load and reduction; with the attention
#: then letting its merge go only after its loop; verify o-projection and the 1.5B's merge.
_AW = K.PDL_AFTER_WAIT
T1_SETS["wait17"] = {
    f"t1_{name}": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, **modes}}
    for name, modes in (("qkv_aw", {"qkv": 2 + _AW}),
                        ("qkv_aw_attn_late", {"qkv": 2 + _AW, "attn": 1 + K.PDL_LATE}),
                        ("wo_aw", {"wo": 2 + _AW}), ("both_aw", {"qkv": 2 + _AW, "wo": 2 + _AW}))
}
WAIT17_VARIANTS: dict[str, dict[str, Any]] = {
    "wo_aw": {"verify_pdl": {**_VPDL, "w13": 1 + K.PDL_LATE, "w2": 1, "wo": 1 + _AW},
              "by_width": {"896": {"verify_pdl": {**_VPDL, "combine": 1, "w13": 1 + K.PDL_LATE,
                                                  "w2": 1, "wo": 1 + _AW}}}},
    "merge_aw": {"by_width": {"1536": {"verify_pdl": {**_VPDL, "w13": 1 + K.PDL_LATE, "w2": 1,
                                                      "combine": 1 + _AW}}}},
}
#: ``--set wait17b`` (session 17, run 167): run 166's one gain again (the 1.5B's verify merge
#: letting the o-projection go after its wait), with the merge in 4 programs; the 0.5B's
#: merge (which lets it go at its start) after its wait; the RoPE kernel's and the attention's
#: successors let go after their wait instead of at their start; the one-token merge in 4
#: programs (session 16's) against 8.
_V15 = {**_VPDL, "w13": 1 + K.PDL_LATE, "w2": 1}
_V05 = {**_V15, "combine": 1}
WAIT17B_VARIANTS: dict[str, dict[str, Any]] = {
    "merge_aw": {"verify_pdl": {**_V15, "combine": 1 + _AW},
                 "by_width": {"896": {"verify_pdl": {**_V05, "combine": 1 + _AW}}}},
    "merge_aw_c4": {"verify_pdl": {**_V15, "combine": 1 + _AW}, "combine_cols": 4,
                    "by_width": {"896": {"verify_pdl": {**_V05, "combine": 1 + _AW}}}},
    "rope_aw": {"verify_pdl": {**_V15, "rope_kv": 1 + _AW},
                "by_width": {"896": {"verify_pdl": {**_V05, "rope_kv": 1 + _AW}}}},
    "attn_aw": {"verify_pdl": {**_V15, "attn": 1 + _AW},
                "by_width": {"896": {"verify_pdl": {**_V05, "attn": 1 + _AW}}}},
}
T1_SETS["wait17b"] = {"t1_c4": {"combine_cols": {"1": 4}}}
#: ``--set wait17c`` (session 17, run 168): the rest of the chain's launch points after the
#: wait: one-token merge, attention and down projection (which let theirs go at their start);
#: the verify down projection the same.
T1_SETS["wait17c"] = {
    f"t1_{name}": {"one_token_pdl": {**DEFAULT_ONE_TOKEN_PDL, **modes}}
    for name, modes in (("merge_aw", {"combine": 1 + _AW}), ("attn_aw", {"attn": 1 + _AW}),
                        ("w2_aw", {"w2": 2 + _AW}))
}
WAIT17C_VARIANTS: dict[str, dict[str, Any]] = {
    "w2_aw": {"verify_pdl": {**_V15, "combine": 1 + _AW, "w2": 1 + _AW}},
}
#: ``--set warps17`` (session 17, run 169): with the verify merge letting the o-projection go
#: after its wait: the merge in 2 or 4 programs of two warps, the 1.5B's RoPE kernel on 2 warps,
#: the o-projection letting gate/up go after its wait again; the 1.5B's one-token merge (8
#: programs) on two warps.
WARPS17_VARIANTS: dict[str, dict[str, Any]] = {
    "c2w2": {"combine_cols": 2, "combine_warps": 2},
    "c4w2": {"combine_cols": 4, "combine_warps": 2},
    # (rope_warps is at most head_dim / 64: 2 for the 1.5B, 1 for the 0.5B; run 169 also
    # asked for 4, which the Runner refused)
    "rope2w": {"by_width": {"1536": {"rope_warps": 2}}},
    "wo_aw": {"verify_pdl": {**_V15, "combine": 1 + _AW, "wo": 1 + _AW}},
}
T1_SETS["warps17"] = {"t1_c8w2": {"by_width": {"1536": {"combine_warps": {"1": 2}}}}}
#: ``--set pro17`` (session 17, run 170): verify weight prologues again, now that the merge
#: lets the o-projection launch 1.5 us before its release (run 168's trace): the 1.5B's
#: o-projection (unswapped; the 0.5B's is swapped, which has no prologue: an A/A check) with
#: its first K tile before its wait, letting gate/up go after its loop or after its wait; the
#: split-K qkv product's first tile before its wait.
PRO17_VARIANTS: dict[str, dict[str, Any]] = {
    "wo_pro": {"verify_pdl": {**_V15, "combine": 1 + _AW, "wo": 2 + K.PDL_LATE}},
    "wo_pro_aw": {"verify_pdl": {**_V15, "combine": 1 + _AW, "wo": 2 + _AW}},
    "qkv_pro": {"verify_pdl": {**_V15, "combine": 1 + _AW, "qkv": 2}},
}
T1_SETS["pro17"] = {}
#: ``--set final17`` (session 17, run 171): session 16's defaults (the verify merge letting the
#: o-projection go after its loop (1.5B) or at its start (0.5B); the 1.5B's one-token merge in
#: 4 programs) against today's.
FINAL17_VARIANTS: dict[str, dict[str, Any]] = {
    "session16": {"verify_pdl": {**_V15, "combine": 1 + K.PDL_LATE},
                  "by_width": {"896": {"verify_pdl": _V05}}},
}
T1_SETS["final17"] = {"t1_session16": {"by_width": {"1536": {"combine_cols": {"1": 4}}}}}
#: ``--set trace18`` (session 18, for the next device run; with ``trace_step.py --variants``):
#: verify gate/up letting the down projection launch at its start (run 165 lost 5 % with it,
#: also with the down projection then letting qkv go only after its loop, and did not say
#: why), on today's verify launches (``_chain15``, so these follow the defaults); ``w13aw``
#: lets it go after gate/up's wait instead (session 19), between "at its start" and the
#: default "after its loop".
TRACE18_VARIANTS: dict[str, dict[str, Any]] = {
    "w13e": _chain15(w13=1), "w13e_w2late": _chain15(w13=1, w2=1 + K.PDL_LATE),
    "w13aw": _chain15(w13=1 + K.PDL_AFTER_WAIT),
}
T1_SETS["trace18"] = {}
#: ``--set place19`` (session 19): run 172's trace put trace18's loss in the down projection's
#: loop (8.45 -> 10.50 us a layer), not gate/up's. Its 384 programs (48 row blocks x 8 splits),
#: resident while gate/up's 140 hold their SMs, may be packed onto fewer SMs than when they
#: arrive as gate/up's programs leave. Tiles that fit them evenly beside gate/up: more
#: shared memory a program (4 or 5 stages: at most 4 or 3 an SM), fewer programs (64-row
#: blocks, or 4 splits: 192), each with gate/up letting the down projection go at its start,
#: and the 4-stage tile alone as a control. Tiles: [rows, K, warps, stages, splits, swap].
PLACE19_VARIANTS: dict[str, dict[str, Any]] = {
    "w13e": _chain15(w13=1),
    **{f"w13e_w2_{n}": {**_chain15(w13=1), "tiles": {"w2": cfg}} for n, cfg in (
        ("s4", [32, 128, 4, 4, 8, True]), ("s5", [32, 128, 4, 5, 8, True]),
        ("n64", [64, 128, 4, 3, 8, True]), ("k4", [32, 128, 4, 3, 4, True]))},
    "w2_s4": {"tiles": {"w2": [32, 128, 4, 4, 8, True]}},
}
T1_SETS["place19"] = {}
#: ``--set place19b`` (session 19): run 173's 64-row down projection took its loop back (8.19
#: us against the default's 8.45) but its early programs let qkv's go early too, whose loop
#: grew 4.35 -> 5.63 us: that tile with the down projection then letting qkv go only after its
#: loop, or after its wait, and the tile alone.
_N64 = {"tiles": {"w2": [64, 128, 4, 3, 8, True]}}
PLACE19B_VARIANTS: dict[str, dict[str, Any]] = {
    "w2_n64": _N64,
    "w13e_w2_n64_late": {**_chain15(w13=1, w2=1 + K.PDL_LATE), **_N64},
    "w13e_w2_n64_aw": {**_chain15(w13=1, w2=1 + K.PDL_AFTER_WAIT), **_N64},
}
T1_SETS["place19b"] = {}
#: ``--set spread20`` (session 20): run 186's trace recorded each program's SM. Launched at
#: gate/up's start, the down projection's 384 programs (24 KB each) pile onto the SMs gate/up
#: leaves room on: 104 SMs, up to 6 a program an SM, where launched late they spread over 129,
#: at most 3; the SM that finished last held 6. Tiles that allow fewer programs an SM, so the
#: early ones spread: 8 or 16 warps (at most 8 or 4 an SM by the 64 warps an SM holds), or 6
#: stages (5 buffers of 12 KB: at most 3 an SM by shared memory); each alone as a control.
_SPREAD20_W2 = {"w8": [32, 128, 8, 3, 8, True], "w16": [32, 128, 16, 3, 8, True],
                "s6": [32, 128, 4, 6, 8, True]}
SPREAD20_VARIANTS: dict[str, dict[str, Any]] = {
    "w13e": _chain15(w13=1),
    **{f"w13e_w2_{n}": {**_chain15(w13=1), "tiles": {"w2": c}} for n, c in _SPREAD20_W2.items()},
    **{f"w2_{n}": {"tiles": {"w2": c}} for n, c in _SPREAD20_W2.items()},
}
T1_SETS["spread20"] = {}
#: ``--set merge20`` (session 20): runs 186-187's traces put the verify merge's 216 programs
#: (one warp each, launched as the attention starts) on 25-38 SMs, 12 an SM, beside the
#: attention's one program an SM, and its loop at 2.30 us against the one-token merge's 0.77
#: (96 programs, 3 an SM). The attention letting it launch after its wait or after its loop,
#: so that its programs arrive as the attention's leave.
MERGE20_VARIANTS: dict[str, dict[str, Any]] = {
    "attn_aw": _chain15(attn=1 + K.PDL_AFTER_WAIT), "attn_late": _chain15(attn=1 + K.PDL_LATE),
}
T1_SETS["merge20"] = {}
#: ``--set cache20`` (session 20): run 189 asked every kernel for the largest shared-memory
#: split (L1 down to ~28 KB): one-token steps +4 to +6 % slower, verify steps even. The
#: row-layout products read x again for every row and count on L1 for it, while the weights
#: stream through L1 too (``evict_first`` is an L1 policy with an L2 hint). The weights
#: loaded past L1 (".cg"), or with no hint. (Run 190 also asked for ".cs", streaming: Triton
#: 3.6 would not compile it, and it is gone.)
CACHE20_VARIANTS: dict[str, dict[str, Any]] = {
    "cg": {"weight_evict": ".cg"}, "nohint": {"weight_evict": ""},
}
T1_SETS["cache20"] = {f"t1_{k}": v for k, v in CACHE20_VARIANTS.items()}
#: ``--set spread20b`` (session 20): runs 186-191's traces found kernels filling the SMs they
#: find to their limit rather than spreading: the 0.5B's one-token qkv (576 programs) on 70
#: SMs, 12 an SM; its gate/up (1216, launched late) on 98, 16 an SM; its o-projection (448) 5
#: an SM; the 1.5B's o-projection (768) 7-8 where 5.8 is the mean. Shared memory a program
#: (``kernels.floor_shared``) bounds how many an SM takes: these caps are the fewest that
#: still hold every program at once (``kernels.shared_floor_for``). And the verify down
#: projection launched at gate/up's start (``w13e``, 6 an SM on 104 SMs) capped at 3.
_CAP = K.shared_floor_for
_T1_CAPS = {"896": {"qkv": _CAP(5), "w13": _CAP(10), "wo": _CAP(4)},
            "1536": {"qkv": _CAP(8), "wo": _CAP(6)}}
T1_SETS["spread20b"] = {
    **{f"t1_{kind}": {"by_width": {w: {"smem_floor": {kind: caps[kind]}}
                                   for w, caps in _T1_CAPS.items() if kind in caps}}
       for kind in ("qkv", "w13", "wo")},
    "t1_all": {"by_width": {w: {"smem_floor": caps} for w, caps in _T1_CAPS.items()}},
}
_W13E_CAP = _chain15(w13=1)
_W13E_CAP["by_width"]["1536"]["smem_floor"] = {"v_w2": _CAP(3)}
SPREAD20B_VARIANTS: dict[str, dict[str, Any]] = {
    "w13e": _chain15(w13=1), "w13e_w2cap3": _W13E_CAP,
    "w2cap3": {"by_width": {"1536": {"smem_floor": {"v_w2": _CAP(3)}}}},
}
#: ``--set flat21`` and ``flat21b`` (session 21, runs 198-200): gate/up's loop with a float32
#: sum per weight element (``LinearConfig.flat``), in tiles, early and late; lost 1-15 %, so
#: removed with the sets (commit d16a86f holds them).
#: ``--set early21`` (session 21, run 201): the one-token qkv also loading its norm weight,
#: bias and RoPE row before its wait (``Runner.qkv_early``): +0.4 to +0.8 %, removed with its
#: set (commit 1f7beae holds them).
#: ``--set bcast21`` (session 21): every program of the one-token qkv reads the whole residual
#: (6 KB for the 1.5B) after its wait, 1024 programs at once, as the o-projection's 768 read the
#: attention's output: if those reads of the same few lines from L2 are what qkv's 2.6 us loop
#: waits for (run 194; its own weights are loaded before the wait), more rows a program, so
#: fewer programs reading them, shortens it. (Session 10 run 103 had 2 pairs a program +1 % for
#: the 1.5B and +6 % for the 0.5B, under the launch points before session 12.) Run 202: +1.0
#: to +3.2 %, and qkv's loop longer: not supported (each program also reduces 2-4x the rows).
BCAST21_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_qkv_p2": _both("qkv", [2, 2048], [2, 1024]),
    "t1_qkv_p4": _both("qkv", [4, 2048], [4, 1024]),
    "t1_wo_4rows": _both("wo", [4, 2048, 8, 2], [4, 1024, 4, 2]),
}
T1_SETS["bcast21"] = BCAST21_VARIANTS
#: ``--set lanes22`` (session 22): one-token gate/up in the row layout with its sums kept a
#: lane at a time (``LinearConfig.lanes``): the default loop sums each tile across the warp's
#: lanes (20 shuffles a tile for 8 rows of gate and up) before the next tile's loads issue; with
#: lanes the loop has none (PTX, Triton 3.6 and 3.9), at the same registers (ptxas sm_90a: 8 x
#: 256 46, 16 x 256 on 8 warps 46, 4 x 256 on 2 warps 46; prefetching 48, against 64 without
#: lanes, which is what made prefetch lose in session 12). The 0.5B's gate/up is not in the row
#: layout by default (4 x 1024 on 2 warps, one K tile): its rows tile without lanes is the
#: control. Lists: block_n, block_k, warps, stages, split_k, swap, rows, prefetch, segments,
#: lanes.
_L, _LP = [*_R, 1, True], [*_RP, 1, True]
LANES22_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_w13_rows": _both("w13", [8, 256, 4, 2, 1, *_R], [4, 256, 2, 2, 1, *_R]),
    "t1_w13_lanes": _both("w13", [8, 256, 4, 2, 1, *_L], [4, 256, 2, 2, 1, *_L]),
    "t1_w13_lanes_pf": _both("w13", [8, 256, 4, 2, 1, *_LP], [4, 256, 2, 2, 1, *_LP]),
    "t1_w13_lanes_wide": _both("w13", [16, 256, 8, 2, 1, *_L], [8, 256, 4, 2, 1, *_L]),
}
T1_SETS["lanes22"] = LANES22_VARIANTS
#: ``--set lanes22b`` (session 22, after the 1.5B's gate/up took ``lanes``): the same for the
#: down projection (its rows read as 4 segments of 256, so a warp holds whole segments: no
#: barrier, and with lanes no shuffle in the loop; 34 registers either way, ptxas sm_90a) and
#: for the greedy output projection in the row layout (8 or 16 rows of 256 on 4 warps: 32 and 54
#: registers); the gate/up tile before (an A/A check of the adoption, the 1.5B only).
_SEG4 = [4, True]
LANES22B_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_w13_no_lanes": {"by_width": {"1536": {"t1_tiles": {"w13": [8, 256, 4, 2, 1, *_R]}},
                                     "896": {}}},
    "t1_w2_seg4_pf": _both("w2", [2, 1024, 4, 2, 2, *_RP, 4], [2, 1024, 4, 2, 4, *_RP, 4]),
    "t1_w2_seg4_lanes_pf": _both("w2", [2, 1024, 4, 2, 2, *_RP, *_SEG4],
                                 [2, 1024, 4, 2, 4, *_RP, *_SEG4]),
    "t1_out_lanes8": _both("out", [8, 256, 4, 2, 1, *_L], [8, 256, 4, 2, 1, *_L]),
    "t1_out_lanes16": _both("out", [16, 256, 4, 2, 1, *_L], [16, 256, 4, 2, 1, *_L]),
}
T1_SETS["lanes22b"] = LANES22B_VARIANTS
#: ``--set warps23`` (session 23): the one-token per-pair qkv kernel on other than 4 warps
#: (``Runner.qkv_warps``; never timed before). Its PTX (Triton 3.6 and 3.9, sm_90) has 17 block
#: barriers on 2 or more warps (the norm's squares and each pair's two dot products reduced
#: across warps, and the layout changes of its epilogue) and none on one warp. ptxas sm_90a
#: registers: the 1.5B's 2048-wide tile 255 on 1 warp (64 bytes spilled), 168 on 2, 96 on 4,
#: 64 on 8; its 1024-wide tile on 1 warp 151 (its second half read after the wait); the 0.5B's
#: 1024-wide tile 151 on 1 warp, 92 on 2, 60 on 4, 48 on 8.
WARPS23_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_qkv_w1": {"qkv_warps": {"1": 1}},
    "t1_qkv_w2": {"qkv_warps": {"1": 2}},
    "t1_qkv_w8": {"qkv_warps": {"1": 8}},
    "t1_qkv_w1_k1024": {"by_width": {"1536": {"qkv_warps": {"1": 1},
                                              "t1_tiles": {"qkv": [1, 1024]}}, "896": {}}},
}
T1_SETS["warps23"] = WARPS23_VARIANTS
#: ``--set warps23b`` (after the 0.5B's one-token qkv took one warp, ``tuning.QKV_WARPS``): its
#: qkv on 4 warps again (an A/A check of the adoption: the 1.5B's default is unchanged).
WARPS23B_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_qkv_w4": {"qkv_warps": {"1": 4}},
}
T1_SETS["warps23b"] = WARPS23B_VARIANTS
#: ``--set warps23c``: the same lever for the 0.5B's other one-token products (ptxas sm_90a,
#: Triton 3.6: its o-projection 2 x 1024 on one warp 164 registers and no block barrier, against
#: 48 and 5 barriers on 4 warps; its down projection 2 x 1024 in 4 splits on one warp 168 and
#: none; its gate/up 4 x 1024 on one warp 183), and the 1.5B's o-projection (2 x 2048 on 8
#: warps by default) on 4 (72 registers) or 2 (168).
WARPS23C_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_wo_fewer": _both("wo", [2, 2048, 4, 2], [2, 1024, 1, 2]),
    "t1_wo_fewer2": _both("wo", [2, 2048, 2, 2], [2, 1024, 2, 2]),
    "t1_w2_w1": {"by_width": {"896": {"t1_tiles": {"w2": [2, 1024, 1, 2, 4]}}, "1536": {}}},
    "t1_w13_w1": {"by_width": {"896": {"t1_tiles": {"w13": [4, 1024, 1, 2]}}, "1536": {}}},
}
T1_SETS["warps23c"] = WARPS23C_VARIANTS
#: ``--set warps23d`` (after the 1.5B's one-token o-projection took 4 warps): 8 again (A/A).
WARPS23D_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_wo_w8": {"by_width": {"1536": {"t1_tiles": {"wo": [2, 2048, 8, 2]}}, "896": {}}},
}
T1_SETS["warps23d"] = WARPS23D_VARIANTS
#: ``--set warps23e``: the feed-forward's one-token products on other warp counts: the 1.5B's
#: down projection (2 x 1024 in the row layout, prefetching, 2 splits; 4 warps) on 2 or 8, its
#: gate/up (8 x 256, rows with lanes; 4 warps) on 8; the 0.5B's down projection (2 x 1024 in 4
#: splits; 4 warps) on 2, its gate/up (4 x 1024; 2 warps) on 4.
WARPS23E_VARIANTS: dict[str, dict[str, Any]] = {
    "t1_w2_fewer": _both("w2", [2, 1024, 2, 2, 2, *_RP], [2, 1024, 2, 2, 4]),
    "t1_w2_more": {"by_width": {"1536": {"t1_tiles": {"w2": [2, 1024, 8, 2, 2, *_RP]}},
                                "896": {}}},
    "t1_w13_more": _both("w13", [8, 256, 8, 2, 1, *_L], [4, 1024, 4, 2]),
}
T1_SETS["warps23e"] = WARPS23E_VARIANTS
#: (Session 25's ``--set packed25``, run 221: verify steps' qkv as one launch of the per-pair
#: kernel, its T > 1 product packing the pairs' two halves into one MMA tile with the weights
#: as M, 8 pairs a program (128 programs for the 1.5B, 72 for the 0.5B), against the split-K
#: product and its RoPE kernel: every tile lost, k = 8 at 512 / 4096 +11.6 / +11.1 % at best
#: (1.5B, 8 pairs x 256), +21.6 / +22.9 % (0.5B, with its first tile before the wait). Removed;
#: commit 57d844f holds the kernel and the set.)
#: ``--set scratch25`` (session 25, runs 222-224): every step's scratch its own again
#: (``shared_scratch`` off, as before session 25), a check of the shared scratch's speed;
#: ``t1_shared`` is the default again, timed in a variant's place (an A/A check of the round's
#: order). (Since run 225 the one-token step keeps its own buffers by default, so the one-token
#: variants here time the default against itself; ``scratch25b`` is the one-token check.)
T1_SETS["scratch25"] = {"t1_own_scratch": {"shared_scratch": False}, "t1_shared": {}}
#: ``--set scratch25b``: the one-token step on views of the shared buffers too (before its own
#: were kept, ``own_scratch_t``), against the default and an A/A of it.
T1_SETS["scratch25b"] = {"t1_arena": {"own_scratch_t": []}, "t1_own_again": {}}
#: (Session 39's ``--set persist39``, ``regs39`` and ``persist39b``, runs 335-337: one-token
#: products whose programs each walk several row blocks (``LinearConfig.persist``, a kernel
#: of its own), and ptxas' register cap (``LinearConfig.maxnreg``). Every persistent tile lost:
#: the 1.5B's gate/up 2 / 3 / 4 blocks a program +12 / +27 / +45 %, capped to 64 registers (8
#: programs an SM) +3.1 / +3.3 % @512 / @4096, with the hand-off's statistics summed once
#: before the blocks +10 %; its down projection 2 / 4 +9 / +22 %. The 0.5B's gate/up in the
#: row layout +9.3 / +8.7 %, 2 / 4 blocks a program +9.7 / +25 %. Today's gate/up capped at 40
#: registers (46; 4 spills) +0.4 %, at 32 (10 spills) +15 %; the 0.5B's (72) at 40 / 32 +53 /
#: +82 %. Removed; commit 4b72c6f holds the kernel and the sets.)
#: (Session 39's ``--set epi39`` and ``regs39b``, runs 338-339, both lost; commit a2233e1 holds
#: the kernels' flags and the sets. ``epi39``: one-token kernels asking for their epilogue's
#: operands right after their PDL wait (``Runner.epi_early``): qkv's bias, position and RoPE
#: row (56 -> 64 registers, 1.5B) +1.8 / +1.8 % @512 / @4096 (0.5B +1.2 / +1.4 %), the
#: o-projection's old residual rows and norm weight +1.7 / +1.5 % (+1.2 / +1.0 %), gate/up's
#: handed statistics (46 -> 50) +0.7 / +0.8 %, all three +4.0 / +4.0 % (+2.4 / +2.4 %); the
#: A/A +0.03 / +0.06 %. ``regs39b``: ptxas' register cap on the 0.5B's gate/up (72
#: registers) at 64 (6 spills) +1.0 / +0.7 %, at 56 (16 spills) +4.9 / +6.0 %; on its down
#: projection at 32 (31, no spill) +2.9 / +3.4 % (at 40, its own count, +0.0 / +0.1 %).)
#: ``--set spread40`` (session 40): the verify merge's 216 programs (one warp each, let in at
#: the attention's start) sit 12 an SM on 38 SMs (runs 186 and 340) and loop 2.63 us against
#: the one-token merge's 1.18. Launched late they spread (run 188: 2 an SM, loop 1.28 us) but
#: the o-projection, let in at the merge's wait, then piled 9 an SM. Here the merge keeps its
#: early launch and a shared-memory floor spreads it (``smem_floor`` "combine", new), alone, or
#: with the o-projection floored too; and run 188's late merge with the o-projection floored,
#: the combination session 20 did not time. One-token steps: the merge (the 1.5B's 96
#: programs, the 0.5B's 56 on 28 SMs in run 191) floored the same way.
_MC = {n: {"smem_floor": {"v_combine": _CAP(n)}} for n in (2, 3, 4)}
SPREAD40_VARIANTS: dict[str, dict[str, Any]] = {
    **{f"merge_cap{n}": v for n, v in _MC.items()},
    "wo_cap2": {"smem_floor": {"v_wo": _CAP(2)}},
    "merge_cap2_wo_cap2": {"smem_floor": {"v_combine": _CAP(2), "v_wo": _CAP(2)}},
    "merge_cap3_wo_cap3": {"smem_floor": {"v_combine": _CAP(3), "v_wo": _CAP(3)}},
    "attn_late_wo_cap2": {**_chain15(attn=1 + K.PDL_LATE), "smem_floor": {"v_wo": _CAP(2)}},
}
T1_SETS["spread40"] = {f"t1_merge_cap{n}": {"smem_floor": {"combine": _CAP(n)}}
                       for n in (1, 2, 3)}
#: ``--set spread40b`` (session 40): run 342 found the 1.5B's verify steps faster with the merge
#: and the o-projection each floored to 2 an SM (-1.6 / -2.4 % @512 / @4096; the merge alone
#: -0.3 / -0.7 %: the o-projection, let in at the merge's wait, then piled 7 an SM on 68 SMs,
#: its loop 2.78 -> 5.02 us), the 0.5B's even at 3 and 3 and slower otherwise. Caps around
#: that (merge cap, o-projection cap).
SPREAD40B_VARIANTS: dict[str, dict[str, Any]] = {
    f"m{m}w{w}": {"smem_floor": {"v_combine": _CAP(m), "v_wo": _CAP(w)}}
    for m, w in ((2, 2), (2, 3), (3, 2), (2, 4), (4, 2), (1, 2), (2, 1), (3, 3), (4, 4))
}
T1_SETS["spread40b"] = {}
#: ``--set spread40c`` (session 40): on top of the 1.5B's new floors (``tuning.VERIFY_SMEM_CAPS``:
#: merge and o-projection 2 an SM), the two verify kernels before the attention floored too:
#: the split-K qkv product (run 342's trace: the 1.5B's 512 programs up to 6 an SM, loop 4.45
#: us, 3.52 when they happened to sit 4 an SM) and the RoPE kernel (144 programs 4 an SM on
#: 81 SMs). The 0.5B's qkv has 288 programs, its RoPE kernel 162.
def _floors40(**caps: tuple[int, int]) -> dict[str, Any]:
    """Floors by model: ``caps`` {kernel: (1.5B's cap, 0.5B's cap)} with the 1.5B's defaults."""
    return {"by_width": {
        "1536": {"smem_floor": {"v_combine": _CAP(2), "v_wo": _CAP(2),
                                **{f"v_{k}": _CAP(c[0]) for k, c in caps.items()}}},
        "896": {"smem_floor": {f"v_{k}": _CAP(c[1]) for k, c in caps.items()}}}}


SPREAD40C_VARIANTS: dict[str, dict[str, Any]] = {
    "same": _floors40(), "q4": _floors40(qkv=(4, 3)), "q5": _floors40(qkv=(5, 4)),
    "r2": _floors40(rope=(2, 2)), "q4r2": _floors40(qkv=(4, 3), rope=(2, 2)),
}
T1_SETS["spread40c"] = {}
#: ``--set spread40d`` (session 40): run 348's trace of the new default (1.5B @4096, k = 8) has
#: gate/up's 140 programs (72 KB each) 2 an SM on 91 SMs, loop 16.24 us (15.49 on 111 SMs
#: before the o-projection was floored): gate/up floored to 1 or 2 an SM on top.
SPREAD40D_VARIANTS: dict[str, dict[str, Any]] = {
    f"w13c{n}": {"by_width": {"1536": {"smem_floor": {"v_combine": _CAP(2), "v_wo": _CAP(2),
                                                      "v_w13": _CAP(n)}}}}
    for n in (1, 2)
}
T1_SETS["spread40d"] = {}
#: ``--set``: the verify variants of each named set ("each" is built from session 5's PDL).
VERIFY_SETS: dict[str, dict[str, dict[str, Any]]] = {
    "each": each_variants(SESSION5_VERIFY_PDL), "final": FINAL_VARIANTS,
    "tiles": TILES_VARIANTS, "attn": ATTN_VARIANTS, "ffn": FFN_VARIANTS, "t1": {},
    "one_tile": ONE_TILE_VARIANTS, "handoff": HANDOFF_VARIANTS, "fuse": FUSE_VARIANTS,
    "serial": SERIAL_VARIANTS, "atomics": ATOMICS_VARIANTS, "boundary": {},
    "splits": {}, "stages": {}, "waves": {}, "waves2": {}, "prefetch": {},
    "prefetch2": {}, "rows": {}, "rows2": {}, "warps": {}, "final11": {}, "seg": {},
    "prologue12": {}, "prologue12b": {}, "prologue12c": {}, "prologue12d": {}, "w13_12": {},
    "w13_12b": {}, "l2side": {}, "l2side2": {}, "l2side3": {}, "l2side4": {}, "final13": {},
    "tiles15": TILES15_VARIANTS, "early15": EARLY15_VARIANTS, "after15": AFTER15_VARIANTS,
    "merge16": MERGE16_VARIANTS, "splits16": {},
    "sweep17": SWEEP17_VARIANTS, "early17": EARLY17_VARIANTS, "wait17": WAIT17_VARIANTS,
    "wait17b": WAIT17B_VARIANTS, "final17": FINAL17_VARIANTS,
    "wait17c": WAIT17C_VARIANTS, "warps17": WARPS17_VARIANTS,
    "pro17": PRO17_VARIANTS, "trace18": TRACE18_VARIANTS, "place19": PLACE19_VARIANTS,
    "place19b": PLACE19B_VARIANTS, "spread20": SPREAD20_VARIANTS,
    "merge20": MERGE20_VARIANTS, "cache20": CACHE20_VARIANTS,
    "spread20b": SPREAD20B_VARIANTS, "bcast21": {}, "lanes22": {},
    "lanes22b": {}, "warps23": {},
    "warps23b": {}, "warps23c": {},
    "warps23d": {}, "warps23e": {},
    "scratch25": {"own_scratch": {"shared_scratch": False}},
    "scratch25b": {"verify_arena_t1": {"own_scratch_t": []}},
    "spread40": SPREAD40_VARIANTS, "spread40b": SPREAD40B_VARIANTS,
    "spread40c": SPREAD40C_VARIANTS, "spread40d": SPREAD40D_VARIANTS,
}
#: The settings a variant may name (anything else is a typo that would time the default).
KNOWN = {"verify_pdl", "one_token_pdl", "tiles", "verify_attention", "t1_tiles", "attention",
         "fuse_attn_out", "qkv_split", "combine_warps", "rope_warps", "pdl_by_t", "trim_merge",
         "norm_handoff", "atomic_sem", "verify_handoff", "attn_warps", "l2_prefetch",
         "combine_cols", "weight_evict", "smem_floor", "qkv_warps", "shared_scratch",
         "own_scratch_t"}


def configure(r: Runner, v: dict[str, Any], base: dict[str, Any]) -> None:
    """Runner settings of variant ``v`` (on top of the defaults saved in ``base``); its
    ``by_width`` entry ({n_embd: settings}) adds settings for one model's shape only, each
    replacing the variant's own setting of that name whole (a "tiles" entry there replaces
    the variant's "tiles")."""
    v = {**{k: x for k, x in v.items() if k != "by_width"},
         **v.get("by_width", {}).get(str(r.args.n_embd), {})}
    unknown = set(v) - KNOWN
    if unknown:
        raise SystemExit(f"bench_verify: unknown variant settings {sorted(unknown)}; "
                         f"known: {sorted(KNOWN)}")
    r.verify_pdl = dict(v.get("verify_pdl", base["verify_pdl"]))
    r.one_token_pdl = dict(v.get("one_token_pdl", base["one_token_pdl"]))
    r.linear_configs = dict(base["tiles"])
    for name, cfg in v.get("tiles", {}).items():  # verify tiles: [bn, bk, warps, stages, split, swap]
        r.linear_configs.update({(name, t): K.LinearConfig(*cfg) for t in range(2, 33)})
    att = v.get("verify_attention", base["verify_attention"])  # null: the one-token tiles
    r.verify_attention = (int(att[0]), int(att[1])) if att else None
    for name, cfg in v.get("t1_tiles", {}).items():  # one-token tiles ("qkv": [bp, bk])
        r.linear_configs[(name, 1)] = tuple(cfg) if name == "qkv" else K.LinearConfig(*cfg)
    r.nsplit, r.attn_block_s = v.get("attention", base["attention"])
    r.fuse_attn_out = bool(v.get("fuse_attn_out", False))
    r.trim_merge = bool(v.get("trim_merge", base["trim_merge"]))
    # {T: n}, or n for every T > 1
    for key in ("combine_warps", "rope_warps", "attn_warps", "combine_cols", "qkv_warps"):
        val = v.get(key, base[key])
        # (qkv_warps as one number: every T, 1 included, where the per-pair kernel runs; the
        # verify steps run the split-K qkv by default)
        first = 1 if key == "qkv_warps" else 2
        setattr(r, key, {t: val for t in range(first, 33)} if isinstance(val, int)
                else {int(t): w for t, w in val.items()})
    qs = v.get("qkv_split")  # tiles; false: the per-pair qkv kernel
    r.qkv_split = (None if qs is False else K.LinearConfig(*qs) if qs else base["qkv_split"])
    r.pdl_by_t = {int(k): m for k, m in v.get("pdl_by_t", base["pdl_by_t"]).items()}
    r.norm_handoff = bool(v.get("norm_handoff", base["norm_handoff"]))
    r.atomic_sem = v.get("atomic_sem", base["atomic_sem"])
    r.verify_handoff = bool(v.get("verify_handoff", base["verify_handoff"]))
    pf = v.get("l2_prefetch", base["l2_prefetch"])  # [MB a layer, programs, after]; null: off
    r.l2_prefetch = (float(pf[0]), int(pf[1]), int(pf[2]) if len(pf) > 2 else 0) if pf else None
    r.weight_evict = v.get("weight_evict", base["weight_evict"])
    # {"qkv": bytes} for one-token steps, {"v_w2": bytes} for verify steps; a variant's floors
    # replace the default's whole (tuning.VERIFY_SMEM_CAPS since session 40: name them again
    # to keep them, as spread40c does)
    r.smem_floor = {(k.removeprefix("v_"), k.startswith("v_")): int(n)
                    for k, n in v.get("smem_floor", base["smem_floor"]).items()}
    r.shared_scratch = bool(v.get("shared_scratch", base["shared_scratch"]))
    r.own_scratch_t = frozenset(int(t) for t in v.get("own_scratch_t", base["own_scratch_t"]))
    r.drop_steps()


#: ``--stacked``: each kind of layer weight in one tensor over the layers, as bench_gpu.py lays
#: them out for its single-launch step (``megakernel.stack_layers``), instead of a tensor a layer.
STACKED = False


def runner_for(a: ModelArgs, n_ctx: int) -> tuple[Runner, dict[str, Any]]:
    w = random_weights(a, torch.bfloat16, "cuda", seed=0)
    if STACKED:
        from openjarvis.engine.torch.megakernel import stack_layers

        stack_layers(w)
    r = Runner(Transformer(a, w, n_pos=n_ctx + 64), n_ctx, kernels="triton", graphs=True)
    return r, {"verify_pdl": dict(r.verify_pdl), "tiles": dict(r.linear_configs),
               "pdl_by_t": {str(k): v for k, v in r.pdl_by_t.items()},
               "one_token_pdl": dict(r.one_token_pdl), "verify_attention": r.verify_attention,
               "attention": (r.nsplit, r.attn_block_s), "qkv_split": r.qkv_split,
               "combine_warps": dict(r.combine_warps), "rope_warps": dict(r.rope_warps),
               "attn_warps": dict(r.attn_warps), "combine_cols": dict(r.combine_cols),
               "qkv_warps": dict(r.qkv_warps),
               "trim_merge": r.trim_merge, "norm_handoff": r.norm_handoff,
               "atomic_sem": r.atomic_sem, "verify_handoff": r.verify_handoff,
               "l2_prefetch": r.l2_prefetch, "weight_evict": r.weight_evict,
               "smem_floor": {("v_" if v else "") + k: n for (k, v), n in r.smem_floor.items()},
               "shared_scratch": r.shared_scratch,
               "own_scratch_t": sorted(r.own_scratch_t)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def correctness(a: ModelArgs, variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """T = 9 logits at position 600 (after a 600-token prompt) of each variant against the
    default's from the same cache, and against a float32 reference of the same weights."""
    n_ctx = 1024
    r, base = runner_for(a, n_ctx)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, a.n_vocab, (600,), generator=gen).tolist()
    toks = torch.randint(0, a.n_vocab, (9,), generator=gen).tolist()
    r.logits(prompt, 0)
    saved = (r.cache.k.clone(), r.cache.v.clone())
    out: dict[str, Any] = {}
    ref32 = None
    try:
        w32 = cast(r.model.weights, torch.float32)
        f = Runner(Transformer(a, w32, n_pos=n_ctx + 64), n_ctx, kernels="torch", graphs=False)
        f.logits(prompt + toks, 0)  # warm
        ref32 = f.logits(prompt + toks, 0)[600:].clone()
        del f, w32
    except Exception as e:  # noqa: BLE001
        out["ref32_error"] = str(e)[-300:]
    base_logits = None
    for name, v in variants.items():
        configure(r, v, base)
        r.cache.k.copy_(saved[0])
        r.cache.v.copy_(saved[1])
        got = r.logits(toks, 600).clone()
        r.cache.k.copy_(saved[0])
        r.cache.v.copy_(saved[1])
        again = r.logits(toks, 600).clone()  # replayed from the captured graph
        row: dict[str, Any] = {"finite": bool(torch.isfinite(got).all()),
                               "replay_rel": rel(again, got)}
        if base_logits is None:
            base_logits = got
        row["rel_vs_default"] = rel(got, base_logits)
        row["top1_vs_default"] = float((got.argmax(-1) == base_logits.argmax(-1)).float().mean())
        if ref32 is not None:
            row["rel_vs_f32"] = rel(got, ref32)
            row["top1_vs_f32"] = float((got.argmax(-1) == ref32.argmax(-1)).float().mean())
        out[name] = row
        log("correct", name, {k: round(x, 5) if isinstance(x, float) else x
                              for k, x in row.items()})
    base_t1 = None
    for name, v in {"t1_default": {}, **T1_VARIANTS}.items():  # one-token steps, toks[0] @600
        configure(r, v, base)
        r.cache.k.copy_(saved[0])
        r.cache.v.copy_(saved[1])
        got = r.logits(toks[:1], 600).clone()
        again = r.logits(toks[:1], 600).clone()
        base_t1 = got if base_t1 is None else base_t1
        row = {"finite": bool(torch.isfinite(got).all()), "replay_rel": rel(again, got),
               "rel_vs_default": rel(got, base_t1)}
        if ref32 is not None:
            row["rel_vs_f32"] = rel(got, ref32[:1])
            row["top1_vs_f32"] = float((got.argmax(-1) == ref32[:1].argmax(-1)).float().mean())
        out[name] = row
        log("correct", name, row)
    return out


def timing(a: ModelArgs, positions: list[int], variants: dict[str, dict[str, Any]],
           rounds: int, extra_t: bool) -> dict[str, Any]:
    r, base = runner_for(a, max(positions) + 64)
    toks = list(range(100, 117))
    out: dict[str, Any] = {}
    for pos in positions:
        best: dict[str, float] = {}
        ratios: dict[str, list[float]] = {}
        for rnd in range(rounds):
            configure(r, {}, base)
            r.step(toks[:1], pos)
            t1 = time_ms(lambda: r.replay(1))
            best["t1"] = min(best.get("t1", 1e9), t1)
            for name, v in {**variants, **T1_VARIANTS}.items():
                configure(r, v, base)
                t = 1 if name in T1_VARIANTS else 9
                try:
                    r.step(toks[:t], pos)
                    ms = time_ms(functools.partial(r.replay, t))
                except Exception as e:  # noqa: BLE001
                    log("variant", name, "failed:", str(e).splitlines()[0][:200])
                    continue
                best[name] = min(best.get(name, 1e9), ms)
                ratios.setdefault(name, []).append(ms / t1)
            log(f"round {rnd} @{pos}", {k: round(x, 4) for k, x in best.items()})
        row: dict[str, Any] = {"ms": best,
                               "ratio_to_t1": {k: best[k] / best["t1"] for k in ratios},
                               "ratio_to_t1_rounds": {k: statistics.median(x)
                                                      for k, x in ratios.items()}}
        if "bandwidth" in RES:
            floor = step_floor_ms(r.model.weights.nbytes(), a, pos, RES["bandwidth"])
            row["floor_ms"] = floor
            row["pct_floor"] = {k: 100 * floor / best[k] for k in ("t1", *T1_VARIANTS)
                                if k in best}
        if extra_t:
            pick = min((k for k in variants if k in best), key=lambda k: best[k])
            row["best"] = pick
            for name in ("default", pick):
                configure(r, variants[name], base)
                for t in (5, 17):
                    r.step(toks[:t], pos)
                    row["ms"][f"{name}_T{t}"] = time_ms(functools.partial(r.replay, t))
        out[str(pos)] = row
        log("timing", pos, row)
    return out


class _Skip:
    """A Triton kernel stand-in that launches nothing (``kernel[grid](...)``)."""

    def __getitem__(self, grid: object) -> Any:
        return _nothing


def _nothing(*a: object, **k: object) -> None:
    return None


@contextmanager
def left_out(r: Runner, kind: str) -> Iterator[None]:
    """The step with one kind of launch left out: Triton kernels replaced by ``_Skip``, linear
    launches filtered by which weight they read."""
    w = r.model.weights
    by_weight = {"qkv_prod": [lw.wqkv for lw in w.layers], "wo": [lw.wo for lw in w.layers],
                 "w13": [lw.w13 for lw in w.layers], "w2": [lw.w2 for lw in w.layers],
                 "out": [w.out]}
    kernels = {"rope_kv": "_rope_kv_kernel", "attn_split": "_attn_split_kernel",
               "combine": "_attn_combine_kernel", "embed": "_embed_kernel",
               "qkv_rope": "_qkv_rope_kernel"}
    saved: list[tuple[str, Any]] = []
    try:
        if kind in kernels:
            saved.append((kernels[kind], getattr(K, kernels[kind])))
            setattr(K, kernels[kind], _Skip())
        else:
            ids = {id(t) for t in by_weight[kind]}
            orig = K.linear

            def linear(x: torch.Tensor, wt: torch.Tensor, out: torch.Tensor,
                       **kw: Any) -> torch.Tensor:
                return out if id(wt) in ids else orig(x, wt, out, **kw)

            saved.append(("linear", orig))
            K.linear = linear  # type: ignore[assignment]
        yield
    finally:
        for name, obj in saved:
            setattr(K, name, obj)


def breakdown(a: ModelArgs, pos: int, variant: dict[str, Any], t: int) -> dict[str, Any]:
    r, base = runner_for(a, pos + 64)
    configure(r, variant, base)
    toks = list(range(100, 100 + t))
    r.step(toks, pos)
    whole = time_ms(lambda: r.replay(t))
    kinds = ["embed", "qkv_prod", "rope_kv", "attn_split", "combine", "wo", "w13", "w2", "out"]
    if t == 1:
        kinds[1:3] = ["qkv_rope"]
    out: dict[str, Any] = {"t": t, "whole_ms": whole, "without": {}, "cost_us_per_layer": {}}
    for kind in kinds:
        r.drop_steps()
        with left_out(r, kind):
            r.step(toks, pos)
            ms = time_ms(lambda: r.replay(t))
        r.drop_steps()
        out["without"][kind] = ms
        per = 1 if kind in ("embed", "out") else a.n_layer
        out["cost_us_per_layer"][kind] = round(1e3 * (whole - ms) / per, 2)
    r.step(toks, pos)
    out["whole_ms_after"] = time_ms(lambda: r.replay(t))
    log("breakdown", pos, out)
    return out


def norm_cost(a: ModelArgs) -> dict[str, Any]:
    """What the RMSNorm inside a product's K loop costs it: each normed product (qkv, gate/up,
    output) of all layers captured alone in a graph, with its tiles at T = 1 and 9, (a) as in
    the step (float32 h, squares summed and norm weight applied per K tile), (b) without the
    norm on the same float32 input, (c) on a bfloat16 input without the norm (what a producer
    writing x * g in bfloat16 would hand it). Microseconds per layer (output: per step)."""
    from bench_gpu import graph_us

    r, _ = runner_for(a, 1024)
    w = r.model.weights
    split = r.qkv_split if isinstance(r.qkv_split, K.LinearConfig) else None
    alt = K.LinearConfig(64, 128, 4, 3, swap=True)  # gate/up in half the K loop's iterations

    def job(name: str, t: int, x: torch.Tensor, nrm: bool, buf: torch.Tensor) -> None:
        if name == "out":
            K.linear(x, w.out, buf, norm=w.out_norm if nrm else None, cfg=r.tiles("out", t))
            return
        for lw in w.layers:
            if name == "qkv_prod":
                K.linear(x, lw.wqkv, buf, mode=K.ADD, norm=lw.attn_norm if nrm else None,
                         cfg=split, norm_scale=False)
            else:
                K.linear(x, lw.w13, buf, mode=K.SWIGLU, norm=lw.ffn_norm if nrm else None,
                         cfg=alt if name == "w13_64x128" else r.tiles("w13", t))

    out: dict[str, Any] = {}
    for t in (1, 9):
        h = torch.randn(t, a.n_embd, device=r.device)
        bufs = {"w13": torch.empty(t, a.n_ff, device=r.device, dtype=torch.bfloat16),
                "out": torch.empty(t, a.n_vocab, device=r.device)}
        if t > 1:
            bufs["w13_64x128"] = bufs["w13"]
            if split is not None:
                bufs["qkv_prod"] = torch.zeros(t, a.qkv_dim, device=r.device)
        for name, buf in bufs.items():
            row: dict[str, Any] = {}
            for case, x, nrm in (("norm", h, True), ("no_norm", h, False),
                                 ("bf16_no_norm", h.to(torch.bfloat16), False)):
                try:
                    us = graph_us(functools.partial(job, name, t, x, nrm, buf),
                                  1 if name == "out" else a.n_layer)
                    row[case] = round(us, 2)
                except Exception as e:  # noqa: BLE001
                    row[case] = str(e).splitlines()[0][:120]
            out[f"{name}_T{t}"] = row
            log("norm cost", name, t, row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="1.5B,0.5B")
    ap.add_argument("--positions", default="512,4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="", help="JSON {name: settings} replacing VARIANTS")
    ap.add_argument("--t1-variants", default="", help="JSON replacing T1_VARIANTS")
    ap.add_argument("--set", choices=sorted(T1_SETS), default="",
                    help="a named set of variants (replaces VARIANTS and T1_VARIANTS)")
    ap.add_argument("--breakdown", default="default",
                    help="comma-separated variants whose T = 9 step is broken down @4096")
    ap.add_argument("--breakdown-t", default="9", help="token counts of the breakdowns")
    ap.add_argument("--no-correct", action="store_true")
    ap.add_argument("--norm-cost", action="store_true",
                    help="only: what the in-loop RMSNorm costs the normed products")
    ap.add_argument("--stacked", action="store_true",
                    help="layer weights stacked over the layers, as bench_gpu.py has them")
    ap.add_argument("--regs", action="store_true",
                    help="after the runs: each compiled kernel's registers, spills and shared "
                         "memory (regs.json)")
    ap.add_argument("--bandwidth", action="store_true",
                    help="measure copy bandwidth first; one-token steps as %% of the floor")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_verify needs a CUDA GPU", file=sys.stderr)
        return 2
    global STACKED
    STACKED = args.stacked
    variants = json.loads(args.variants) if args.variants else VARIANTS
    if args.t1_variants or args.set:
        T1_VARIANTS.clear()
        T1_VARIANTS.update(json.loads(args.t1_variants) if args.t1_variants
                           else T1_SETS[args.set])
    models = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}
    positions = [int(p) for p in args.positions.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.bandwidth:
        RES["bandwidth"] = copy_bandwidth()
        log("copy bandwidth", round(RES["bandwidth"] / 1e9, 1), "GB/s")
    if args.norm_cost:
        for name in args.models.split(","):
            RES.setdefault(name, {})["norm_cost"] = norm_cost(models[name])
            (args.out / "verify.json").write_text(json.dumps(RES, indent=1, default=str))
        return 0
    for name in args.models.split(","):
        a = models[name]
        vs = {"default": {}, **(VERIFY_SETS[args.set] if args.set else variants)}
        res: dict[str, Any] = RES.setdefault(name, {})
        for part, fn in (
            ("correct", lambda a=a, vs=vs: None if args.no_correct else correctness(a, vs)),
            ("timing", lambda a=a, vs=vs: timing(a, positions, vs, args.rounds, True)),
            ("breakdown", lambda a=a, vs=vs: {
                f"{v}_T{t}": breakdown(a, 4096, {**vs.get(v, {}), **T1_VARIANTS.get(v, {})}, t)
                for v in args.breakdown.split(",") if v in vs or v in T1_VARIANTS
                for t in (int(x) for x in args.breakdown_t.split(","))}),
        ):
            try:
                res[part] = fn()
            except Exception:  # noqa: BLE001
                res[part + "_error"] = traceback.format_exc()[-1500:]
                log(part, "failed", res[part + "_error"])
            (args.out / "verify.json").write_text(json.dumps(RES, indent=1, default=str))
            torch.cuda.empty_cache()
    if args.regs:
        (args.out / "regs.json").write_text(json.dumps(compiled_kernels(), indent=1))
    return 0


def compiled_kernels() -> list[dict[str, Any]]:
    """Every compiled specialization of the kernels module's Triton kernels: warps, shared
    memory, registers and spills, with its cache key (which names its constants), so a tile's
    register count can be read against how many of its programs an SM holds."""
    import triton

    out: list[dict[str, Any]] = []
    for attr in sorted(dir(K)):
        fn = getattr(K, attr)
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            continue
        for cache in fn.device_caches.values():
            for key, k in cache[0].items():
                k._init_handles()
                out.append({"kernel": attr, "warps": k.metadata.num_warps,
                            "shared": k.metadata.shared, "regs": k.n_regs,
                            "spills": k.n_spills, "key": str(key)[:1500]})
    return out


if __name__ == "__main__":
    raise SystemExit(main())
