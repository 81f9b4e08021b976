"""Benchmark drafter candidates against the verifier: cost, acceptance, speedup; for BENCHMARKS.md.

Issue 3 asks for a cheaper drafter, measured: each candidate (the default 0.5B drafter and the
models ``jarvis models quantize`` derived from it) is run against the 1.5B verifier, at the same
thread count, in the same process, and reported with ratios to the original drafter:

1. **Cost**: the engine's own cost model (``costs.measure``: eval of k tokens at position 256,
   median of 5), measured ``--repeats`` times, interleaved over all models, so the spread shows.
2. **Acceptance** (greedy, deterministic): per-token agreement of the drafter's argmax with the
   verifier's, teacher-forced over a real source file (``--code-tokens`` positions) and over the
   verifier's own greedy answers to the bench prompts. Agreement at a position is exactly "a
   greedy draft token there would be accepted", so walking an answer with draft length k gives
   the mean accepted length without running the speculator.
3. **Modelled speedup**: that walk priced with the measured tables (drafter: catch-up plus k-1
   steps; verifier: one eval of k+1), at the k the planner picks for the measured acceptance
   (``--drafter model``: best k; ``auto``: only if it beats plain decoding by ``MIN_GAIN``).
4. **Measured speedup**: the speculator on the bench prompts with ``--drafter model`` and
   ``auto``, against the verifier alone in the same round (``bench_speculative.run_ours``). The
   drafter sees the prompt before the clock starts, as the verifier does (decode tokens/s).
5. **Where model drafting pays**: the largest drafter step (as a fraction of a verifier step) the
   planner would draft with, for this machine's verify costs and for cheaper verification.

Example::

    flock -x /tmp/jarvis-bench.lock .venv/bin/python scripts/bench_drafters.py --repeats 2 \\
        --json /tmp/drafters.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from bench_speculative import Case, cases, run_ours  # noqa: E402

from openjarvis.config import load_config  # noqa: E402
from openjarvis.engine import costs  # noqa: E402
from openjarvis.engine.base import CostModel  # noqa: E402
from openjarvis.engine.drafters import ModelDrafter  # noqa: E402
from openjarvis.engine.llama import LlamaEngine  # noqa: E402
from openjarvis.engine.planner import MIN_GAIN, STEP_OVERHEAD_S, Acceptance, Option, choose  # noqa: E402
from openjarvis.engine.speculative import Request, Speculator  # noqa: E402
from openjarvis.models import Catalog  # noqa: E402

#: Rows evaluated per call when teacher-forcing (a row of Qwen's vocabulary is 600 kB).
CHUNK = 64
#: Longest draft the planner considers (the speculator's default ``max_draft``).
MAX_DRAFT = 16
#: Ks whose cost the table reports (the drafter's catch-up is usually 1-2 tokens).
REPORT_KS = (1, 2, 4, 8)


@dataclass
class Model:
    id: str
    path: Path
    engine: LlamaEngine
    tables: list[CostModel]

    def cost(self) -> CostModel:
        """Median over the repeated measurements, per k (``_median_table``), under this key."""
        med = _median_table([t.seconds for t in self.tables])
        return CostModel(key=self.tables[0].key, seconds=med.seconds)


def candidates(catalog: Catalog, source: str, extra: list[str]) -> list[str]:
    """The source drafter and every installed model derived from it (or the ids given)."""
    if extra:
        return [source, *[x for x in extra if x != source]]
    derived = [
        m.id
        for m in sorted(catalog.models.values(), key=lambda m: m.id)
        if m.derived_from.startswith(f"{source} (") and catalog.status(m).installed
    ]
    return [source, *derived]


def argmax_rows(engine: LlamaEngine, context: list[int], targets: list[int]) -> np.ndarray:
    """Teacher-forced argmax of the next token at each of ``targets``' positions after ``context``."""
    engine.rollback(0)
    if len(context) > 1:
        engine.eval(context[:-1], last_only=True)
    seq = [context[-1], *targets[:-1]]
    out: list[np.ndarray] = []
    for s in range(0, len(seq), CHUNK):
        rows = engine.eval(seq[s : s + CHUNK])
        out.append(np.argmax(rows, axis=1))
    engine.rollback(0)
    return np.concatenate(out)


