"""Where a step's time goes between and inside its kernels: a GPU-timer trace.

Every program of the step's traced kernels (qkv, the attention's split and merge kernels, the
o-projection, gate/up, down, output; a verify step's qkv is a split-K product and a RoPE
kernel, ``--tokens``) stamps the GPU's global timer at entry, past its PDL wait,
past its main loop and at its end (``kernels._stamp``). The step is captured once with tracing
on and replayed; per launch the first and last program of each event give, per kernel kind and
median over the middle layers and the replays:

    release   first program past its wait - last program of the kernel before at its end
    lead      first program past its wait - first program at entry (how early it launched)
    loop      last program past its main loop - first program past its wait
    tail      last program done - last program past its main loop
    layer     a layer's down projection done - the layer before's done

and where its programs ran (``placement``: the SM each program's entry stamp records): the most
programs on one SM, the SMs used, how many were resident before the kernel before ended, and
how many the SM that finished last held.

Random weights of the default pair's shapes; run on the lent GPU:
``python3 scripts/trace_step.py --out DIR`` (DIR/trace.json). Stamps cost a few stores a
program, so the traced step is itself timed against the untraced one.

``--variants default,early17:w13e`` traces today's defaults and then a variant of one of
bench_verify.py's named sets (its verify and one-token settings merged, as its breakdowns
merge them), each in a Runner of its own: where a variant loses in bench_verify, its trace
says which kernel slows.

``--greedy plain,screened`` traces greedy steps instead of logits steps, with the output
matrix read in bfloat16 or through its int8 screen: the launches after the last layer
(``TAILS``: the ``ARGMAX`` projection and its merge, or the limbs' kernel, the screen, the
rescoring and the merge) get the same figures, and ``after_layers`` is the last layer's down
projection done to the step's last program done (session 34).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import time_ms  # noqa: E402  # the benchmarks' one timer
from bench_verify import T1_SETS, VERIFY_SETS, configure, runner_for  # noqa: E402

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B, ModelArgs  # noqa: E402
from openjarvis.engine.torch.generate import Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer  # noqa: E402
from openjarvis.engine.torch.weights import random_weights  # noqa: E402

KINDS = ("qkv", "attn", "merge", "wo", "w13", "w2")
#: A verify step's launches a layer (T > 1): qkv is ``kernels.qkv_split``'s two.
VERIFY_KINDS = ("qkv", "rope", "attn", "merge", "wo", "w13", "w2")
PROGS = 16384  # programs recorded a launch (the output projection has ~9.5k)
#: The launches after the last layer, by the step's kind (``--greedy``): a logits step's
#: output projection; a greedy step's ``ARGMAX`` projection and its merge; a screened greedy
#: step's limbs' kernel, screen, rescoring and merge (``kernels.screen``).
TAILS = {"logits": ("out",), "plain": ("out", "pick"),
         "screened": ("prep", "screen", "rescore", "pick")}


def variant_settings(spec: str) -> dict[str, Any]:
    """The Runner settings that ``spec`` names: "default" (none), or "SET:NAME", a variant of
    bench_verify.py's ``--set SET`` (its verify settings, with its one-token ones on top)."""
    if spec == "default":
        return {}
    name_set, sep, name = spec.partition(":")
    if not sep or name_set not in T1_SETS:
        raise SystemExit(f"trace_step: --variants takes default or SET:NAME with SET one of "
                         f"bench_verify.py's sets, not {spec!r}")
    found = {**VERIFY_SETS.get(name_set, {}).get(name, {}), **T1_SETS[name_set].get(name, {})}
    if name not in VERIFY_SETS.get(name_set, {}) and name not in T1_SETS[name_set]:
        known = sorted({*VERIFY_SETS.get(name_set, {}), *T1_SETS[name_set]})
        raise SystemExit(f"trace_step: set {name_set} has no variant {name!r}; it has {known}")
    return found


