"""The default pair on a GPU host through the product's own engines and speculator: both models
in the torch backend on the GPU, and the issue's heterogeneous case (the drafter in llama.cpp on
the host's CPU, the verifier on the GPU; ``engine.drafter_backend = "llama"``), against each
other in one process.

The real GGUF files cannot travel to the lent GPU (1.6 GB against 64 MiB a call), so the run
writes files of the same structure there: each model's header as it is (metadata, tokenizer,
every tensor's name, type, shape and offset), read from a skeleton made here, and behind it
random weights in the same quantized types (every block's bytes random, its scales set so the
weights spread about as a trained model's do). The engines load them as they load the real
files: llama.cpp through ``LlamaEngine``, the torch backend through ``TorchEngine.from_gguf``
(the blocks decoded on the GPU, every step's CUDA graph captured). Random
weights price every call exactly; they do not make the 0.5B predict the 1.5B, so speculation
is composed from the calls' wall times with the acceptance measured for the real pair on the
CPU (``--accept``), as ``bench_gpu.py`` composes it.

Two steps::

    python scripts/bench_pair_gpu.py skeleton --dir .pairbench/skel     # here: the installed pair
    python3 scripts/bench_pair_gpu.py run --skeletons .pairbench/skel --out $OUT/pair   # there

(``load`` instead of ``run`` measures only the torch engine's load there: seconds and GPU memory,
each tensor decoded whole against in chunks, ``load_memory``.)

The run, in one process (results in ``--out``/pair.json):

1. the two files written from their skeletons (seconds);
2. the engines loaded as a user's are (seconds each): both models on the GPU, the drafter also
   in llama.cpp at each thread count of ``--threads``;
3. what the GPU computes from those files, over 256 positions of real text: its logits against
   the torch backend's float32 on the CPU (the dequantized file computed exactly) and against
   llama.cpp's (relative error, top-1 agreement);
4. each call as the speculator makes it, wall time at positions 512 and 4096 (median of the
   rounds' medians): the verifier's greedy step of 1 and of k + 1 tokens; a greedy draft of k
   tokens by the 0.5B on the GPU (one call, then the rest as one graph: ``draft_greedy``) and in
   llama.cpp (k one-token calls), k = 1, 2, 4, 8;
5. greedy speculation composed from those times (``bench_gpu.compose``): tokens/s of plain
   decoding, both models on the GPU and the heterogeneous pair at each thread count, the best k
   of each;
6. the ``Speculator`` end to end on each configuration (a real prompt, ``--tokens`` tokens): with
   random weights the drafter's acceptance is about zero and the planner soon drafts no more,
   so this shows that each configuration runs, and the speculator's own cost a token on the GPU
   (its tokens/s against the verifier's step), not a speed of speculation.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

T0 = time.monotonic()
ROLES = ("drafter", "verifier")
#: Prompt tokens of each end-to-end answer.
E2E_PROMPT = 500
#: Quantized block layouts: bytes a block, and where its float16 scales sit, with the value that
#: gives weights a standard deviation near 0.02 when the rest of the block is random bytes:
#: Q8_0 d·q (q int8: sd 74); Q5_0 d·(q - 16) (q 0-31: sd 9.2); Q4_K d·sc·q - dmin·m (sc, m
#: 6-bit, q 4-bit: dmin = 7.5 d centres it, sd 256 d); Q6_K d·s·(q - 32) (s int8, q 6-bit: sd 1369 d).
BLOCKS: dict[str, tuple[int, tuple[tuple[int, float], ...]]] = {
    "Q8_0": (34, ((0, 2.7e-4),)),
    "Q5_0": (22, ((0, 2.2e-3),)),
    "Q4_K": (144, ((0, 7.8e-5), (2, 5.9e-4))),
    "Q6_K": (210, ((208, 1.46e-5),)),
}


def log(*a: object) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s]", *a, flush=True)


# -- skeletons (here) and files (there) --------------------------------------------------------


def skeleton(out: Path) -> None:
    """The installed default pair's headers and tensor tables, for ``synthesize`` elsewhere."""
    import gguf

    from openjarvis.config import load_config
    from openjarvis.models import Catalog

    catalog = Catalog.load(load_config())
    pair = catalog.pair(None)
    paths = dict(zip(ROLES, catalog.pair_paths(pair.id), strict=True))
    out.mkdir(parents=True, exist_ok=True)
    for role, path in paths.items():
        reader = gguf.GGUFReader(path)
        start = min(int(t.data_offset) for t in reader.tensors)
        tensors = [{"name": t.name, "type": t.tensor_type.name, "offset": int(t.data_offset),
                    "nbytes": int(t.n_bytes)} for t in reader.tensors]
        with path.open("rb") as f:
            head = f.read(start)
        (out / f"{role}.head.gz").write_bytes(gzip.compress(head, 6))
        (out / f"{role}.json").write_text(json.dumps(
            {"file": path.name, "size": path.stat().st_size, "tensors": tensors}))
        log(f"{role}: {path.name}, header {start} bytes, {len(tensors)} tensors")


