"""Benchmark speculative decoding on the real default pair; results go to BENCHMARKS.md.

For each prompt (a new function, an explanation, a copy-heavy edit of a 166-line file, a
search/replace edit, a fill-in-the-middle completion, and a second conversation turn) it runs the
verifier alone and our speculator with each drafter (``none``, ``ngram``, ``model``, ``auto``),
greedy, ``--repeats`` times, and reports decode tokens/s (prefill excluded), the ratio to the
verifier alone measured in the same run, acceptance, and whether the output is identical to the
verifier alone. With ``--server PATH`` it also runs llama.cpp's own speculation (``llama-server
-md ... --spec-type draft-simple``) at several draft lengths, plus llama-server alone as its own
baseline. It finally prints the measured cost tables and where model drafting would pay.

The model drafter's cache is cleared before each run, so its catch-up on the prompt counts in
its draft time, as it would for a fresh request.

Example::

    python scripts/bench_speculative.py --repeats 3 --server /tmp/llama-server --json out.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openjarvis import paths  # noqa: E402
from openjarvis.engine import costs  # noqa: E402
from openjarvis.engine.base import CostModel  # noqa: E402
from openjarvis.engine.drafters import ModelDrafter  # noqa: E402
from openjarvis.engine.llama import LlamaEngine, cost_key_for  # noqa: E402
from openjarvis.engine.planner import Option, choose  # noqa: E402
from openjarvis.engine.speculative import Request, Speculator  # noqa: E402
from openjarvis.engine.templates import Message, fim_prompt, render_chat  # noqa: E402

VERIFIER = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFTER = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def _source_file() -> str:
    import colorsys

    return inspect.getsource(colorsys)


SNIPPET = '''def read_config(path):
    result = {}
    section = None
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("[") and line.endswith("]"):
                section = result.setdefault(line[1:-1].strip(), {})
            elif "=" in line and section is not None:
                key, value = line.split("=", 1)
                section[key.strip()] = value.strip()
    return result
'''


@dataclass(frozen=True)
class Case:
    name: str
    text: str  # the full prompt text (templated already)
    max_tokens: int


def cases(template: str) -> list[Case]:
    src = _source_file()

    def chat(user: str) -> str:
        return render_chat(template, [Message("user", user)])

    cut = src.index("def hls_to_rgb")
    body = src.index("\n", src.index("if s == 0.0", cut)) + 1
    return [
        Case(
            "new function",
            chat(
                "Write a Python function `merge_intervals(intervals)` that merges overlapping"
                " intervals given as (start, end) tuples. Include type hints and a docstring."
            ),
            160,
        ),
        Case("explain", chat(f"Explain what this code does:\n```python\n{SNIPPET}```"), 160),
        Case(
            "copy-heavy edit",
            chat(
                f"Here is a file:\n```python\n{src}```\nReturn the whole file, unchanged except"
                " that `rgb_to_yiq` must round each returned component to 4 decimal places."
                " Output only the file in one code block."
            ),
            256,
        ),
        Case(
            "search/replace edit",
            chat(
                f"Here is a file:\n```python\n{src}```\nChange `hsv_to_rgb` so that it raises"
                " ValueError when s is outside [0, 1]. Answer with SEARCH/REPLACE blocks only:\n"
                "<<<<<<< SEARCH\n(exact lines from the file)\n=======\n(new lines)\n>>>>>>> REPLACE"
            ),
            160,
        ),
        Case("fim", fim_prompt(src[:body], src[body:]), 96),
    ]


def _price(cost: CostModel, n: int) -> float:
    """Seconds for one eval of n tokens; beyond the measured k, at the largest k's rate."""
    top = max(cost.seconds)
    return cost.verify(n) if n <= top else cost.seconds[top] * n / top