def placement(st: torch.Tensor, sm: torch.Tensor, seen: torch.Tensor,
              before_end: float) -> list[tuple[str, float]]:
    """How one launch's programs lay on the SMs: the most on one SM (``sm_max``), the SMs used,
    how many entered before the kernel before had ended (``early_n``, resident early) and the
    most of those on one SM (``early_max``), and how many programs the SM whose last program
    left its loop last held (``late_n``). An early launch's programs take whatever room the
    kernel before leaves; if they pile onto few SMs, ``late_n`` against ``sm_max`` says whether
    the pile is what the launch waits for. ``st`` [progs, 4] stamps (ns), ``sm`` [progs]."""
    s, p = sm[seen], st[seen]
    if not len(s):
        return []
    per_sm = torch.bincount(s)
    early = p[:, 0] < before_end
    per_sm_early = torch.bincount(s[early], minlength=len(per_sm))
    loop_end = torch.full((len(per_sm),), -float("inf"), dtype=torch.float64)
    loop_end = loop_end.scatter_reduce(0, s, p[:, 2], reduce="amax")
    return [("sm_max", float(per_sm.max())), ("sm_used", float((per_sm > 0).sum())),
            ("early_n", float(early.sum())), ("early_max", float(per_sm_early.max())),
            ("late_n", float(per_sm[int(loop_end.argmax())]))]


def launch_figures(first: torch.Tensor, last: torch.Tensor, st: torch.Tensor, sm: torch.Tensor,
                   seen: torch.Tensor, j: int) -> list[tuple[str, float]]:
    """Launch ``j``'s figures (the module docstring's release, lead, wait_spread, loop and
    tail, µs) and its ``placement``, from each launch's first and last program's stamps
    (``first``, ``last`` [launch, event], µs) and its programs' stamps (``st``, ns), SMs and
    which of them stamped; launch ``j - 1`` is the kernel before."""
    figures = (("release", first[j, 1] - last[j - 1, 3]), ("lead", first[j, 1] - first[j, 0]),
               ("wait_spread", last[j, 1] - first[j, 1]), ("loop", last[j, 2] - first[j, 1]),
               ("tail", last[j, 3] - last[j, 2]))
    return ([(name, float(val)) for name, val in figures]
            + placement(st[j], sm[j], seen[j], float(last[j - 1, 3]) * 1e3))


def timer_tick(stamps: torch.Tensor) -> int:
    """The timer's step as the stamps show it: the gcd of the gaps between distinct stamps.

    A trace is only as fine as this; sessions 5-20 read 256 ns steps that came from float64,
    not from the timer, so the figure is printed rather than assumed.
    """
    v = torch.unique(stamps.reshape(-1).to(torch.int64))
    gaps = (v[1:] - v[:-1]) if v.numel() > 1 else v.new_zeros(0)
    tick = 0
    for g in gaps[:100_000].tolist():
        tick = math.gcd(tick, int(g))
        if tick == 1:
            break
    return tick