def walk(agree: np.ndarray, k: int) -> tuple[int, int, int]:
    """Greedy speculation over one answer at draft length k: (steps, accepted, full drafts)."""
    i, steps, accepted, full = 0, 0, 0, 0
    n = len(agree)
    while i < n:
        run = 0
        while run < k and i + run < n and agree[i + run]:
            run += 1
        steps += 1
        accepted += run
        full += run == k
        i += run + 1
    return steps, accepted, full


def modelled(agree: np.ndarray, k: int, v: CostModel, d: CostModel) -> float:
    """Speedup over plain decoding of drafting k per step over this answer, priced with the tables.

    A step costs the drafter's catch-up (1 token, 2 after a fully accepted draft: its last draft
    token was never evaluated) plus k-1 single steps, and one verifier eval of k+1 tokens."""
    if k == 0:
        return 1.0
    steps, _, full = walk(agree, k)
    t = steps * (d.step() + (k - 1) * d.step() + v.verify(k + 1) + STEP_OVERHEAD_S)
    t += full * (d.verify(2) - d.step())
    return len(agree) * (v.step() + STEP_OVERHEAD_S) / t


def planned_k(v: CostModel, d: CostModel, a: float, *, forced: bool) -> int:
    """The draft length the planner settles on once its acceptance estimate is ``a``."""
    plan = choose(v, [Option("model", MAX_DRAFT, per_token=d.step())], {"model": a},
                  min_gain=-1.0 if forced else MIN_GAIN)
    if plan.key is None:
        return 1 if forced else 0  # a forced drafter drafts one token even where it cannot pay
    return plan.k


def break_even(v: CostModel, a: float) -> float:
    """Largest drafter step / verifier step at which the planner (default ``MIN_GAIN``) drafts."""
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = choose(v, [Option("model", MAX_DRAFT, per_token=mid * v.step())], {"model": a}).key
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def linear_verifier(step: float, slope: float) -> CostModel:
    """A verifier whose eval of k tokens costs ``step * (1 + slope * (k - 1))``."""
    return CostModel(key=f"linear {slope}", seconds={k: step * (1 + slope * (k - 1)) for k in range(1, 18)})


def code_text() -> str:
    """Real Python that none of the bench prompts contains (the stdlib's textwrap)."""
    return inspect.getsource(textwrap)


def _table(seconds: dict[Any, float]) -> CostModel:
    return CostModel(key="", seconds={int(k): float(v) for k, v in seconds.items()})


def _median_table(tables: list[dict[Any, float]]) -> CostModel:
    """Median over repeated measurements, per k (then made monotone, as ``costs`` does)."""
    ks = [int(k) for k in tables[0]]
    med = {k: statistics.median(float(t[k] if k in t else t[str(k)]) for t in tables) for k in ks}
    return CostModel(key="", seconds=costs._monotone(med))


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"


def _geo(xs: list[float]) -> float:
    return float(np.exp(np.mean(np.log(xs)))) if xs else 0.0