def run_ours(
    spec: Speculator, prompt: list[int], mode: str, max_tokens: int, *, warm_drafter: bool = False
) -> dict[str, Any]:
    """One generation; also its decode time priced with the measured cost tables ("modelled"),
    which the load of other processes on a shared machine does not disturb.

    The model drafter starts cold (its catch-up on the prompt counts as draft time) unless
    ``warm_drafter``: then it has seen the prompt before the clock starts, as the verifier has
    (its prefill is excluded from decode tokens/s), which isolates the per-step cost of drafting."""
    v = spec.verifier
    assert isinstance(v, LlamaEngine)
    d = spec.model_drafter.engine if spec.model_drafter is not None else None
    assert d is None or isinstance(d, LlamaEngine)
    if spec.model_drafter is not None and d is not None:
        if warm_drafter:
            spec.model_drafter.sync(prompt[:-1])
        else:
            d.rollback(0)
            spec.model_drafter.cached.clear()
    v_before = v.eval_counts.copy()
    d_before = d.eval_counts.copy() if d is not None else None
    gen = spec.generate(Request(prompt, max_tokens=max_tokens, drafter=mode)).run()  # type: ignore[arg-type]
    s = gen.stats
    modelled = sum(
        c * _price(v.cost_model(), n) for (n, last), c in (v.eval_counts - v_before).items() if not last
    )
    if d is not None and d_before is not None:
        modelled += sum(c * _price(d.cost_model(), n) for (n, _), c in (d.eval_counts - d_before).items())
    return {
        "tokens": gen.tokens,
        "modelled_tok_s": len(gen.tokens) / modelled if modelled else 0.0,
        "tok_s": s.tokens_per_second,
        "acceptance": s.acceptance,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "steps": s.steps,
        "tie_rechecks": s.tie_rechecks,
        "per_drafter": {k: [v.accepted, v.drafted] for k, v in s.per_drafter.items()},
    }