def trace(a: ModelArgs, pos: int, replays: int,
          l2_prefetch: tuple[float, int, int] | None | bool = True,
          t: int = 1, variant: dict[str, Any] | None = None,
          carveout: int | None = None, kind: str = "logits") -> dict[str, Any]:
    """One step's trace (module docstring). ``kind``: a logits step, or a greedy one with the
    output matrix's screen off ("plain") or on ("screened"), whatever the Runner's default."""
    if kind not in TAILS:
        raise SystemExit(f"trace_step: a step is one of {sorted(TAILS)}, not {kind!r}")
    if variant:  # bench_verify's own Runner and settings, so the variant means the same there
        r, base = runner_for(a, pos + 64)
        configure(r, variant, base)
    else:
        w = random_weights(a, torch.bfloat16, "cuda", seed=0)
        r = Runner(Transformer(a, w, n_pos=pos + 128), pos + 64, kernels="triton", graphs=True)
    if l2_prefetch is not True:  # True: the default's (its side-stream kernel is not traced)
        r.l2_prefetch = l2_prefetch  # type: ignore[assignment]
    greedy = kind != "logits"
    if greedy:
        r.screen_out = kind == "screened"
    tails = TAILS[kind]
    kinds = KINDS if t == 1 else VERIFY_KINDS
    nk = len(kinds)
    toks = list(range(100, 100 + t))
    step = functools.partial(r.step, toks, pos, greedy=greedy)
    step()
    if carveout is not None:  # every kernel compiled so far, then the step captured anew
        K.set_carveout(carveout)
        r.drop_steps()
        step()
    replay = functools.partial(r.replay, t, greedy=greedy)
    plain_ms = time_ms(replay)
    n_launch = nk * a.n_layer + len(tails)
    with K.tracing(n_launch, PROGS, "cuda") as buf:
        r.drop_steps()
        step()  # captured traced: its replays stamp into buf
        if carveout is not None:  # the traced kernels were compiled in that capture
            K.set_carveout(carveout)
            r.drop_steps()
            step()
        if K.TRACE["next"] != n_launch:  # (a step without split-K qkv, say: misindexed)
            raise SystemExit(f"trace_step: the step made {K.TRACE['next']} traced launches, "
                             f"expected {n_launch} ({nk} a layer and {', '.join(tails)})")
    traced_ms = time_ms(replay)
    rows: dict[str, list[float]] = {}
    for _ in range(replays):
        buf.zero_()
        r.replay(t, greedy=greedy)
        torch.cuda.synchronize()
        rec = buf.view(n_launch, PROGS, K.TRACE_WIDTH).cpu()
        raw, sm = rec[:, :, :4], rec[:, :, K.TRACE_SM]
        seen = raw[:, :, 0] > 0
        # ns from the step's first entry, taken in int64: the timer counts ns since the epoch
        # (~1.8e18), where float64 values lie 256 ns apart: every trace before session 20 read
        # times in steps of 0.256 us, whatever the timer's own resolution
        rel = raw - int(raw[:, :, 0][seen].min())
        rows.setdefault("tick_ns", []).append(float(timer_tick(rel[seen])))
        st = rel.double()
        big = float("inf")
        first = torch.where(seen[..., None], st, big).amin(1) / 1e3  # [launch, event], us
        last = torch.where(seen[..., None], st, -big).amax(1) / 1e3
        for li in range(2, a.n_layer - 2):
            for k, kname in enumerate(kinds):
                for name, val in launch_figures(first, last, st, sm, seen, nk * li + k):
                    rows.setdefault(f"{kname}.{name}", []).append(val)
            rows.setdefault("layer", []).append(
                float(last[nk * li + nk - 1, 3] - last[nk * li - 1, 3]))
        for i, name in enumerate(tails):  # the launches after the last layer
            for part, val in launch_figures(first, last, st, sm, seen, nk * a.n_layer + i):
                rows.setdefault(f"{name}.{part}", []).append(val)
        end = nk * a.n_layer - 1  # the last layer's down projection
        rows.setdefault("after_layers", []).append(float(last[n_launch - 1, 3]
                                                         - last[end, 3]))
        rows.setdefault("layers", []).append(float(last[end, 3]))
        rows.setdefault("step_span", []).append(float(last[:, 3].max()))
    if carveout is not None:
        K.set_carveout(K.CARVEOUT_DEFAULT)
    med = {k: round(statistics.median(v), 3) for k, v in rows.items()}
    return {"t": t, "kind": kind, "tails": list(tails), "ms": plain_ms, "traced_ms": traced_ms,
            "median_us": med}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="1.5B,0.5B")
    ap.add_argument("--positions", default="512,4096")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--tokens", default="1", help="token counts of the steps traced (T = k + 1 "
                    "for a verify step of k drafts), comma-separated")
    ap.add_argument("--l2-prefetch", default="",
                    help="MiB,PROGRAMS[,AFTER] (Runner.l2_prefetch), or off; default: the "
                         "Runner's own")
    ap.add_argument("--variants", default="default",
                    help="comma-separated: default, or SET:NAME for a variant of bench_verify.py's "
                         "--set SET; each is traced in a Runner of its own")
    ap.add_argument("--greedy", default="logits",
                    help="comma-separated step kinds: logits (every logit written), plain (a "
                         "greedy step, the output matrix read in bfloat16) or screened (a "
                         "greedy step through its int8 screen); each traced in a Runner of "
                         "its own")
    ap.add_argument("--carveout", type=int, default=None,
                    help="every kernel prefers this %% of L1 as shared memory "
                         "(kernels.set_carveout); default: the driver's choice per kernel")
    args = ap.parse_args(argv)
    step_kinds = args.greedy.split(",")
    if bad := [k for k in step_kinds if k not in TAILS]:
        raise SystemExit(f"trace_step: --greedy takes {', '.join(TAILS)}; got {bad[0]!r}")
    variants = {spec: variant_settings(spec) for spec in args.variants.split(",")}
    if not torch.cuda.is_available():
        print("trace_step needs a CUDA GPU", file=sys.stderr)
        return 2
    models = {"1.5B": QWEN25_1_5B, "0.5B": QWEN25_0_5B}
    prefetch: tuple[float, int, int] | None | bool = True  # True: the Runner's default
    if args.l2_prefetch == "off":
        prefetch = None
    elif args.l2_prefetch:
        pf = [float(x) for x in args.l2_prefetch.split(",")]
        if len(pf) not in (2, 3):
            raise SystemExit("trace_step: --l2-prefetch takes MiB,PROGRAMS[,AFTER] or off")
        prefetch = (pf[0], int(pf[1]), int(pf[2]) if len(pf) > 2 else 0)
    res: dict[str, Any] = {}
    for name in args.models.split(","):
        for pos in (int(p) for p in args.positions.split(",")):
            for t, (spec, v), sk in ((int(x), sv, sk) for x in args.tokens.split(",")
                                     for sv in variants.items() for sk in step_kinds):
                out = trace(models[name], pos, args.replays, prefetch, t, v, args.carveout, sk)
                key = (f"{name}@{pos}" + (f"_T{t}" if t > 1 else "")
                       + (f"_c{args.carveout}" if args.carveout is not None else "")
                       + ("" if sk == "logits" else f"_{sk}"))
                res[key if spec == "default" else f"{key}_{spec}"] = out
                print(name, pos, t, spec, sk, json.dumps(out), flush=True)
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "trace.json").write_text(json.dumps(res, indent=1))
                torch.cuda.empty_cache()
    for key, out in res.items():
        m = out["median_us"]
        print(f"\n{key}: step {out['ms']:.4f} ms (traced {out['traced_ms']:.4f}), "
              f"layer {m['layer']:.2f} us, the timer's step {m['tick_ns']:.0f} ns")
        print("kind    release  lead  wait_spread  loop   tail")
        for kind in KINDS if out["t"] == 1 else VERIFY_KINDS:
            print(f"{kind:6s} " + " ".join(f"{m[f'{kind}.{x}']:7.2f}"
                                           for x in ("release", "lead", "wait_spread", "loop",
                                                     "tail")))
        for kind in out["tails"]:
            print(f"{kind:6s} " + " ".join(f"{m[f'{kind}.{x}']:7.2f}"
                                           for x in ("release", "lead", "wait_spread", "loop",
                                                     "tail")))
        print(f"the layers {m['layers']:.2f} us, after them {m['after_layers']:.2f} us")
        print("kind    programs an SM: most  SMs used  early  most early  on the last SM")
        for kind in (*(KINDS if out["t"] == 1 else VERIFY_KINDS), *out["tails"]):
            print(f"{kind:6s} " + " ".join(f"{m.get(f'{kind}.{x}', float('nan')):9.1f}"
                                           for x in ("sm_max", "sm_used", "early_n",
                                                     "early_max", "late_n")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