def report(data: dict[str, Any]) -> list[str]:
    """Markdown tables from one run's data (also ``--report saved.json``, without re-running)."""
    ids: list[str] = data["drafters"]
    names: list[str] = data["texts"]
    bench = [n for n in names if not n.startswith("code")]
    modes: list[str] = data["modes"]
    vc = _median_table(data["costs"][data["verifier"]])
    dcs = {d: _median_table(data["costs"][d]) for d in ids}
    agree = {d: {n: np.asarray(data["agreement"][d][n], dtype=bool) for n in names} for d in ids}
    base = ids[0]
    loads = data["loads"]
    out: list[str] = []
    say = out.append
    say(f"{len(ids)} drafters, {data['threads']} threads, {data['when']}, {data['seconds']} s; 1-minute load"
        f" average {min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f})")
    say(f"verifier {data['verifier']}: step {vc.step() * 1e3:.1f} ms"
        f" ({min(t['1'] if '1' in t else t[1] for t in data['costs'][data['verifier']]) * 1e3:.1f}-"
        f"{max(t['1'] if '1' in t else t[1] for t in data['costs'][data['verifier']]) * 1e3:.1f});"
        " verify(k)/step " + ", ".join(f"k={k} {vc.verify(k) / vc.step():.2f}" for k in (2, 3, 4, 5, 8, 17)))
    say("")
    say("| drafter | file | step ms median (min-max) | step / original | step / verifier step |"
        + "".join(f" eval {k} ms |" for k in REPORT_KS[1:]))
    say("|---|---|---|---|---|" + "---|" * (len(REPORT_KS) - 1))
    for d in ids:
        dc = dcs[d]
        steps = [float(t["1"] if "1" in t else t[1]) * 1e3 for t in data["costs"][d]]
        cells = "".join(f" {dc.verify(k) * 1e3:.1f} |" for k in REPORT_KS[1:])
        say(f"| {d} | {data['sizes'][d] / 1e6:.0f} MB | {statistics.median(steps):.1f} ({min(steps):.1f}-"
            f"{max(steps):.1f}) | {dc.step() / dcs[base].step():.2f}x | {dc.step() / vc.step():.2f} |{cells}")
    say("")
    say("| drafter | " + " | ".join(names) + " | bench answers | ratio to original |")
    say("|---|" + "---|" * (len(names) + 2))
    pooled = {d: float(np.mean(np.concatenate([agree[d][n] for n in bench]))) if bench else 0.0 for d in ids}
    for d in ids:
        say(f"| {d} | " + " | ".join(f"{np.mean(agree[d][n]):.1%}" for n in names) + f" | {pooled[d]:.1%} |"
            f" {pooled[d] / max(pooled[base], 1e-9):.3f} |")
    say("")
    say("Per prompt: k the planner settles on for the prompt's agreement (forced model drafter), the"
        " mean accepted length and modelled speedup of that k over the verifier's answer, and the"
        " measured runs (wall clock, and their evals priced with the tables) against the verifier alone.")
    say("")
    say("| drafter | prompt | k | mean accepted | modelled | measured model | priced model |"
        + "".join(f" measured {m} |" for m in modes if m != "model"))
    say("|---|---|---|---|---|---|---|" + "---|" * len([m for m in modes if m != "model"]))
    summary: dict[str, dict[str, float]] = {}
    for d in ids:
        dc = dcs[d]
        geo: dict[str, list[float]] = {"modelled": [], "measured model": [], "priced model": []}
        for n in bench:
            ag = agree[d][n]
            k = planned_k(vc, dc, float(np.mean(ag)), forced=True)
            steps, acc, _ = walk(ag, k)
            mm = modelled(ag, k, vc, dc)
            geo["modelled"].append(mm)
            cells = ""
            runs = data["measured"].get(n)
            if runs:
                base_runs = runs["none"]["verifier alone"]
                b_tps = statistics.median(r["tok_s"] for r in base_runs)
                b_mod = statistics.median(r["modelled_tok_s"] for r in base_runs)
                for mode in modes:
                    tps = [r["tok_s"] / b_tps for r in runs[mode][d]]
                    geo.setdefault(f"measured {mode}", []).append(statistics.median(tps))
                    cells += f" {_spread(tps)} |"
                    if mode == "model":
                        priced = statistics.median(r["modelled_tok_s"] for r in runs[mode][d]) / b_mod
                        geo["priced model"].append(priced)
                        cells += f" {priced:.2f}x |"
            say(f"| {d} | {n} | {k} | {acc / steps:.2f} | {mm:.2f}x |{cells}")
        summary[d] = {key: _geo(xs) for key, xs in geo.items() if xs}
    say("")
    say("| drafter | step / verifier step | agreement | modelled model | measured model | priced model |"
        + "".join(f" measured {m} |" for m in modes if m != "model"))
    say("|---|---|---|---|---|---|" + "---|" * len([m for m in modes if m != "model"]))
    for d in ids:
        sm = summary[d]
        rest = "".join(f" {sm.get('measured ' + m, 0):.2f}x |" for m in modes if m != "model")
        say(f"| {d} | {dcs[d].step() / vc.step():.2f} | {pooled[d]:.1%} | {sm['modelled']:.2f}x |"
            f" {sm.get('measured model', 0):.2f}x | {sm.get('priced model', 0):.2f}x |{rest}")
    say("(geometric means over the bench prompts)")
    say("")
    alphas = [0.7, 0.8, 0.9, 0.95, 1.0]
    say(f"Largest drafter step / verifier step at which the planner drafts (MIN_GAIN {MIN_GAIN:.0%}),"
        " by per-token acceptance:")
    say("")
    say("| verifier | verify(4)/step | verify(8)/step | " + " | ".join(f"a={a}" for a in alphas) + " |")
    say("|---|---|---|" + "---|" * len(alphas))
    tables = [("this CPU, measured", vc)] + [
        (f"linear, slope {s}", linear_verifier(vc.step(), s)) for s in (0.5, 0.3, 0.2, 0.1, 0.05, 0.03)
    ]
    for label, table in tables:
        say(f"| {label} | {table.verify(4) / table.step():.2f} | {table.verify(8) / table.step():.2f} | "
            + " | ".join(f"{break_even(table, a):.2f}" for a in alphas) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="qwen2.5-coder-0.5b", help="catalog id the candidates derive from")
    ap.add_argument("--candidates", default="", help="comma-separated catalog ids (default: source + derived)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="measured speculator runs per mode")
    ap.add_argument("--cost-repeats", type=int, default=3, help="cost-model measurements per model")
    ap.add_argument("--code-tokens", type=int, default=512)
    ap.add_argument("--cases", default="", help="comma-separated bench case names (default all)")
    ap.add_argument("--modes", default="model,auto", help="measured speculator modes ('' to skip)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--report", type=Path, help="print the tables of a saved --json run; run nothing")
    args = ap.parse_args(argv)
    if args.report:
        print("\n".join(report(json.loads(args.report.read_text(encoding="utf-8")))))
        return 0

    config = load_config()
    catalog = Catalog.load(config)
    pair = catalog.pair(config.models.pair or None)
    ids = candidates(catalog, args.source, [x for x in args.candidates.split(",") if x])
    t0 = time.perf_counter()

    loads: list[float] = []

    def log(msg: str) -> None:
        loads.append(os.getloadavg()[0])
        print(f"[{time.perf_counter() - t0:6.0f}s load {loads[-1]:.2f}] {msg}", file=sys.stderr)

    def load(mid: str) -> Model:
        path = catalog.installed_path(mid)
        return Model(mid, path, LlamaEngine(path, context=8192, threads=args.threads), [])

    verifier = load(pair.verifier)
    drafters = [load(mid) for mid in ids]
    for d in drafters:
        ModelDrafter(d.engine, verifier=verifier.engine)  # raises unless the vocabularies match

    # -- 1. costs, interleaved -------------------------------------------------------------
    for rep in range(args.cost_repeats):
        for m in [verifier, *drafters]:
            m.tables.append(costs.measure(m.engine, m.engine.cost_key()))
            log(f"costs {rep} {m.id}: step {m.tables[-1].step() * 1e3:.1f} ms")
    for m in [verifier, *drafters]:
        # This run's tables, for planning and pricing; the user's cost cache is left alone (a
        # table measured during another process's load spike must not steer `jarvis generate`).
        m.engine.set_cost_model(m.cost())

    # -- 2. acceptance: teacher-forced agreement -------------------------------------------
    v = verifier.engine
    template = v.chat_template() or ""
    case_list: list[Case] = [c for c in cases(template) if not args.cases or c.name in args.cases.split(",")]
    code = v.tokenize(code_text())[: args.code_tokens + 1]
    texts: dict[str, tuple[list[int], list[int]]] = {"code (textwrap.py)": (code[:1], code[1:])}
    spec = Speculator(v)
    for case in case_list:
        prompt = v.tokenize(case.text)
        answer = spec.generate(Request(prompt, max_tokens=case.max_tokens, drafter="none")).run().tokens
        texts[case.name] = (prompt, answer)
        log(f"verifier answer for {case.name}: {len(answer)} tokens")
    v.rollback(0)
    spec.cached.clear()
    # On the bench answers the verifier's argmax is the answer itself (greedy, one token a step).
    ref = {name: argmax_rows(v, ctx, tgt) for name, (ctx, tgt) in texts.items() if name.startswith("code")}
    agree: dict[str, dict[str, np.ndarray]] = {}
    for d in drafters:
        agree[d.id] = {}
        for name, (ctx, tgt) in texts.items():
            target = ref[name] if name.startswith("code") else np.asarray(tgt)
            agree[d.id][name] = argmax_rows(d.engine, ctx, tgt) == target
        log(f"agreement {d.id}: {np.mean(np.concatenate(list(agree[d.id].values()))):.1%}")

    # -- 3. measured speculation -------------------------------------------------------------
    modes = [m for m in args.modes.split(",") if m]
    measured: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    if modes:
        for case in case_list:
            prompt = v.tokenize(case.text)
            measured[case.name] = {"none": {"verifier alone": []}}
            for rep in range(args.repeats):
                spec.model_drafter = None
                spec.acceptance = Acceptance()
                r = run_ours(spec, prompt, "none", case.max_tokens)
                measured[case.name]["none"]["verifier alone"].append(r)
                for d in drafters:
                    spec.model_drafter = ModelDrafter(d.engine, verifier=v)
                    for mode in modes:
                        spec.acceptance = Acceptance()  # a fresh request of a fresh process
                        r = run_ours(spec, prompt, mode, case.max_tokens, warm_drafter=True)
                        measured[case.name].setdefault(mode, {}).setdefault(d.id, []).append(r)
                        log(f"{case.name} [{rep}] {mode} {d.id}: {r['tok_s']:.1f} tok/s"
                            f" (modelled {r['modelled_tok_s']:.1f}) acc {r['acceptance']:.0%}")
                    d.engine.rollback(0)

    # -- report ----------------------------------------------------------------------------------
    data: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.perf_counter() - t0),
        "threads": args.threads,
        "loads": loads,
        "verifier": verifier.id,
        "drafters": [d.id for d in drafters],
        "sizes": {d.id: d.path.stat().st_size for d in drafters},
        "costs": {m.id: [t.seconds for t in m.tables] for m in [verifier, *drafters]},
        "texts": list(texts),
        "agreement": {d: {n: a.tolist() for n, a in per.items()} for d, per in agree.items()},
        "modes": modes,
        "measured": {c: {mode: {mid: [{k: r[k] for k in ("tok_s", "modelled_tok_s", "acceptance",
                                                          "drafted", "accepted", "steps")} for r in rs]
                                for mid, rs in by.items()} for mode, by in runs.items()}
                     for c, runs in measured.items()},
    }
    print("\n".join(report(data)))
    if args.json:
        args.json.write_text(json.dumps(data, indent=1), encoding="utf-8")
    for m in [verifier, *drafters]:
        m.engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
