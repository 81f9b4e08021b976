"""Top-1 agreement of the torch backend (CPU, float32) with llama.cpp on the real default pair.

Issue 7's correctness item: both engines load the same GGUF file and read the same windows of real
code (this repository and, if present, ``/tmp/benchrepo``); for every position we compare the
next-token logits. They cannot agree everywhere, and this script measures how often and why:

- llama.cpp multiplies the quantized weights by activations it rounds on the fly to 8-bit blocks
  (Q8_K, 256 values and one float32 scale, for the K-quants; Q8_0, 32 values and a float16 scale,
  for Q4_0/Q5_0/Q8_0), and keeps K and V in float16 (its default cache type), so the query and
  the attention probabilities are rounded to float16 for those products too;
- ours dequantizes the same weights once to float32 (exactly the values llama.cpp decodes) and
  multiplies them by float32 activations.

To test that explanation rather than assert it, each window is evaluated five ways
(``VARIANTS``) and compared pairwise (``COMPARISONS``): llama.cpp as one batch (the reference)
and one token at a time (its other kernels: llama.cpp against itself is the noise floor); ours as
shipped (``plain``); ours with llama.cpp's activation roundings copied into the forward
(``q8``), and with its float16 attention as well (``q8+f16``). The weights and the cache are
wrapped in tensor subclasses for those runs; nothing in ``openjarvis`` changes.

Reported per model and comparison: top-1 agreement, top-5 overlap, relative logit error, the
change of the reference's top-1 minus top-2 difference, and for the main comparison llama.cpp's
top-1/top-2 logit gap at the disagreeing positions against all positions (are they near-ties?).
Figures of a run are in BENCHMARKS.md (``## GPU backend``) and docs/gpu-notes.md.

Run under the shared benchmark lock (benchmarks take it exclusively), 2 threads for both engines
(about 10 minutes for the pair on 2 cores)::

    flock -s /tmp/jarvis-bench.lock .venv/bin/python scripts/agree_torch_llama.py --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openjarvis.gguf_meta import tensor_type_names  # noqa: E402

#: The catalog's default pair, by role; each model is labelled by its size ("0.5B", "1.5B").
ROLES = ("drafter", "verifier")
#: Code read in windows, the first ``--windows`` that exist: this repository's interleaved with
#: requests 2.32.3 (its sdist unpacked in /tmp/benchrepo on the dev machine), then more of ours
#: so that a machine without /tmp/benchrepo still reads as many windows.
SOURCES = (
    ROOT / "openjarvis/engine/llama.py",
    Path("/tmp/benchrepo/requests-2.32.3/src/requests/models.py"),
    ROOT / "openjarvis/engine/speculative.py",
    Path("/tmp/benchrepo/requests-2.32.3/src/requests/sessions.py"),
    ROOT / "openjarvis/index/store.py",
    Path("/tmp/benchrepo/requests-2.32.3/src/requests/utils.py"),
    ROOT / "openjarvis/daemon/server.py",
    Path("/tmp/benchrepo/requests-2.32.3/src/requests/adapters.py"),
    ROOT / "openjarvis/daemon/handlers.py",
    ROOT / "openjarvis/index/rank.py",
    ROOT / "openjarvis/assistant/prompt.py",
    ROOT / "openjarvis/engine/torch/weights.py",
)
#: Logits computed per window besides llama.cpp's own batch: ours in each mode of ``emulating``,
#: and llama.cpp one token at a time.
VARIANTS = ("plain", "llama.cpp decode", "q8", "q8+f16")
#: Buckets of llama.cpp's top-1/top-2 logit gap for the agreement-by-gap table.
GAP_EDGES = (0.1, 0.25, 0.5, 1.0, 2.0)
T0 = time.monotonic()


def log(*a: object) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s]", *a, flush=True)


# -- comparing logits (pure) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Positions:
    """Per-position comparison of ours against a reference, arrays of shape ``[N]``."""

    agree: np.ndarray  # bool: same argmax
    top5: np.ndarray  # int: |top-5 ours ∩ top-5 reference|, 0..5
    gap: np.ndarray  # float: reference's top-1 minus top-2 logit
    pair_err: np.ndarray  # float: |change of that difference (same two tokens) in ours|
    err_sq: np.ndarray  # float: Σ (ours − reference)² over the vocabulary
    ref_sq: np.ndarray  # float: Σ reference² over the vocabulary
    first: np.ndarray  # bool: the window's first position (Qwen's attention sink: see summary)

    @staticmethod
    def concat(parts: Sequence[Positions]) -> Positions:
        return Positions(*(np.concatenate([getattr(p, f) for p in parts]) for f in Positions.__slots__))

    def __len__(self) -> int:
        return len(self.agree)

    @property
    def rel_err(self) -> float:
        """‖ours − reference‖ / ‖reference‖ over every logit of every position."""
        return float(np.sqrt(self.err_sq.sum() / self.ref_sq.sum()))

    def summary(self) -> dict[str, Any]:
        """The figures reported: agreement, overlap, error, and gaps (all vs at disagreements)."""
        q = (10, 50, 90)
        miss = ~self.agree
        out: dict[str, Any] = {
            "positions": len(self),
            "top1": float(self.agree.mean()),
            "disagree": int(miss.sum()),
            "top5_overlap": float(self.top5.mean() / 5),
            "rel_err": self.rel_err,
            # The first position carries Qwen's massive "attention sink" activations; an 8-bit
            # block holding one of them rounds its other values away, so it differs most.
            "first_rel_err": float(np.sqrt(self.err_sq[self.first].sum() / self.ref_sq[self.first].sum())),
            "first_disagree": int((miss & self.first).sum()),
            "rest_rel_err": float(np.sqrt(self.err_sq[~self.first].sum() / self.ref_sq[~self.first].sum())),
            "rest_top1": float(self.agree[~self.first].mean()),
            "gap_all_p10_p50_p90": [float(x) for x in np.percentile(self.gap, q)],
            "pair_err_p50_p90_p99": [float(x) for x in np.percentile(self.pair_err, (50, 90, 99))],
        }
        if miss.any():
            g = self.gap[miss]
            out["gap_disagree_p50_p90_max"] = [float(np.median(g)), float(np.percentile(g, 90)),
                                               float(g.max())]
            out["disagree_gap_below"] = {str(e): float((g < e).mean()) for e in GAP_EDGES}
        edges = (0.0, *GAP_EDGES, np.inf)
        out["top1_by_gap"] = {
            f"{lo:g}-{hi:g}": [float(self.agree[m].mean()), int(m.sum())]
            for lo, hi in zip(edges, edges[1:], strict=False)
            if (m := (self.gap >= lo) & (self.gap < hi)).any()
        }
        return out


def compare(ours: np.ndarray, ref: np.ndarray) -> Positions:
    """Compare logits ``[T, V]`` of ours against a reference's, position by position."""
    if ours.shape != ref.shape:
        raise ValueError(f"logit shapes differ: {ours.shape} vs {ref.shape}")
    rows = np.arange(len(ref))
    ref_top = np.argsort(ref, axis=-1)[:, -5:][:, ::-1]  # [T, 5], best first
    our_top5 = np.argpartition(ours, -5, axis=-1)[:, -5:]
    top5 = np.array([len(set(a) & set(b)) for a, b in zip(our_top5, ref_top, strict=True)])
    r1, r2 = ref_top[:, 0], ref_top[:, 1]
    gap = ref[rows, r1] - ref[rows, r2]
    pair_err = np.abs((ours[rows, r1] - ours[rows, r2]) - gap)
    d = ours.astype(np.float64) - ref
    return Positions(
        agree=ours.argmax(-1) == r1,
        top5=top5,
        gap=gap.astype(np.float64),
        pair_err=pair_err.astype(np.float64),
        err_sq=(d * d).sum(-1),
        ref_sq=(ref.astype(np.float64) ** 2).sum(-1),
        first=rows == 0,
    )