def synthesize(skel: Path, role: str, out_dir: Path, seed: int) -> Path:
    """A GGUF of the skeleton's structure with random weights (see the module's docstring)."""
    meta = json.loads((skel / f"{role}.json").read_text())
    head = gzip.decompress((skel / f"{role}.head.gz").read_bytes())
    rng = np.random.default_rng(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"random-{meta['file']}"
    tmp = out.with_suffix(".part")
    with tmp.open("wb") as f:
        f.write(head)
        pos = len(head)
        for t in sorted(meta["tensors"], key=lambda t: t["offset"]):
            if t["offset"] < pos:
                raise SystemExit(f"{role}: tensor {t['name']} overlaps the one before")
            f.write(b"\0" * (t["offset"] - pos))
            n = t["nbytes"]
            if t["type"] == "F32":
                vals = (np.ones(n // 4, np.float32) if t["name"].endswith("norm.weight")
                        else rng.normal(0.0, 0.02, n // 4).astype(np.float32))
                f.write(vals.tobytes())
            elif t["type"] in BLOCKS:
                size, scales = BLOCKS[t["type"]]
                if n % size:
                    raise SystemExit(f"{role}: {t['name']} is not whole {t['type']} blocks")
                blocks = np.frombuffer(rng.bytes(n), np.uint8).reshape(-1, size).copy()
                for off, value in scales:
                    blocks[:, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
                f.write(blocks.tobytes())
            else:
                raise SystemExit(f"{role}: tensor type {t['type']} ({t['name']}) has no random "
                                 f"form here; add its block layout to BLOCKS")
            pos = t["offset"] + n
        f.write(b"\0" * (meta["size"] - pos))
    tmp.replace(out)
    return out


# -- measurements ------------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a64 - b64) / np.linalg.norm(b64))


def top1(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())


def text_tokens(engine: Any, n: int) -> list[int]:
    """``n`` tokens of real text: this repository's engine sources, in order."""
    root = Path(__file__).resolve().parent.parent / "openjarvis" / "engine"
    text = "".join(p.read_text() for p in sorted(root.glob("*.py")))
    toks = engine.tokenize(text, special=False)
    if len(toks) < n:
        raise SystemExit(f"only {len(toks)} tokens of text; {n} asked")
    return list(toks[:n])


def agreement(path: Path, gpu: Any, llama: Any, n: int) -> dict[str, Any]:
    """The GPU's logits from the file against float32 on the CPU and against llama.cpp."""
    import torch

    from openjarvis.engine.torch.engine import TorchEngine

    toks = text_tokens(gpu, n)
    gpu.rollback(0)
    ours = gpu.eval(toks)
    gpu.rollback(0)
    llama.rollback(0)
    theirs = llama.eval(toks)
    llama.rollback(0)
    (cpu, load_s) = timed(lambda: TorchEngine.from_gguf(path, device="cpu", dtype=torch.float32,
                                                        context=1024, warmup=False))
    with cpu:
        exact = cpu.eval(toks)
    return {"positions": n, "cpu_float32_load_s": load_s,
            "gpu_vs_float32": {"rel_err": rel(ours, exact), "top1": top1(ours, exact)},
            "llama_vs_float32": {"rel_err": rel(theirs, exact), "top1": top1(theirs, exact)},
            "gpu_vs_llama_top1": top1(ours, theirs), "finite": bool(np.isfinite(ours).all()),
            # (random weights write few distinct tokens: top-1 agreement says little alone)
            "distinct_argmax": len(set(exact.argmax(-1).tolist()))}


def call_times(verifier: Any, gpu_drafter: Any, cpu_drafters: dict[int, Any], pos: int,
               ks: tuple[int, ...], rounds: int, reps: int, cpu_reps: int) -> dict[str, Any]:
    """Each call the speculator makes, at position ``pos``: ms (median of the rounds' medians)."""
    from bench_greedy import wall_ms  # the benchmarks' wall timer of one call

    from openjarvis.engine.base import greedy_eval

    rng = np.random.default_rng(pos)
    vocab = 150_000
    prompt = rng.integers(0, vocab, pos).tolist()
    engines = {"verifier": verifier, "gpu_drafter": gpu_drafter,
               **{f"cpu_drafter_{th}": e for th, e in cpu_drafters.items()}}
    for e in engines.values():
        if e.n_past > pos:
            e.rollback(0)
        e.eval(prompt[e.n_past:], last_only=True)
    toks = rng.integers(0, vocab, max(ks) + 1).tolist()

    def verify(k: int) -> None:
        greedy_eval(verifier, toks[:k + 1])
        verifier.rollback(pos)

    def gpu_draft(k: int) -> None:
        t = greedy_eval(gpu_drafter, toks[:1], last_only=True)[-1]
        if k > 1:
            gpu_drafter.draft_greedy(t, k - 1)
        gpu_drafter.rollback(pos)

    def cpu_draft(e: Any, k: int) -> None:
        t = toks[0]
        for _ in range(k):
            t = greedy_eval(e, [t], last_only=True)[-1]
        e.rollback(pos)

    calls: dict[str, tuple[Callable[[], object], int]] = {"verify_0": (lambda: verify(0), reps)}
    for k in ks:
        calls[f"verify_{k}"] = (lambda k=k: verify(k), reps)
        calls[f"gpu_draft_{k}"] = (lambda k=k: gpu_draft(k), reps)
        for th, e in cpu_drafters.items():
            calls[f"cpu_draft_{th}_{k}"] = (lambda e=e, k=k: cpu_draft(e, k), cpu_reps)
    for fn, _ in calls.values():  # warm every path once
        fn()
    got: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        order = list(calls.items())
        if r % 2:
            order.reverse()
        for name, (fn, n) in order:
            got[name].append(wall_ms(fn, n))
    return {name: {"ms": statistics.median(v), "rounds": v} for name, v in got.items()}


def composed(times: dict[str, Any], ks: tuple[int, ...], threads: list[int],
             accept: float) -> dict[str, Any]:
    from bench_gpu import compose

    def ms(name: str) -> float:
        return float(times[name]["ms"])

    out: dict[str, Any] = {"plain_tok_s": 1e3 / ms("verify_0")}
    kinds = {"both_on_gpu": "gpu_draft"} | {f"cpu_drafter_{th}": f"cpu_draft_{th}" for th in threads}
    for kind, prefix in kinds.items():
        rows = [compose(accept, k, ms(f"{prefix}_{k}") / k, ms(f"verify_{k}")) for k in ks]
        best = max(rows, key=lambda r: r["tok_s"])
        out[kind] = {"by_k": rows, "best": best, "vs_plain": best["tok_s"] / out["plain_tok_s"]}
    return out


def end_to_end(verifier: Any, drafters: dict[str, Any], n_tokens: int) -> dict[str, Any]:
    """The Speculator on each configuration, a real ``E2E_PROMPT``-token prompt, greedy."""
    from openjarvis.engine.drafters import ModelDrafter
    from openjarvis.engine.speculative import Request, Speculator

    prompt = text_tokens(verifier, E2E_PROMPT)
    out: dict[str, Any] = {}
    alone: list[int] | None = None
    configs: list[tuple[str, Any, str]] = [("verifier_alone", None, "none")]
    configs += [(name, e, "model") for name, e in drafters.items()]
    configs += [(f"{name}_auto", e, "auto") for name, e in drafters.items()]
    for name, engine, mode in configs:
        for e in (verifier, engine):  # (a new drafter starts from an empty engine)
            if e is not None:
                e.rollback(0)
        spec = Speculator(verifier, model_drafter=(ModelDrafter(engine, verifier=verifier)
                                                   if engine is not None else None))
        req = Request(prompt, max_tokens=n_tokens, drafter=mode, loop_repeats=0)  # type: ignore[arg-type]
        (gen, wall) = timed(lambda spec=spec, req=req: spec.generate(req).run())
        s = gen.stats
        decode_s = s.time_total - s.time_prefill
        row = {"tokens": s.tokens, "steps": s.steps, "wall_s": wall,
               "prefill_s": s.time_prefill, "decode_s": decode_s,
               "decode_tok_s": s.tokens / decode_s if decode_s > 0 else None,
               "draft_s": s.time_draft, "verify_s": s.time_verify,
               "per_drafter": {k: {"drafted": v.drafted, "accepted": v.accepted}
                               for k, v in s.per_drafter.items()}}
        if alone is None:
            alone = list(gen.tokens)
        else:
            same = next((i for i, (a, b) in enumerate(zip(alone, gen.tokens, strict=False))
                         if a != b), min(len(alone), len(gen.tokens)))
            row["same_tokens_as_alone"] = same
        out[name] = row
        log(f"end to end {name}: {row['tokens']} tokens, {row['steps']} steps, "
            f"decode {row['decode_tok_s'] or 0:.1f} tok/s, drafts {row['per_drafter']}")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from openjarvis.engine.llama import LlamaEngine, physical_cores
    from openjarvis.engine.torch.engine import TorchEngine

    gpu = args.device == "cuda"
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if gpu else "cpu",
                           "torch": torch.__version__,
                           "cpu": _cpu_name(), "physical_cores": physical_cores(),
                           "llama_lib": os.environ.get("LLAMA_CPP_LIB_PATH", "carried wheel"),
                           "accept": args.accept}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for i, role in enumerate(ROLES):
        (paths[role], res[f"{role}_write_s"]) = timed(
            lambda role=role, i=i: synthesize(Path(args.skeletons), role, work, seed=i))
        log(f"{role}: wrote {paths[role].name} in {res[f'{role}_write_s']:.1f} s")
    threads = sorted({int(t) for t in args.threads.split(",")} | ({physical_cores()}
                                                                     if args.add_physical else set()))
    ctx = max(*args.positions, E2E_PROMPT + args.tokens) + 64
    (verifier, res["verifier_gpu_load_s"]) = timed(
        lambda: TorchEngine.from_gguf(paths["verifier"], device=args.device, context=ctx))
    (gpu_drafter, res["drafter_gpu_load_s"]) = timed(
        lambda: TorchEngine.from_gguf(paths["drafter"], device=args.device, context=ctx))
    (_, res["drafter_gpu_warm_drafts_s"]) = timed(gpu_drafter.warm_drafts)
    log(f"GPU loads: verifier {res['verifier_gpu_load_s']:.1f} s, drafter "
        f"{res['drafter_gpu_load_s']:.1f} s + chains {res['drafter_gpu_warm_drafts_s']:.1f} s")
    cpu: dict[int, Any] = {}
    for th in threads:
        (cpu[th], res[f"drafter_llama_{th}_load_s"]) = timed(
            lambda th=th: LlamaEngine(paths["drafter"], context=ctx, threads=th))
    res["agreement"] = {}
    for role, gpu in (("drafter", gpu_drafter), ("verifier", verifier)):
        with LlamaEngine(paths[role], context=1024, threads=max(threads)) as llama:
            res["agreement"][role] = agreement(paths[role], gpu, llama, args.agree)
        log(f"agreement {role}: {res['agreement'][role]}")
    ks = tuple(int(k) for k in args.ks.split(","))
    res["calls"], res["composed"] = {}, {}
    for pos in args.positions:
        res["calls"][pos] = call_times(verifier, gpu_drafter, cpu, pos, ks, args.rounds,
                                       args.reps, args.cpu_reps)
        res["composed"][pos] = composed(res["calls"][pos], ks, threads, args.accept)
        c = res["composed"][pos]
        log(f"@{pos}: plain {c['plain_tok_s']:.0f} tok/s; both on the GPU "
            f"{c['both_on_gpu']['best']['tok_s']:.0f} (k = {c['both_on_gpu']['best']['k']}); "
            + "; ".join(f"llama.cpp drafter on {th} threads "
                        f"{c[f'cpu_drafter_{th}']['best']['tok_s']:.0f} "
                        f"(k = {c[f'cpu_drafter_{th}']['best']['k']})" for th in threads))
        for name, v in res["calls"][pos].items():
            log(f"  @{pos} {name}: {v['ms']:.3f} ms")
    (_, res["cost_tables_s"]) = timed(lambda: [e.cost_model() for e in (verifier, gpu_drafter,
                                                                       *cpu.values())])
    drafters = {"both_on_gpu": gpu_drafter, f"llama_drafter_{max(threads)}": cpu[max(threads)]}
    res["end_to_end"] = end_to_end(verifier, drafters, args.tokens)
    for e in (verifier, gpu_drafter, *cpu.values()):
        e.close()
    return res


def load_memory(args: argparse.Namespace) -> dict[str, Any]:
    """``load_gguf`` on the GPU (the torch engine's load, without its captures) of each file,
    decoding each tensor whole (as before session 25) and ``dequant.CHUNK`` elements at a time,
    alternating over ``--rounds``: seconds, the peak GPU memory over what was allocated before
    (MiB) and what the weights hold after; the two loads' weights compared bit for bit. Then
    the whole ``TorchEngine.from_gguf`` (its captures with the shared scratch) and what it
    holds."""
    import torch

    from openjarvis.engine.torch import dequant
    from openjarvis.engine.torch.engine import TorchEngine
    from openjarvis.engine.torch.weights import load_gguf

    mib = 2.0**20
    chunk = dequant.CHUNK
    work = Path(args.work)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "chunk": chunk}

    def measured(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        (out, s) = timed(lambda: (fn(), torch.cuda.synchronize())[0])
        return out, {"s": s, "peak_mib": (torch.cuda.max_memory_allocated() - base) / mib,
                     "held_mib": (torch.cuda.memory_allocated() - base) / mib}

    for i, role in enumerate(ROLES):
        path = synthesize(Path(args.skeletons), role, work, seed=i)
        runs: dict[str, list[dict[str, float]]] = {"whole": [], "chunked": []}
        kept: dict[str, Any] = {}
        for _ in range(args.rounds):
            for label, size in (("whole", 1 << 62), ("chunked", chunk)):
                dequant.CHUNK = size
                try:
                    (out, m) = measured(lambda path=path: load_gguf(path, torch.bfloat16, "cuda"))
                finally:
                    dequant.CHUNK = chunk
                runs[label].append(m)
                kept.setdefault(label, out[1])
                del out
        res[role] = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} | {"runs": v}
                     for k, v in runs.items()}
        res[role]["bit_identical"] = all(
            torch.equal(x, y) for x, y in zip(kept["whole"].tensors(), kept["chunked"].tensors(),
                                              strict=True))
        del kept
        (eng, m) = measured(lambda path=path: TorchEngine.from_gguf(path, device="cuda",
                                                                    context=args.context))
        res[role]["engine"] = m
        eng.close()
        del eng
        log(f"{role}: {json.dumps({k: v for k, v in res[role].items() if k != 'runs'})}")
    return res


def _cpu_name() -> str:
    from openjarvis.engine.llama import device_name

    return device_name()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sk = sub.add_parser("skeleton", help="here: write the installed pair's skeletons")
    sk.add_argument("--dir", required=True)
    rn = sub.add_parser("run", help="on the GPU host: write the files and measure")
    rn.add_argument("--skeletons", required=True)
    rn.add_argument("--out", required=True)
    rn.add_argument("--work", default="/tmp/pairbench", help="where the random GGUF files go")
    rn.add_argument("--positions", type=lambda s: [int(x) for x in s.split(",")],
                    default=[512, 4096])
    rn.add_argument("--ks", default="1,2,4,8")
    rn.add_argument("--threads", default="4,8", help="llama.cpp thread counts of the drafter")
    rn.add_argument("--add-physical", action=argparse.BooleanOptionalAction, default=True,
                    help="also the host's physical core count")
    rn.add_argument("--accept", type=float, default=0.933,
                    help="greedy acceptance a token (the real pair's, measured on the CPU)")
    rn.add_argument("--rounds", type=int, default=3)
    rn.add_argument("--reps", type=int, default=30)
    rn.add_argument("--cpu-reps", type=int, default=5)
    rn.add_argument("--agree", type=int, default=256, help="positions of the agreement check")
    rn.add_argument("--tokens", type=int, default=256, help="tokens of each end-to-end answer")
    rn.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: the torch engines in float32 on the CPU (a smoke test of this script)")
    ld = sub.add_parser("load", help="on the GPU host: the torch load's time and GPU memory")
    ld.add_argument("--skeletons", required=True)
    ld.add_argument("--out", required=True)
    ld.add_argument("--work", default="/tmp/pairbench", help="where the random GGUF files go")
    ld.add_argument("--rounds", type=int, default=3)
    ld.add_argument("--context", type=int, default=8192, help="the engine's context")
    args = p.parse_args(argv)
    if args.cmd == "skeleton":
        skeleton(Path(args.dir))
        return 0
    import torch

    if args.cmd == "run" and args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_pair_gpu.py run: no CUDA device here (run it on the GPU host, "
                         "or --device cpu for a smoke test of the script)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "load":
        if not torch.cuda.is_available():
            raise SystemExit("bench_pair_gpu.py load: no CUDA device here")
        (out / "load.json").write_text(json.dumps(load_memory(args), indent=1, default=str))
        log(f"wrote {out / 'load.json'}")
        return 0
    res = run(args)
    (out / "pair.json").write_text(json.dumps(res, indent=1, default=str))
    log(f"wrote {out / 'pair.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