def second_turn(spec: Speculator, template: str, repeats: int) -> dict[str, Any]:
    """TTFT of a second turn with the conversation cached vs re-evaluating it all."""
    v = spec.verifier
    src = _source_file()
    first = v.tokenize(
        render_chat(template, [Message("user", f"Explain this file briefly:\n```python\n{src}```")])
    )
    gen1 = spec.generate(Request(first, max_tokens=96, drafter="auto")).run()
    follow = v.tokenize(
        "<|im_end|>\n<|im_start|>user\nNow write a test for rgb_to_hsv.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    second = first + gen1.tokens + follow
    warm, cold = [], []
    for _ in range(repeats):
        keep = len(first) + len(gen1.tokens) - 1
        v.rollback(min(keep, v.n_past))
        del spec.cached[keep:]
        warm.append(spec.generate(Request(second, max_tokens=1, drafter="none")).run().stats.ttft)
        v.rollback(0)
        spec.cached.clear()
        cold.append(spec.generate(Request(second, max_tokens=1, drafter="none")).run().stats.ttft)
        # Put the first turn back for the next warm run.
        v.rollback(0)
        spec.cached.clear()
        v.eval(second[:keep], last_only=True)
        spec.cached.extend(second[:keep])
    return {"prompt_tokens": len(second), "new_tokens": len(follow) + 1, "warm": warm, "cold": cold}


def server_runs(
    server: Path, models: Path, case_list: list[Case], draft_maxes: list[int], repeats: int,
    threads: int,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """llama-server alone and with draft-model speculation, per case and draft length."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    configs: list[tuple[str, list[str]]] = [("server alone", [])]
    for n in draft_maxes:
        configs.append(
            (
                f"server draft {n}",
                ["-md", str(models / DRAFTER), "--spec-type", "draft-simple",
                 "--spec-draft-n-max", str(n), "--spec-draft-n-min", "0", "-td", str(threads)],
            )
        )
    for label, extra in configs:
        port = 18931
        cmd = [
            str(server), "-m", str(models / VERIFIER), "-t", str(threads), "-c", "8192",
            "--port", str(port), "--no-webui", "-np", "1", *extra,
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_health(port, proc)
            for case in case_list:
                for _ in range(repeats):
                    out.setdefault(case.name, {}).setdefault(label, []).append(
                        _complete(port, case.text, case.max_tokens)
                    )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return out


def _wait_health(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"llama-server exited: {err[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become healthy")


def _complete(port: int, prompt: str, n: int) -> dict[str, Any]:
    body = json.dumps(
        {"prompt": prompt, "n_predict": n, "temperature": 0.0, "cache_prompt": True,
         "seed": 0, "samplers": ["top_k"], "top_k": 1}
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        data = json.loads(r.read())
    t = data.get("timings", {})
    return {
        "text": data.get("content", ""),
        "tok_s": t.get("predicted_per_second", 0.0),
        "draft_n": t.get("draft_n", 0),
        "draft_accepted": t.get("draft_n_accepted", 0),
    }


def exactness(
    spec: Speculator, case_list: list[Case], n_tokens: int, margins: tuple[float, ...]
) -> dict[str, Any]:
    """How batched and single-token evaluation differ, and what that does to greedy output.

    For each prompt: decode ``n_tokens`` greedily one token at a time (the reference), then
    re-evaluate the same tokens in batches of k and record, per position, the largest logit
    difference and whether the argmax changed (with the reference's top-2 gap there). Then run
    the speculator with a forced model drafter with and without the near-tie re-check.
    """
    import numpy as np

    from openjarvis.engine.sampling import top2_gap

    v = spec.verifier
    out: dict[str, Any] = {"flips": {}, "max_abs_diff": {}, "gaps_at_flips": [], "positions": 0,
                           "spec_identical": {}, "tie_rechecks": 0}
    for case in case_list:
        prompt = v.tokenize(case.text)
        v.rollback(0)
        spec.cached.clear()
        v.eval(prompt[:-1], last_only=True)
        base = v.n_past
        seq = [prompt[-1]]
        ref_rows = []
        for _ in range(n_tokens):
            row = v.eval([seq[-1]])[-1]
            ref_rows.append((int(np.argmax(row)), top2_gap(row), row))
            seq.append(int(np.argmax(row)))
        out["positions"] += n_tokens
        for k in (2, 4, 8):
            v.rollback(base)
            flips, diffs = 0, []
            for s in range(0, n_tokens, k):
                rows = v.eval(seq[s : s + k])
                for j, row in enumerate(rows):
                    ref_tok, gap, ref_row = ref_rows[s + j]
                    diffs.append(float(np.abs(row - ref_row).max()))
                    a, b = np.argsort(-ref_row)[:2]
                    gap_shift = abs(float(row[a] - row[b]) - float(ref_row[a] - ref_row[b]))
                    out["max_gap_shift"] = max(out.get("max_gap_shift", 0.0), gap_shift)
                    out.setdefault("gap_shifts", []).append(round(gap_shift, 4))
                    if int(np.argmax(row)) != ref_tok:
                        flips += 1
                        out["gaps_at_flips"].append(round(gap, 4))
            out["flips"][k] = out["flips"].get(k, 0) + flips
            out["max_abs_diff"][k] = max(out["max_abs_diff"].get(k, 0.0), max(diffs))
        v.rollback(0)
        spec.cached.clear()
        expected = seq[1:]
        for margin in margins:
            spec_m = Speculator(v, model_drafter=spec.model_drafter, tie_margin=margin)
            r = run_ours(spec_m, prompt, "model", n_tokens)
            got = r["tokens"]
            n_same = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                          min(len(got), len(expected)))
            out["spec_identical"].setdefault(str(margin), []).append(
                {"case": case.name, "identical": got == expected[: len(got)], "first_diff": n_same}
            )
            out["tie_rechecks"] += r["tie_rechecks"]
            v.rollback(0)
    return out


def pay_table(v: CostModel, d_step: float) -> list[str]:
    """Best model-drafting speedup over plain decoding for a grid of drafter speed x acceptance."""
    lines = ["| drafter step / verifier step | " + " | ".join(f"a={a}" for a in (0.6, 0.7, 0.8, 0.9)) + " |"]
    lines.append("|---|" + "---|" * 4)
    step = v.step()
    for ratio in (0.05, 0.1, 0.2, 0.3, 0.4, d_step / step):
        cells = []
        for a in (0.6, 0.7, 0.8, 0.9):
            plan = choose(v, [Option("model", 16, per_token=ratio * step)], {"model": a}, min_gain=0.0)
            cells.append(f"{plan.rate / plan.plain_rate:.2f}x (k={plan.k})" if plan.key else "1.00x (k=0)")
        lines.append(f"| {ratio:.2f} | " + " | ".join(cells) + " |")
    return lines


def summarize(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=paths.models_dir())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plan-threads", type=int, default=0,
                    help="plan and price with the cached cost tables of this thread count")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="none,ngram,model,auto")
    ap.add_argument("--cases", default="", help="comma-separated case names (default all)")
    ap.add_argument("--server", type=Path, help="llama-server binary for llama.cpp's speculation")
    ap.add_argument("--draft-max", default="3,5,8")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tie-margins", default="0,0.25,1.0",
                    help="near-tie re-check margins compared by --exactness")
    ap.add_argument("--exactness", type=int, default=0, metavar="N",
                    help="also measure batched vs single-token greedy agreement over N tokens")
    args = ap.parse_args(argv)

    v = LlamaEngine(args.models / VERIFIER, context=8192, threads=args.threads)
    d = LlamaEngine(args.models / DRAFTER, context=8192, threads=args.threads)
    spec = Speculator(v, model_drafter=ModelDrafter(d, verifier=v))
    template = v.chat_template() or ""
    case_list = [c for c in cases(template) if not args.cases or c.name in args.cases.split(",")]
    modes = args.modes.split(",")
    results: dict[str, Any] = {"ours": {}, "costs": {}}
    if args.plan_threads:
        # Plan (and price) with the tables measured for plan_threads on a quiet machine while
        # executing with --threads: a shared machine's load then changes only the wall clock.
        for engine in (v, d):
            table = costs.cached(cost_key_for(engine.path, args.plan_threads))
            if table is None:
                raise SystemExit(f"no cost table for {engine.path.name} at {args.plan_threads} threads")
            engine.set_cost_model(table)
    vc, dc = v.cost_model(), d.cost_model()
    results["costs"] = {"verifier": vc.seconds, "drafter": dc.seconds}

    for case in case_list:
        prompt = v.tokenize(case.text)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for rep in range(args.repeats):
            for mode in modes:  # interleaved, so load changes hit every mode alike
                r = run_ours(spec, prompt, mode, case.max_tokens)
                runs[mode].append(r)
                print(f"{case.name} [{rep}] {mode}: {r['tok_s']:.1f} tok/s (modelled"
                      f" {r['modelled_tok_s']:.1f}) acc {r['acceptance']:.0%}", file=sys.stderr)
        results["ours"][case.name] = runs
    if "second turn" in args.cases or not args.cases:
        results["second turn"] = second_turn(spec, template, args.repeats)
    if args.exactness:
        margins = tuple(float(x) for x in args.tie_margins.split(","))
        results["exactness"] = exactness(spec, case_list, args.exactness, margins)
        ex = dict(results["exactness"])
        shifts = sorted(ex.pop("gap_shifts", []))
        if shifts:
            ex["gap_shift_p50_p99_max"] = [shifts[len(shifts) // 2], shifts[int(len(shifts) * 0.99)],
                                           shifts[-1]]
        print(json.dumps(ex, indent=1))
    if args.server:
        results["server"] = server_runs(
            args.server, args.models, case_list, [int(x) for x in args.draft_max.split(",")],
            args.repeats, args.threads,
        )

    # -- report ------------------------------------------------------------------------
    print("| prompt | mode | tok/s median (min-max) | ratio to verifier alone | modelled ratio |"
          " acceptance | identical |")
    print("|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    modelled: dict[str, list[float]] = {m: [] for m in modes}
    for name, runs in results["ours"].items():
        base = runs.get("none") or runs[modes[0]]
        ref = base[0]["tokens"]
        base_med = statistics.median(r["tok_s"] for r in base)
        base_mod = statistics.median(r["modelled_tok_s"] for r in base)
        for mode, rs in runs.items():
            tps = [r["tok_s"] for r in rs]
            ratio = statistics.median(tps) / base_med
            mod = statistics.median(r["modelled_tok_s"] for r in rs) / base_mod
            ratios[mode].append(ratio)
            modelled[mode].append(mod)
            same = sum(r["tokens"] == ref for r in rs)
            acc = statistics.median(r["acceptance"] for r in rs)
            spread = f"{min(tps) / base_med:.2f}-{max(tps) / base_med:.2f}"
            print(f"| {name} | ours {mode} | {summarize(tps)} | {ratio:.2f}x ({spread}) | {mod:.2f}x |"
                  f" {acc:.0%} | {same}/{len(rs)} |")
        for label, rs in results.get("server", {}).get(name, {}).items():
            tps = [r["tok_s"] for r in rs]
            ref_text = v.detokenize(ref).decode(errors="replace")
            same = sum(r["text"] == ref_text for r in rs)
            acc = [r["draft_accepted"] / r["draft_n"] for r in rs if r["draft_n"]]
            acc_s = f"{statistics.median(acc):.0%}" if acc else "-"
            print(f"| {name} | {label} | {summarize(tps)} | {statistics.median(tps) / base_med:.2f}x |"
                  f" - | {acc_s} | {same}/{len(rs)} |")
    for mode, rs in ratios.items():
        geo = math.exp(sum(math.log(x) for x in rs) / len(rs)) if rs else 0.0
        geo_m = math.exp(sum(math.log(x) for x in modelled[mode]) / len(rs)) if rs else 0.0
        print(f"geometric mean ratio, ours {mode}: measured {geo:.2f}x, modelled {geo_m:.2f}x")
    if "second turn" in results:
        st = results["second turn"]
        w, c = statistics.median(st["warm"]), statistics.median(st["cold"])
        print(f"second turn ({st['prompt_tokens']} tokens, {st['new_tokens']} new): TTFT cached"
              f" {w:.2f}s vs re-evaluated {c:.2f}s = {c / w:.1f}x lower")
    print("verifier costs ms:", {k: round(s * 1000, 1) for k, s in vc.seconds.items()})
    print("drafter costs ms:", {k: round(s * 1000, 1) for k, s in dc.seconds.items()})
    print("\n".join(pay_table(vc, dc.step())))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    v.close()
    d.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