# -- emulating llama.cpp's roundings in our forward -----------------------------------------------


def _round_q8_k(x: Any) -> Any:
    """Round ``x [T, K]`` as ggml's ``quantize_row_q8_K``: blocks of 256, scale max/-127 (float32),
    the signed value of largest magnitude mapping to -127, values clamped to 127."""
    import torch

    t, k = x.shape
    xb = x.reshape(t, k // 256, 256)
    big = xb.gather(-1, xb.abs().argmax(-1, keepdim=True))  # [T, nb, 1], signed
    iscale = torch.where(big == 0, torch.zeros_like(big), -127.0 / big)
    q = torch.round(xb * iscale).clamp(max=127)
    d = torch.where(iscale == 0, torch.zeros_like(iscale), 1.0 / iscale)
    return (q * d).reshape(t, k)


def _round_q8_0(x: Any) -> Any:
    """Round ``x [T, K]`` as ggml's ``quantize_row_q8_0``: blocks of 32, scale amax/127 stored as
    float16 (the quants are computed with the unrounded scale)."""
    import torch

    t, k = x.shape
    xb = x.reshape(t, k // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    q = torch.round(xb * torch.where(d == 0, torch.zeros_like(d), 1.0 / d))
    return (q * d.half().float()).reshape(t, k)


def _round_f16(x: Any) -> Any:
    import torch

    return x.to(torch.float16).to(torch.float32)


def activation_rounding(type_name: str) -> Callable[[Any], Any] | None:
    """What llama.cpp's CPU backend does to the activations of a product with a weight of this
    GGML type (its ``vec_dot_type``); None for float32 weights (no rounding)."""
    if type_name.endswith("_K"):
        return _round_q8_k
    if type_name in ("Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1"):  # Q8_1's fp16 block sum is ignored
        return _round_q8_0
    if type_name == "F16":
        return _round_f16
    if type_name == "F32":
        return None
    raise ValueError(f"no emulation of llama.cpp's activations for {type_name} weights")


def _subclasses() -> tuple[type, type]:
    """Tensor subclasses built on first use, so ``--help`` and the pure part need no torch."""
    import torch
    import torch.nn.functional as F

    class Q8Weight(torch.Tensor):
        """A weight whose ``F.linear`` rounds its input per row segment of the weight."""

        segments: tuple[tuple[int, int, Callable[[Any], Any] | None], ...] = ()

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is not F.linear:
                return super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]
            x, w = args[0], args[1]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            with torch._C.DisableTorchFunctionSubclass():
                plain = w.as_subclass(torch.Tensor)
                outs = []
                for lo, hi, rnd in w.segments:
                    xr = x if rnd is None else rnd(x)
                    outs.append(F.linear(xr, plain[lo:hi], None if b is None else b[lo:hi]))
                return torch.cat(outs, dim=-1)

    class F16Cache(torch.Tensor):
        """K or V cache whose attention runs as llama.cpp's does with a float16 cache."""

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is not F.scaled_dot_product_attention:
                return super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]
            with torch._C.DisableTorchFunctionSubclass():
                q, k, v = (a.as_subclass(torch.Tensor) for a in args[:3])  # [H, T, hd], [Hkv, S, hd]
                mask = kwargs["attn_mask"]  # [1, T, S] bool
                g = q.shape[0] // k.shape[0]
                k = _round_f16(k).repeat_interleave(g, 0)
                v = _round_f16(v).repeat_interleave(g, 0)
                s = (_round_f16(q) @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [H, T, S]
                p = _round_f16(s.masked_fill(~mask, float("-inf")).softmax(-1))
                return p @ v  # [H, T, hd]

    return Q8Weight, F16Cache


@contextlib.contextmanager
def emulating(engine: Any, types: dict[str, str], mode: str) -> Iterator[None]:
    """Run ``engine`` (a CPU float32 TorchEngine) with llama.cpp's roundings of ``mode`` (see the
    module docstring); the original tensors are put back on exit."""
    if mode == "plain":
        yield
        return
    Q8Weight, F16Cache = _subclasses()
    a, w, cache = engine.args, engine.runner.model.weights, engine.runner.cache
    saved: list[tuple[object, str, Any]] = []

    def wrap(obj: object, attr: str, names: Sequence[str], sizes: Sequence[int]) -> None:
        t = getattr(obj, attr)
        sub = t.as_subclass(Q8Weight)
        lo, segs = 0, []
        for name, n in zip(names, sizes, strict=True):
            segs.append((lo, lo + n, activation_rounding(types[name])))
            lo += n
        sub.segments = tuple(segs)
        saved.append((obj, attr, t))
        setattr(obj, attr, sub)

    for i, lw in enumerate(w.layers):
        p = f"blk.{i}."
        wrap(lw, "wqkv", [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
             [a.q_dim, a.kv_dim, a.kv_dim])
        wrap(lw, "wo", [p + "attn_output.weight"], [a.n_embd])
        wrap(lw, "w13", [p + "ffn_gate.weight", p + "ffn_up.weight"], [a.n_ff, a.n_ff])
        wrap(lw, "w2", [p + "ffn_down.weight"], [a.n_embd])
    out_name = "output.weight" if "output.weight" in types else "token_embd.weight"
    wrap(w, "out", [out_name], [a.n_vocab])
    if mode == "q8+f16":
        for attr in ("k", "v"):
            saved.append((cache, attr, getattr(cache, attr)))
            setattr(cache, attr, getattr(cache, attr).as_subclass(F16Cache))
    try:
        yield
    finally:
        for obj, attr, t in reversed(saved):
            setattr(obj, attr, t)


# -- the run --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    label: str
    tokens: list[int]


def windows(tokenize: Callable[[str], list[int]], length: int, count: int) -> list[Window]:
    """The middle ``length`` tokens of each source long enough (code, past the module docstring)."""
    out: list[Window] = []
    for src in SOURCES:
        if len(out) == count:
            break
        if not src.is_file():
            continue
        toks = tokenize(src.read_text(encoding="utf-8"))
        if len(toks) < length:
            continue
        start = (len(toks) - length) // 2
        label = str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else src.name
        out.append(Window(f"{label}[{start}:{start + length}]", toks[start : start + length]))
    return out


#: What each comparison shows: (label, ours, reference), keys of the logits computed per window.
COMPARISONS = (
    ("torch float32 vs llama.cpp", "plain", "llama.cpp"),
    ("llama.cpp one token at a time vs llama.cpp", "llama.cpp decode", "llama.cpp"),
    ("torch q8 vs llama.cpp", "q8", "llama.cpp"),
    ("torch q8+f16 vs llama.cpp", "q8+f16", "llama.cpp"),
    ("torch q8 vs torch float32", "q8", "plain"),
    ("torch q8+f16 vs torch float32", "q8+f16", "plain"),
)


def run_model(name: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every variant's logits on every window of one model, compared as ``COMPARISONS`` says.

    "llama.cpp" evaluates each window as one batch (prompt processing: llama.cpp's matrix-matrix
    kernels); "llama.cpp decode" one token at a time (its matrix-vector kernels, the generation
    path), so the two measure llama.cpp against itself: the noise floor of any comparison."""
    import torch

    from openjarvis.engine.llama import LlamaEngine
    from openjarvis.engine.torch.engine import TorchEngine

    torch.set_num_threads(args.threads)
    t = time.monotonic()
    ours = TorchEngine.from_gguf(path, device="cpu", dtype=torch.float32, context=args.window)
    log(f"{name}: torch float32 loaded (dequantized) in {time.monotonic() - t:.0f} s")
    llama = LlamaEngine(path, context=args.window, batch=args.window, threads=args.threads)
    types = tensor_type_names(path)
    try:
        if ours.vocab_fingerprint() != llama.vocab_fingerprint():
            raise SystemExit(f"{name}: the two engines' vocabularies differ")
        wins = windows(llama.tokenize, args.window, args.windows)
        if len(wins) < args.windows:
            log(f"only {len(wins)} sources have {args.window} tokens; reading {len(wins)} windows")
        comps = [c for c in COMPARISONS if {c[1], c[2]} <= {"llama.cpp", *args.variants}]
        parts: dict[str, list[Positions]] = {c[0]: [] for c in comps}
        secs: dict[str, float] = {v: 0.0 for v in ("llama.cpp", *args.variants)}
        for wi, win in enumerate(wins, 1):
            logits: dict[str, np.ndarray] = {}
            for v in secs:
                t = time.monotonic()
                if v.startswith("llama.cpp"):
                    llama.rollback(0)
                    if v == "llama.cpp":
                        logits[v] = llama.eval(win.tokens)  # [T, V]
                    else:
                        head = win.tokens[: args.decode_tokens]  # the decode path is slow
                        logits[v] = np.concatenate([llama.eval([tok]) for tok in head])
                else:
                    ours.rollback(0)
                    with emulating(ours, types, v), torch.inference_mode():
                        logits[v] = ours.eval(win.tokens)
                secs[v] += time.monotonic() - t
            for label, a, b in comps:
                n = min(len(logits[a]), len(logits[b]))
                parts[label].append(compare(logits[a][:n], logits[b][:n]))
            done = sum(secs.values())
            eta = done / wi * (len(wins) - wi)
            top1 = parts[comps[0][0]][-1].agree.mean()
            log(f"{name} window {wi}/{len(wins)} {win.label}: "
                + ", ".join(f"{v} {secs[v] / wi:.0f} s" for v in secs)
                + f"; {comps[0][0]}: top-1 {top1:.1%}; ETA {eta / 60:.1f} min")
        res = {label: Positions.concat(parts[label]).summary() for label in parts}
        return {"windows": [w.label for w in wins], "seconds": secs, "comparisons": res}
    finally:
        llama.close()
        ours.close()


def report(name: str, r: dict[str, Any]) -> None:
    """Human-readable lines of one model's results: every comparison, gaps for the first."""
    for i, (label, s) in enumerate(r["comparisons"].items()):
        e = s["pair_err_p50_p90_p99"]
        print(f"{name} {label}: top-1 {s['top1']:.2%} ({s['disagree']} of {s['positions']} differ),"
              f" top-5 overlap {s['top5_overlap']:.2%}, relative logit error {s['rel_err']:.2e},"
              f" change of the top-1 minus top-2 difference p50/p90/p99 {e[0]:.3f}/{e[1]:.3f}/{e[2]:.3f}")
        print(f"    first position of each window: relative logit error {s['first_rel_err']:.2e},"
              f" {s['first_disagree']} disagreements; the rest: {s['rest_top1']:.2%},"
              f" {s['rest_rel_err']:.2e}")
        if i:
            continue
        g = s["gap_all_p10_p50_p90"]
        line = f"    reference's top-1/top-2 gap, all positions p10/p50/p90 {g[0]:.2f}/{g[1]:.2f}/{g[2]:.2f}"
        if "gap_disagree_p50_p90_max" in s:
            d = s["gap_disagree_p50_p90_max"]
            line += f"; at the disagreements p50/p90/max {d[0]:.3f}/{d[1]:.3f}/{d[2]:.3f}"
        print(line)
        print("    top-1 by gap: " + ", ".join(f"[{k}) {v[0]:.1%} of {v[1]}" for k, v in s["top1_by_gap"].items()))


def pair_files(models: Path | None, roles: Sequence[str]) -> dict[str, Path]:
    """The default pair's files by size label ("0.5B": ...): the catalog's verified installs, or
    the catalog's file names in ``models``."""
    from openjarvis.config import load_config
    from openjarvis.models import Catalog

    catalog = Catalog.load(load_config())
    pair = catalog.pair()
    out: dict[str, Path] = {}
    for role in roles:
        m = catalog.model(pair.drafter if role == "drafter" else pair.verifier)
        label = f"{m.parameters / 1e9:.1f}B"
        out[label] = models / m.file if models is not None else catalog.installed_path(m.id)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None,
                    help="directory holding the pair's files (default: the installed catalog's)")
    ap.add_argument("--only", choices=ROLES, action="append", help="one model (repeatable)")
    ap.add_argument("--window", type=int, default=512, help="tokens per window (one eval each)")
    ap.add_argument("--windows", type=int, default=6, help="windows per model")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"what to compute besides llama.cpp's batch, comma-separated: {VARIANTS}")
    ap.add_argument("--decode-tokens", type=int, default=128,
                    help="tokens per window that llama.cpp also evaluates one at a time")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    if bad := set(args.variants) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(bad)}")
    results: dict[str, Any] = {"window": args.window, "threads": args.threads}
    for name, path in pair_files(args.models, args.only or list(ROLES)).items():
        if not path.is_file():
            print(f"error: {path} is missing; run `jarvis models install`", file=sys.stderr)
            return 1
        results[name] = run_model(name, path, args)
        report(name, results[name])
        if args.json:
            args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
