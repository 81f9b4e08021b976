"""Reading a prompt in runs (``speculative.PREFILL_CHUNK``) against one run: the prefill's speed,
and how long a cancel takes to stop a request while its prompt is being read.

The prompt is real code (this repository's own sources, as the assistant's retrieved chunks
would be), read by the verifier of the default pair through the speculator, exactly as a chat
reads it. Each round times both ways in alternating order:

- prefill: ``Stats.time_prefill`` of a generation asked for one token, from an empty cache;
- cancel: a second thread sets the cancel flag ``--cancel-at`` seconds after the generation
  starts; the latency is from that moment to the generation's return. Read in one run, the
  prompt is finished first (the flag is first polled by the first decoding step).

    python scripts/bench_prefill_runs.py --tokens 1300 --rounds 2

``--torch-gpu`` times what the runs cost the torch engine on a GPU instead (the lent device: no
GGUF travels there, so the 1.5B's shapes with random bf16 weights): ``TorchEngine.eval`` of a
prompt in runs of ``PREFILL_CHUNK``, each run's last logits row copied to the host as that
engine does, against one call; alternating rounds, CUDA-synchronised wall time.

Prints one line a measurement and a summary (medians, and the ratios one run / runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def code_prompt(engine: object, n: int) -> list[int]:
    """``n`` tokens of this repository's Python sources, file after file."""
    tokens: list[int] = []
    for path in sorted((ROOT / "openjarvis").rglob("*.py")):
        tokens += engine.tokenize(path.read_text(), special=False)  # type: ignore[attr-defined]
        if len(tokens) > n:
            return tokens[:n]
    raise SystemExit(f"only {len(tokens)} tokens of source found; ask for fewer with --tokens")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="GGUF path (default: the default pair's verifier)")
    ap.add_argument("--tokens", type=int, default=1300, help="prompt length in tokens (default 1300)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each timing both ways (default 2)")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: physical cores)")
    ap.add_argument("--cancel-at", type=float, default=3.0,
                    help="seconds into the request at which it is cancelled (default 3)")
    ap.add_argument("--torch-gpu", action="store_true",
                    help="time the torch engine's prefill on a CUDA GPU (random 1.5B weights)")
    args = ap.parse_args()
    if args.tokens < 2 or args.rounds < 1 or args.cancel_at <= 0:
        ap.error("--tokens must be at least 2, --rounds at least 1 and --cancel-at positive")
    if args.torch_gpu:
        return _torch_gpu(args.tokens, max(args.rounds, 5))

    from openjarvis.engine import speculative
    from openjarvis.engine.llama import LlamaEngine
    from openjarvis.engine.speculative import Request, Speculator

    model = Path(args.model) if args.model else _default_verifier()
    runs = speculative.PREFILL_CHUNK
    with LlamaEngine(model, threads=args.threads) as engine:
        prompt = code_prompt(engine, args.tokens)
        print(f"{model.name}: {len(prompt)}-token prompt, {engine.threads} threads, runs of {runs}",
              flush=True)
        spec = Speculator(engine)
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            order = [("runs", runs), ("one run", 10**9)]
            for name, chunk in order if r % 2 == 0 else order[::-1]:
                speculative.PREFILL_CHUNK = chunk
                try:
                    engine.rollback(0)
                    spec.cached.clear()
                    gen = spec.generate(Request(prompt, max_tokens=1, drafter="none")).run()
                    results.setdefault((name, "prefill_s"), []).append(gen.stats.time_prefill)
                    engine.rollback(0)
                    spec.cached.clear()
                    late = _cancel_latency(spec, prompt, args.cancel_at)
                    results.setdefault((name, "cancel_s"), []).append(late)
                finally:
                    speculative.PREFILL_CHUNK = runs
                print(f"round {r + 1} {name}: prefill {gen.stats.time_prefill:.2f} s"
                      f" ({(len(prompt) - 1) / gen.stats.time_prefill:.1f} tokens/s),"
                      f" stopped {late:.2f} s after the cancel", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    for what in ("prefill_s", "cancel_s"):
        one, ours = med[("one run", what)], med[("runs", what)]
        print(f"{what}: runs {ours:.2f}, one run {one:.2f}; one run / runs {one / ours:.2f}x")
    return 0


def _cancel_latency(spec: object, prompt: list[int], at: float) -> float:
    from openjarvis.engine.speculative import Request

    flag = threading.Event()
    set_at: list[float] = []

    def cancel_later() -> None:
        time.sleep(at)
        set_at.append(time.perf_counter())
        flag.set()

    threading.Thread(target=cancel_later, daemon=True).start()
    gen = spec.generate(Request(prompt, max_tokens=64, drafter="none"),  # type: ignore[attr-defined]
                        cancel=flag.is_set)
    gen.run()
    done = time.perf_counter()
    if not set_at:
        raise SystemExit(f"the request ended before the cancel at {at} s; use a longer --tokens")
    return done - set_at[0]


def _torch_gpu(n: int, rounds: int) -> int:
    import torch

    from openjarvis.engine import speculative
    from openjarvis.engine.torch.config import QWEN25_1_5B
    from openjarvis.engine.torch.generate import Runner
    from openjarvis.engine.torch.model import Transformer
    from openjarvis.engine.torch.weights import random_weights

    if not torch.cuda.is_available():
        raise SystemExit("--torch-gpu needs a CUDA device")
    a = QWEN25_1_5B
    model = Transformer(a, random_weights(a, torch.bfloat16, "cuda", seed=0), n_pos=n + 256)
    runner = Runner(model, n + 128, kernels="triton", graphs=True)
    prompt = [(i * 7919) % 30000 + 100 for i in range(n - 1)]
    runs = speculative.PREFILL_CHUNK

    def prefill(run: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for lo in range(0, len(prompt), run):  # as TorchEngine.eval, a call a run
            out = runner.logits(prompt[lo : lo + run], lo, last_only=True)
            runner.host(out[:, : a.n_vocab].float()).numpy()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for run in (runs, len(prompt)):  # capture every step size first
        prefill(run)
    got: dict[str, list[float]] = {"runs": [], "one run": []}
    for r in range(rounds):
        for name, run in [("runs", runs), ("one run", len(prompt))][:: 1 if r % 2 == 0 else -1]:
            got[name].append(prefill(run))
    med = {k: statistics.median(v) * 1e3 for k, v in got.items()}
    print(f"torch engine on {torch.cuda.get_device_name()}: {len(prompt)} prompt tokens, "
          f"1.5B shapes, random weights; runs of {runs}: {med['runs']:.2f} ms, one run "
          f"{med['one run']:.2f} ms (medians of {rounds}); runs / one run "
          f"{med['runs'] / med['one run']:.3f}x")
    return 0


def _default_verifier() -> Path:
    from openjarvis.config import load_config
    from openjarvis.models import Catalog

    catalog = Catalog.load(load_config())
    return catalog.pair_paths()[1]


if __name__ == "__main__":
    raise SystemExit(main())
