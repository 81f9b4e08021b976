"""The persistent CUDA one-token step (``cuda_step.py``) against the default Triton step.

Run on the lent H200 (``device`` tool): ``python3 scripts/bench_cuda_step.py --out $OUT``.
In one process:

1. build: the kernel compiled with NVRTC and with nvcc (where each is found), build times;
2. correctness (0.5B and 1.5B shapes, random bf16 weights): a prompt through the Triton step,
   then one-token steps through the CUDA step (``CHECKS``: cooperative and plain launches,
   multi-tile attention, 40 blocks), against a float32 reference of the same weights, at
   positions 64-79 and 4094-4098; the Triton one-token step over the same tokens beside it;
   the CUDA step replayed at one position must give bit-identical logits; every logit is
   poisoned first;
3. timing: one-token steps at positions 512 and 4096, CUDA step against the default Triton
   step, in CUDA graphs, in alternating rounds (the machine drifts); each round the median of
   7 x 50 replays, the figure the fastest round; the ratio and the share of the bandwidth
   floor (copy bandwidth measured in the same run). Variants built with the kernel's TIME_*
   macros leave parts out (their results are wrong by design): what each part costs.

Results print as they come and go to ``--out``/cuda_step.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import copy_bandwidth, log, step_floor_ms, time_ms  # noqa: E402  # the same timer and floor

from openjarvis.engine.torch import cuda_step  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer  # noqa: E402
from openjarvis.engine.torch.weights import cast, random_weights  # noqa: E402

RES: dict[str, Any] = {}


def builds() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a, name in ((QWEN25_1_5B, "1.5B"), (QWEN25_0_5B, "0.5B")):
        p = cuda_step.plan(a)
        out[name] = {"plan": p.defines, "smem": p.smem}
        for comp in ("nvrtc", "nvcc"):
            t = time.monotonic()
            try:
                cubin, how = cuda_step.build(p, "sm_90", comp)
                out[name][comp] = {"bytes": len(cubin), "s": time.monotonic() - t, "how": how}
            except Exception as e:  # noqa: BLE001
                out[name][comp] = {"error": str(e)[-600:]}
        log("build", name, out[name])
    return out


#: CUDA-step variants the correctness check runs beside the Triton step (``use_cuda_step``
#: arguments): the default; a plain (not cooperative) launch; 2 splits of 32-position tiles, so
#: an item spans several tiles; 40 blocks, as on a smaller GPU (more attention items than
#: blocks, another partition of every matrix).
CHECKS: dict[str, dict[str, Any]] = {
    "cuda": {},
    "cuda_plain_launch": {"cooperative": False},
    "cuda_multitile": {"extra": {"SPLITS": 2, "ATILE": 32}},
    "cuda_blocks40": {"blocks": 40},
}


def correctness(a: ModelArgs, name: str, n_prompt: int = 64, n_steps: int = 16,
                checks: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A prompt through the Triton step, then one-token steps (Triton, and each CUDA variant:
    ``checks``, default every one in ``CHECKS``) against a float32 reference of the same
    weights; logits poisoned before every step."""
    checks = tuple(CHECKS) if checks is None else checks
    w16 = random_weights(a, torch.bfloat16, "cuda", seed=7)
    w32 = cast(w16, torch.float32)
    n = n_prompt + n_steps
    n_pos = max(256, n + 64)
    seq = torch.randint(0, a.n_vocab, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = Runner(Transformer(a, w32, n_pos=n_pos), n + 32, kernels="torch", graphs=False)
    base = ref.logits(seq, 0)[n_prompt:n].double()
    del ref, w32
    torch.cuda.empty_cache()
    res: dict[str, Any] = {"positions": [n_prompt, n - 1]}
    for kind in ("triton", *checks):
        r = Runner(Transformer(a, w16, n_pos=n_pos), n + 32, kernels="triton")
        if kind != "triton":
            r.use_cuda_step(**CHECKS[kind])
            res["compiler"] = r.cuda_step.compiler if r.cuda_step else None
        r.logits(seq[:n_prompt], 0)
        rows = []
        for i in range(n_prompt, n):
            r._workspace(1).logits.fill_(float("nan"))  # poison: every element must be written
            rows.append(r.logits(seq[i : i + 1], i).clone())
        out = torch.cat(rows)
        res[kind] = {
            "rel_err": float((out.double() - base).norm() / base.norm()),
            "top1": float((out.argmax(-1) == base.argmax(-1)).float().mean()),
            "finite": bool(torch.isfinite(out).all()),
        }
        if kind != "triton":  # replays at one position: bit-identical
            again = [r.logits(seq[n - 1 : n], n - 1).clone() for _ in range(3)]
            res[kind]["replays_identical"] = all(torch.equal(again[0], x) for x in again)
            res[kind]["matches_first_run"] = bool(torch.equal(again[0], rows[-1]))
        log("correctness", name, f"@{n_prompt}-{n - 1}", kind, res[kind])
        del r
        torch.cuda.empty_cache()
    return res


def timing(a: ModelArgs, name: str, bw: float, positions: list[int], rounds: int,
           extra: dict[str, dict[str, Any]]) -> dict[str, Any]:
    n_ctx = max(positions) + 64
    w = random_weights(a, torch.bfloat16, "cuda", seed=0)
    model = Transformer(a, w, n_pos=n_ctx + 64)
    runners: dict[str, Runner] = {"triton_default": Runner(model, n_ctx, kernels="triton")}
    for vname, kw in {"cuda": {}, **extra}.items():
        try:
            r = Runner(model, n_ctx, kernels="triton")
            r.use_cuda_step(**kw)
            runners[vname] = r
        except Exception:  # noqa: BLE001
            log(name, vname, "unavailable:", traceback.format_exc(limit=2))
    res: dict[str, Any] = {"weight_bytes": w.nbytes()}
    for pos in positions:
        floor = step_floor_ms(w.nbytes(), a, pos, bw)
        times: dict[str, list[float]] = {k: [] for k in runners}
        for r in runners.values():
            r.step([100], pos)
        for _ in range(rounds):
            for k, r in runners.items():
                times[k].append(time_ms(functools.partial(r.replay, 1)))
        row: dict[str, Any] = {"floor_ms": floor}
        for k, ts in times.items():
            ms = min(ts)
            row[k] = {"ms": ms, "all": ts, "pct_floor": 100 * floor / ms}
        if "cuda" in row:
            row["cuda_vs_triton"] = row["triton_default"]["ms"] / row["cuda"]["ms"]
        res[f"pos{pos}"] = row
        log("timing", name, pos, {k: (round(v["ms"], 4), round(v["pct_floor"], 1))
                                  for k, v in row.items() if isinstance(v, dict)},
            "speedup", round(row.get("cuda_vs_triton", 0.0), 3))
    return res


#: Trace points (``decode_step.cu``, TRACE): name -> point index, times are relative to the
#: layer's first block start; "max" is the last block to get there (the critical path).
TRACE_MAX = {"qkv_in": 1, "qkv_done": 2, "attn_ready": 3, "item_done": 4, "merge_done": 5,
             "bar1": 6, "wo_in": 7, "wo_done": 8, "bar2": 9, "w13_in": 10, "w13_done": 11,
             "bar3": 12, "w2_in": 13, "w2_done": 14, "bar4": 15}
TRACE_PRODUCER = {"prod_qkv": 16, "prod_wo": 17, "prod_w13": 18, "prod_w2": 19}
#: Inside the block's first attention item: the median block, µs after it saw its head ready.
TRACE_ITEM = {"scores": 20, "softmax": 21, "values": 22, "stored": 23, "counted": 4}
TRACE_WAITS = {"wait_qkv": 24, "wait_wo": 25, "wait_w13": 26, "wait_w2": 27}


def summarize_trace(t: torch.Tensor, nl: int) -> dict[str, Any]:
    """Medians over the middle layers of a TRACE build's stamps ``t`` [nl + 1, points, blocks]
    (see ``trace``)."""
    # stamps relative to the first, in int64 before float64 (epoch ns as float64 lie 256 ns
    # apart; traces before session 20 read steps of 0.256 us for that reason); + 1 keeps a
    # stamped value > 0 (unstamped: 0)
    tf = torch.where(t > 0, (t - int(t[t > 0].min())).double() + 1.0, 0.0)
    mid = range(2, nl - 2)
    base = torch.stack([tf[layer, 0][tf[layer, 0] > 0].min() for layer in range(nl + 1)])
    row: dict[str, Any] = {"layer_us": float((base[3:nl] - base[2:nl - 1]).median() / 1e3),
                           "step_us": float((tf[nl, 2].max() - base[0]) / 1e3),
                           "head_us": float((tf[nl, 2].max() - base[nl]) / 1e3)}

    def med(vals: list[float]) -> float:
        return float(torch.tensor(vals).median())

    for key, k in {**TRACE_MAX, **TRACE_PRODUCER}.items():
        v = [float(tf[layer, k][tf[layer, k] > 0].max() - base[layer]) / 1e3 for layer in mid
             if (tf[layer, k] > 0).any()]
        if v:
            row[key] = round(med(v), 2)
        if key in TRACE_PRODUCER:
            vmin = [float(tf[layer, k][tf[layer, k] > 0].min() - base[layer]) / 1e3 for layer in mid]
            row[key + "_first"] = round(med(vmin), 2)
    for key, k in TRACE_ITEM.items():
        vi = []
        for layer in mid:
            ok = (tf[layer, 3] > 0) & (tf[layer, k] > 0)
            if ok.any():
                vi.append(float(((tf[layer, k] - tf[layer, 3])[ok]).median()) / 1e3)
        if vi:
            row["item_" + key] = round(med(vi), 2)
    for key, k in TRACE_WAITS.items():
        row[key] = round(med([float(tf[layer, k].median()) / 1e3 for layer in mid]), 2)
    return row


def trace(a: ModelArgs, name: str, positions: list[int], out: Path,
          builds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One traced step per position (a TRACE build: %globaltimer at every phase boundary of
    every block): per layer, when the last block reached each point, in µs from the layer's
    start (median over the middle layers); how long consumers waited for weights per phase;
    where the producer was. ``builds``: {variant: use_cuda_step kwargs}. The raw stamps go to
    ``out``/trace_<model>_<variant>_<pos>.pt."""
    n_ctx = max(positions) + 64
    w = random_weights(a, torch.bfloat16, "cuda", seed=0)
    model = Transformer(a, w, n_pos=n_ctx + 64)
    res: dict[str, Any] = {}
    for variant, kwargs in builds.items():
        r = Runner(model, n_ctx, kernels="triton")
        kw = dict(kwargs)
        kw["extra"] = {**kw.get("extra", {}), "TRACE": 1}
        r.use_cuda_step(**kw)
        step = r.cuda_step
        assert step is not None and step.trace is not None
        for pos in positions:
            r.step([100], pos)
            step.trace.zero_()
            r.replay(1)
            torch.cuda.synchronize()
            t = step.trace.cpu()
            torch.save(t, out / f"trace_{name}_{variant}_{pos}.pt")
            row = summarize_trace(t, a.n_layer)
            res[f"{variant}_pos{pos}"] = row
            log("trace", name, variant, pos, row)
        del r
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--positions", default="512,4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of: build,correct,time")
    ap.add_argument("--trace", action="store_true",
                    help="also one traced step per model and position (phase timeline)")
    ap.add_argument("--trace-with", default='{"cuda": {}}', help="the traced builds, JSON "
                    "{variant: use_cuda_step kwargs}")
    ap.add_argument("--variants", default="{}",
                    help='more CUDA-step variants, JSON {name: use_cuda_step kwargs}, e.g. '
                    '{"inflight3": {"extra": {"INFLIGHT": 3}}}: checked and timed beside the rest')
    ap.add_argument("--breakdown", action="store_true",
                    help="also time variants that leave out a part (what each part costs)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    positions = [int(x) for x in args.positions.split(",")]
    variants: dict[str, dict[str, Any]] = json.loads(args.variants)
    CHECKS.update(variants)
    skip = set(args.skip.split(","))
    dev = torch.cuda.get_device_properties(0)
    RES["device"] = {"name": dev.name, "sms": dev.multi_processor_count}
    RES["date"] = time.strftime("%Y-%m-%d")

    def save() -> None:
        (args.out / "cuda_step.json").write_text(json.dumps(RES, indent=1, default=str))

    steps = []
    if "build" not in skip:
        steps.append(("build", builds))
    if "correct" not in skip:
        steps.append(("correct_0.5B", lambda: correctness(QWEN25_0_5B, "0.5B")))
        steps.append(("correct_1.5B", lambda: correctness(QWEN25_1_5B, "1.5B")))
        # across position 4096, where a split's positions outgrow one 128-position tile
        for a_, n_ in ((QWEN25_0_5B, "0.5B"), (QWEN25_1_5B, "1.5B")):
            steps.append((f"correct_{n_}_long", functools.partial(
                correctness, a_, n_, 4094, 5, ("cuda", "cuda_blocks40"))))
    if args.trace:
        for a_, n_ in ((QWEN25_1_5B, "1.5B"), (QWEN25_0_5B, "0.5B")):
            steps.append((f"trace_{n_}", functools.partial(trace, a_, n_, positions, args.out,
                                                           json.loads(args.trace_with))))
    if "time" not in skip:
        def tm() -> dict[str, Any]:
            bw = copy_bandwidth()
            log(f"copy bandwidth {bw / 1e9:.0f} GB/s")
            out: dict[str, Any] = {"copy_GBps": bw / 1e9}
            t_ = {"TIME_NO_SYNC": 1, "TIME_NO_ATTN": 1}
            extra: dict[str, dict[str, Any]] = {
                "no_prep": {"extra": {"TIME_NO_PREP": 1}},
                "no_attn": {"extra": {"TIME_NO_ATTN": 1}},
                "no_sync_no_attn": {"extra": t_},
            } if args.breakdown else {}
            extra.update(variants)
            out["1.5B"] = timing(QWEN25_1_5B, "1.5B", bw, positions, args.rounds, extra)
            torch.cuda.empty_cache()
            out["0.5B"] = timing(QWEN25_0_5B, "0.5B", bw, positions, args.rounds, extra)
            return out
        steps.append(("timing", tm))
    for key, fn in steps:
        try:
            RES[key] = fn()
        except Exception:  # noqa: BLE001
            RES[key] = {"error": traceback.format_exc(limit=4)}
            log(key, "failed:", RES[key]["error"])
        save()
        torch.cuda.empty_cache()
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
