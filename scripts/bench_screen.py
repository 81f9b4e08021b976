"""The screened greedy output projection (``kernels.OutScreen``) against the plain one, on a GPU.

A greedy step needs only the largest logit. The plain greedy step reads the whole bfloat16
output matrix (the 1.5B's 467 MB, 15 % of its step's bytes; the 0.5B's 272 MB, 28 %); the
screened one reads it as int8 with a bound a row and then only the rows whose bound reaches
the top, exactly. This script times, in one process, each step kind over alternating rounds
(random bf16 weights of the real shapes, CUDA graphs replayed back to back, ``bench_gpu``'s
timer), at every position asked:

- ``logits``: the one-token step that writes every logit (bench_gpu.py's "ours");
- ``greedy``: the one-token greedy step with ``screen_out`` off (the ``ARGMAX`` linear);
- ``screened``: the same with it on (on by default for the 1.5B), and each ``--tiles`` tile;
- the same three kinds at T = 9 (a k = 8 verify step).

A figure is the best over rounds; each ratio (screened / greedy) is the median over rounds of
the ratio within a round. Then correctness at position 600: each screened greedy token against
the float64 argmax of the step's own final residual, the plain greedy step's tokens, and how
many rows each step rescored (random weights: the real pair's counts are in gpu-notes,
session 32, measured on the CPU). Writes ``screen.json`` under ``--out``.

    python3 scripts/bench_screen.py --out $OUT/s --models 1.5B,0.5B --positions 512,4096

``--parts`` times each pass alone instead (``parts``); ``--copies N`` times the one-token
greedy step's ``--variants`` each in N captures (``copies_timing``), optionally with the
pick's kernels asking for an L1 split (``--carveout``).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (  # noqa: E402
    TOKENIZER_COLS,
    copy_bandwidth,
    graph_us,
    log,
    step_floor_ms,
    time_ms,
)

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer, rms_norm  # noqa: E402
from openjarvis.engine.torch.tuning import L2_PREFETCH  # noqa: E402
from openjarvis.engine.torch.weights import random_weights  # noqa: E402

MODELS = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}


def parse_tile(s: str) -> tuple[int, K.LinearConfig]:
    """"T:block_n,block_k,warps[,stages]" -> (T, tile)."""
    t, rest = s.split(":")
    nums = [int(x) for x in rest.split(",")]
    if len(nums) not in (3, 4):
        raise argparse.ArgumentTypeError(f"a tile is T:block_n,block_k,warps[,stages]; got {s}")
    return int(t), K.LinearConfig(nums[0], nums[1], nums[2], nums[3] if len(nums) > 3 else 2)


def tile_name(cfg: K.LinearConfig) -> str:
    """A screen tile as the figures name it: 128x128w4s2."""
    return f"{cfg.block_n}x{cfg.block_k}w{cfg.num_warps}s{cfg.num_stages}"


def runners(a: ModelArgs, n_ctx: int, tiles: list[tuple[int, K.LinearConfig]]
            ) -> dict[str, Runner]:
    """One Runner a variant over one set of weights (each with its own cache and graphs, so
    no variant recaptures between rounds)."""
    model = Transformer(a, random_weights(a, torch.bfloat16, "cuda", seed=0), n_pos=n_ctx + 64)
    out: dict[str, Runner] = {}
    for name in ("plain", "screened", *(f"tile{i}" for i in range(len(tiles)))):
        r = Runner(model, n_ctx, kernels="triton", graphs=True)
        r.greedy_cols = TOKENIZER_COLS
        r.screen_out = name != "plain"
        if name.startswith("tile"):
            t, cfg = tiles[int(name[4:])]
            r.linear_configs[("screen", t)] = cfg
        out[name] = r
    return out


def timing(rs: dict[str, Runner], positions: list[int], rounds: int,
           tiles: list[tuple[int, K.LinearConfig]], bw: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    toks = list(range(100, 109))
    a = rs["plain"].args
    weight_bytes = rs["plain"].model.weights.nbytes()
    for pos in positions:
        kinds: dict[str, tuple[str, int, bool]] = {}  # name -> (runner, T, greedy)
        for t in (1, 9):
            kinds[f"logits_t{t}"] = ("plain", t, False)
            kinds[f"greedy_t{t}"] = ("plain", t, True)
            kinds[f"screened_t{t}"] = ("screened", t, True)
        for i, (t, cfg) in enumerate(tiles):
            kinds[f"screened_t{t}_{tile_name(cfg)}"] = (f"tile{i}", t, True)
        best: dict[str, float] = {}
        per_round: dict[str, list[float]] = {k: [] for k in kinds}
        for rnd in range(rounds):
            for name, (rn, t, greedy) in kinds.items():
                r = rs[rn]
                r.step(toks[:t], pos, greedy=greedy)
                ms = time_ms(lambda r=r, t=t, greedy=greedy: r.replay(t, greedy=greedy),
                             iters=50, reps=3)
                best[name] = min(best.get(name, 1e9), ms)
                per_round[name].append(ms)
            log(f"round {rnd} @{pos}", {k: round(v, 4) for k, v in best.items()})

        def ratio(x: str, y: str, rounds: dict[str, list[float]] = per_round) -> float:
            return statistics.median(p / q for p, q in zip(rounds[x], rounds[y], strict=True))

        floor = step_floor_ms(weight_bytes, a, pos, bw)
        row: dict[str, Any] = {
            "ms": best, "floor_ms": floor,
            "pct_floor": {k: 100 * floor / v for k, v in best.items() if k.endswith("_t1")
                          or "_t1_" in k},
            "screened_over_greedy_t1": ratio("screened_t1", "greedy_t1"),
            "screened_over_greedy_t9": ratio("screened_t9", "greedy_t9"),
            "greedy_over_logits_t1": ratio("greedy_t1", "logits_t1"),
            "verify_ratio": {kind: ratio(f"{kind}_t9", f"{kind}_t1")
                             for kind in ("logits", "greedy", "screened")},
            "screened_t1_saved_us": 1e3 * (best["greedy_t1"] - best["screened_t1"]),
        }
        out[str(pos)] = row
        log("timing", pos, json.dumps(row))
    return out


#: ``--copies``' variants of the one-token greedy step: the output matrix read in bfloat16
#: (``plain``) or through the screen (``screened``), each with any of these changes, joined
#: by ``_`` (``screened_pf12_nopdl``): ``nopdl``, the pick's launches (the projection or the
#: screen's three, and the merge) without PDL; ``outnormal``, the output matrix read without
#: the weights' ``evict_first`` hint (``Runner.out_evict``); ``nopf``, no gate/up prefetch
#: into L2 (``Runner.l2_prefetch``, the 1.5B's default); ``pf<MiB>``, that prefetch at this
#: many MiB a layer (128 programs a half, after the layer before, where there was none);
#: ``pp<programs>`` and ``pa<point>``, the prefetch's programs a half and its point (0 the
#: layer before, 1 qkv, 2 the attention's merge). (Session 35's ``pfef``, the prefetch at
#: ``evict_first`` priority, lost 3-5 µs and was removed; 16f9b6f holds it.)
COPY_BASES = ("plain", "screened")
COPY_CHANGES = ("nopdl", "outnormal", "nopf", "pf<MiB>", "pp<programs>", "pa<point>")


def apply_variant(r: Any, name: str) -> None:
    """Set a Runner ``r`` up as the ``--copies`` variant ``name``; a name that is not one
    raises ValueError (``main`` checks every name on a stand-in before anything runs)."""
    base, *changes = name.split("_")
    if base not in COPY_BASES:
        raise ValueError(name)
    r.screen_out = base == "screened"
    for c in changes:
        if c == "outnormal":
            r.out_evict = ""
        elif c == "nopdl":
            r.one_token_pdl = {**r.one_token_pdl, "out": 0}
        elif c == "nopf":
            r.l2_prefetch = None
        elif c.startswith("pf") and c[2:].replace(".", "", 1).isdigit() and float(c[2:]) > 0:
            pf = r.l2_prefetch or (0.0, 128, 0)
            r.l2_prefetch = (float(c[2:]), pf[1], pf[2])
        elif c[:2] in ("pp", "pa") and c[2:].isdigit() and r.l2_prefetch is not None and (
                int(c[2:]) > 0 if c[:2] == "pp" else int(c[2:]) <= 2):
            mib, progs, after = r.l2_prefetch
            r.l2_prefetch = (mib, int(c[2:]), after) if c[:2] == "pp" else (mib, progs,
                                                                             int(c[2:]))
        else:
            raise ValueError(name)


#: ``--carveout-kernels``: the kernels ``--carveout`` applies to (not the merge, which the
#: plain pick runs too; session 34's run 286 had it in both sets).
CARVEOUT_KERNELS = {
    "screen": ("_screen_prep_kernel", "_screen_kernel", "_rescore_kernel"),
    "rescore": ("_rescore_kernel",),
}


def copies_timing(a: ModelArgs, positions: list[int], rounds: int, copies: int,
                  n_ctx: int, tiles: list[tuple[int, K.LinearConfig]],
                  names: list[str], carveout: tuple[int, str] | None = None) -> dict[str, Any]:
    """``--copies``: the one-token greedy step's variants ``names`` (``apply_variant``) and
    the screen in each one-token tile of ``tiles``, each in ``copies`` Runners over one set of
    weights, every Runner timed once a round in a shuffled order.

    Why: where a kernel's programs land on the SMs differs between captures of the same step
    (session 34 run 283's traces: the 0.5B's plain step @512 with qkv 20 an SM on 53 SMs and
    gate/up 16 on 96, its layers 18 µs slower than the screened Runner's). With one Runner a
    variant, that decides a ratio as much as the variant does; over several Runners a variant,
    the median of their best times compares the variants, and the spread within a variant
    shows how much a capture alone moves a step."""
    model = Transformer(a, random_weights(a, torch.bfloat16, "cuda", seed=0), n_pos=n_ctx + 64)
    variants: dict[str, K.LinearConfig | None] = {name: None for name in names}
    variants.update({f"screened_{tile_name(c)}": c for t, c in tiles if t == 1})
    rs: dict[str, Runner] = {}
    for i in range(copies):
        for name, cfg in variants.items():
            r = Runner(model, n_ctx, kernels="triton", graphs=True)
            r.greedy_cols = TOKENIZER_COLS
            apply_variant(r, name)
            if cfg is not None:
                r.linear_configs[("screen", 1)] = cfg
            r.step([100], 0, greedy=True)  # captured here, in this order
            rs[f"{name}:{i}"] = r
    if carveout is not None:  # on every kernel the captures compiled, then captured anew
        n_set = K.set_carveout(carveout[0], only=CARVEOUT_KERNELS[carveout[1]])
        log("carveout", carveout, "set on", n_set, "compiled kernels")
        for r in rs.values():
            r.drop_steps()
            r.step([100], 0, greedy=True)
    gen = torch.Generator().manual_seed(34)
    out: dict[str, Any] = {}
    for pos in positions:
        per: dict[str, list[float]] = {k: [] for k in rs}
        for _ in range(rounds):
            order = [list(rs)[j] for j in torch.randperm(len(rs), generator=gen).tolist()]
            for key in order:
                r = rs[key]
                r.step([100], pos, greedy=True)
                per[key].append(time_ms(lambda r=r: r.replay(1, greedy=True), iters=50,
                                        reps=3))
        best = {k: min(v) for k, v in per.items()}
        by = {name: [best[f"{name}:{i}"] for i in range(copies)] for name in variants}
        med = {name: statistics.median(v) for name, v in by.items()}
        base = "plain" if "plain" in med else next(iter(med))
        row = {"per_round_ms": per, "best_ms": best, "median_ms": med,
               "range_ms": {name: [min(v), max(v)] for name, v in by.items()},
               "base": base, "over_base": {name: med[name] / med[base] for name in variants}}
        out[str(pos)] = row
        log("copies", pos, json.dumps({k: v for k, v in row.items() if k != "per_round_ms"}))
    if carveout is not None:
        K.set_carveout(K.CARVEOUT_DEFAULT)
    return out


def correctness(rs: dict[str, Runner], n: int = 48) -> dict[str, Any]:
    """Screened tokens against float64 argmax of their own final residual at 600 + i."""
    r, plain = rs["screened"], rs["plain"]
    a, w = r.args, r.model.weights
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, a.n_vocab, (600,), generator=gen).tolist()
    toks = torch.randint(0, a.n_vocab, (n,), generator=gen).tolist()
    out: dict[str, Any] = {}
    for t in (1, 9):
        r.logits(prompt, 0)
        plain.logits(prompt, 0)
        exact = agree = total = 0
        counts: list[int] = []
        gaps: list[float] = []
        for i in range(0, n - t + 1, t):
            ids = r.argmax(toks[i : i + t], 600 + i).clone()
            ws = r._greedy_steps[t]
            assert ws.screen is not None
            ref = (rms_norm(ws.h.double(), w.out_norm.double(), a.rms_eps)
                   @ w.out[: r.greedy_cols].double().T)
            exact += int((ids == ref.argmax(-1)).sum())
            top2 = ref.topk(2, dim=-1).values
            gaps += (top2[:, 0] - top2[:, 1]).tolist()
            counts += (ws.screen.up >= ws.screen.lo.max(dim=1, keepdim=True).values
                       ).sum(1).tolist()
            agree += int((plain.argmax(toks[i : i + t], 600 + i) == ids).sum())
            total += t
        cs = sorted(counts)
        out[f"t{t}"] = {"tokens": total, "exact_argmax": exact, "plain_agrees": agree,
                        "rescored_median": cs[len(cs) // 2], "rescored_max": cs[-1],
                        "top2_gap_min": min(gaps)}
        log("correct", t, out[f"t{t}"])
    return out


#: ``--parts``: the plain greedy projection's tiles (tuning.py's "out" at T = 1, the swapped
#: verify tile at T > 1) and the screen tiles swept beside the default.
ARGMAX_TILES = {(1536, 1): K.LinearConfig(16, 256, 4, 2), (896, 1): K.LinearConfig(32, 128, 4, 2),
                (1536, 9): K.LinearConfig(128, 64, 4, 3, swap=True),
                (896, 9): K.LinearConfig(128, 64, 4, 3, swap=True)}
PART_TILES = {t: [(64, 128, 4, 3), (128, 128, 4, 3), (128, 128, 8, 3), (256, 128, 8, 3),
                  (64, 256, 4, 3), (128, 256, 8, 3), (32, 128, 4, 3)] for t in (1, 9)}
#: The float paths' best tiles of run 270 (``SCREEN_IMMA`` 0), for the record beside them.
FLOAT_TILES = {1: K.LinearConfig(16, 512, 4, 2), 9: K.LinearConfig(128, 64, 8, 3)}


def parts(a: ModelArgs, extra: list[tuple[int, K.LinearConfig]], sweep: bool = True,
          per: int = 10) -> dict[str, Any]:
    """Each pass alone, captured ``per`` times in a CUDA graph (so the matrices, 2-4x the L2,
    come from DRAM every launch): the plain ``ARGMAX`` projection, its merge, the screen (the
    integer path at its default tile and at each of ``PART_TILES``, and the float path at
    ``FLOAT_TILES``), the rescoring alone, and both passes; microseconds a launch. ``extra``:
    more screen tiles (``--tiles``); ``sweep`` False leaves ``PART_TILES`` out."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, k = TOKENIZER_COLS, a.n_embd
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    norm = torch.rand(k, device="cuda", generator=gen) + 0.5
    scr = K.screen_weights(w)
    out: dict[str, Any] = {}
    for t in (1, 9):
        x = torch.randn(t, k, device="cuda", generator=gen) * 4
        out[f"t{t}"] = _parts_t(x, w, norm, scr, per, extra, sweep)
        log("parts", k, t, {key: round(v, 2) for key, v in out[f"t{t}"].items()})
    return out


def _parts_t(x: torch.Tensor, w: torch.Tensor, norm: torch.Tensor, scr: K.OutScreen,
             per: int, extra: list[tuple[int, K.LinearConfig]],
             sweep: bool) -> dict[str, float]:
    t, k = x.shape
    n = w.shape[0]
    row: dict[str, float] = {}
    acfg = ARGMAX_TILES[(k, t)]
    part = K.argmax_partials(t, n, acfg, "cuda")
    ids = torch.zeros(t, dtype=torch.int64, device="cuda")

    def plain() -> None:
        for _ in range(per):
            K.linear(x, w, part, mode=K.ARGMAX, norm=norm, cfg=acfg, evict="evict_first")

    def merge() -> None:
        for _ in range(per):
            K.argmax_merge(part, ids)

    row["argmax"] = graph_us(plain, per)
    row["argmax_merge"] = graph_us(merge, per)
    cfg = K.default_screen_config(t)
    bufs = K.screen_buffers(t, n, k, cfg, "cuda")

    def job(passes: int, c: K.LinearConfig = cfg, b: K.ScreenBuffers = bufs) -> None:
        for _ in range(per):
            K.screen(x, norm, scr, b, w, cfg=c, evict="evict_first", passes=passes)

    row["screen"] = graph_us(functools.partial(job, 1), per)
    saved, K.SCREEN_IMMA = K.SCREEN_IMMA, 0
    try:
        fc = FLOAT_TILES[t]
        row["screen_float"] = graph_us(functools.partial(
            job, 1, fc, K.screen_buffers(t, n, k, fc, "cuda")), per)
    finally:
        K.SCREEN_IMMA = saved
    row["rescore"] = graph_us(functools.partial(job, 2), per)
    other = 1024 if K.RESCORE_LO_BLOCK != 1024 else 2048  # (session 34: 1024 -> 2048)
    saved_lo, K.RESCORE_LO_BLOCK = K.RESCORE_LO_BLOCK, other
    try:  # the lower bounds read 1024 at a time (a loop for 1,185), or all at once
        row[f"rescore_lo{other}"] = graph_us(functools.partial(job, 2), per)
    finally:
        K.RESCORE_LO_BLOCK = saved_lo
    row["both"] = graph_us(functools.partial(job, 3), per)
    row["rescored_rows"] = int((bufs.up >= bufs.lo.max(dim=1, keepdim=True).values).sum())
    cfgs = [K.LinearConfig(*tile) for tile in PART_TILES[t]] if sweep else []
    for c in cfgs + [c for tt, c in extra if tt == t]:
        b = K.screen_buffers(t, n, k, c, "cuda")
        row[f"screen_{tile_name(c)}"] = graph_us(functools.partial(job, 1, c, b), per)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for screen.json")
    ap.add_argument("--models", default="1.5B,0.5B", help="comma-separated: 1.5B, 0.5B")
    ap.add_argument("--positions", default="512,4096", help="comma-separated positions")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--tiles", type=parse_tile, nargs="*", default=[],
                    help="extra screen tiles, each T:block_n,block_k,warps[,stages]")
    ap.add_argument("--no-sweep", action="store_true",
                    help="--parts: time only the default and --tiles, not PART_TILES")
    ap.add_argument("--copies", type=int, default=0,
                    help="instead of the rounds above: the one-token greedy step, plain and "
                         "screened, each in this many Runners (captures), timed in shuffled "
                         "rounds")
    ap.add_argument("--variants", default="plain,screened",
                    help=f"--copies: comma-separated, each {' or '.join(COPY_BASES)} with any "
                         f"of _{', _'.join(COPY_CHANGES)} (e.g. screened_pf12)")
    ap.add_argument("--carveout", type=int, default=None,
                    help="--copies: the pick's kernels (--carveout-kernels) prefer this %% of "
                         "L1 as shared memory (kernels.set_carveout); default: the driver's")
    ap.add_argument("--carveout-kernels", choices=sorted(CARVEOUT_KERNELS), default="screen",
                    help="--carveout: the screen's four launches, or the rescoring and merge")
    ap.add_argument("--parts", action="store_true",
                    help="time each pass alone (and screen tiles) instead of whole steps")
    args = ap.parse_args(argv)
    # (names first, so that a typo is refused here rather than on the device)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad:
        print(f"bench_screen: unknown model {bad[0]!r}; choose from {sorted(MODELS)}",
              file=sys.stderr)
        return 2
    if args.carveout is not None and args.copies <= 0:
        print("bench_screen: --carveout applies to --copies only", file=sys.stderr)
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants:
        print("bench_screen: --variants names none: give at least one, e.g. plain,screened",
              file=sys.stderr)
        return 2
    for name, v in itertools.product(names, variants):
        a = MODELS[name]
        try:
            # (settings only, on a stand-in with this model's default prefetch, as a Runner of
            # it has: the 0.5B has none, so pp / pa need a pf<MiB> before them there)
            apply_variant(SimpleNamespace(one_token_pdl={}, l2_prefetch=L2_PREFETCH.get(
                (a.n_embd, a.n_ff))), v)
        except ValueError:
            print(f"bench_screen: variant {v!r} is unknown or does not apply to {name}; choose "
                  f"from plain, screened, each with any of _{', _'.join(COPY_CHANGES)} (pp / pa "
                  f"need a prefetch: put pf<MiB> before them where the model has none)",
                  file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("bench_screen: needs a CUDA GPU (run it through the device tool)", file=sys.stderr)
        return 2
    positions = [int(p) for p in args.positions.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "bandwidth": copy_bandwidth()}
    log("copy bandwidth", round(res["bandwidth"] / 1e9), "GB/s")
    for name in names:
        a = MODELS[name]
        if args.parts:
            res[name] = {"parts": parts(a, args.tiles, not args.no_sweep)}
            (args.out / "screen.json").write_text(json.dumps(res, indent=1))
            continue
        if args.copies > 0:
            res[name] = {"copies": copies_timing(a, positions, args.rounds, args.copies,
                                                 max(positions) + 64, args.tiles,
                                                 variants,
                                                 None if args.carveout is None else
                                                 (args.carveout, args.carveout_kernels))}
            torch.cuda.empty_cache()
            (args.out / "screen.json").write_text(json.dumps(res, indent=1))
            continue
        rs = runners(a, max(max(positions), 700) + 64, args.tiles)
        res[name] = {"screen_mb": rs["screened"].out_screen().nbytes / 1e6,
                     "correct": correctness(rs),
                     "timing": timing(rs, positions, args.rounds, args.tiles, res["bandwidth"])}
        del rs
        torch.cuda.empty_cache()
        (args.out / "screen.json").write_text(json.dumps(res, indent=1))
    (args.out / "screen.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
