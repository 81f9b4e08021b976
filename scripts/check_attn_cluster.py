"""Cluster attention (``attn_cluster.ClusterAttention``) against a float64 reference.

For the default pair's attention shapes and several cluster shapes, at positions that put the
step's own key at a block's start, end and middle, in the first and last CTA, and past 4096:
random float32 q and bfloat16 caches, the output poisoned before each launch; prints the
relative error (bfloat16 output: ~4e-3 expected) and fails on NaN, an unwritten value or an
error over 1e-2. Also times one launch alone against the Triton split + merge pair (a CUDA
graph of 28 launches each). Needs an sm_90 GPU: ``python3 scripts/check_attn_cluster.py``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjarvis.engine.torch import kernels as K  # noqa: E402
from openjarvis.engine.torch.attn_cluster import ClusterAttention  # noqa: E402
from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B  # noqa: E402

S = 4224
POSITIONS = (0, 1, 5, 63, 64, 65, 127, 511, 512, 1000, 4095, 4100)


def reference(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, start: int) -> torch.Tensor:
    h, hd = q.shape[1], q.shape[2]
    g = h // kc.shape[0]
    keys = kc[:, : start + 1].double().repeat_interleave(g, 0)  # [H, n, hd]
    vals = vc[:, : start + 1].double().repeat_interleave(g, 0)
    sc = torch.einsum("hd,hnd->hn", q[0].double(), keys) * hd**-0.5
    return torch.einsum("hn,hnd->hd", sc.softmax(-1), vals).reshape(1, h * hd)


def graph_time(fn, reps: int = 50) -> float:  # noqa: ANN001
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(28):
            fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1000 / reps / 28  # us a launch


def main() -> int:
    if not torch.cuda.is_available():
        print("check_attn_cluster needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    res: dict[str, object] = {}
    bad = 0
    for name, a, configs in (("1.5B", QWEN25_1_5B, ((16, 2), (16, 1), (8, 2))),
                             ("0.5B", QWEN25_0_5B, ((16, 7), (16, 1), (8, 1)))):
        kc = torch.randn(a.n_head_kv, S, a.head_dim, device=dev, generator=gen).bfloat16()
        vc = torch.randn(a.n_head_kv, S, a.head_dim, device=dev, generator=gen).bfloat16()
        q = torch.randn(1, a.n_head, a.head_dim, device=dev, generator=gen)
        out = torch.empty(1, a.q_dim, dtype=torch.bfloat16, device=dev)
        for cs, hg in configs:
            key = f"{name} cs={cs} hg={hg}"
            try:
                ca = ClusterAttention(a, dev, cs=cs, hg=hg)
            except Exception as e:  # noqa: BLE001
                res[key] = {"error": str(e)[:300]}
                print(key, "error", str(e)[:300], flush=True)
                continue
            errs = {}
            for pos in POSITIONS:
                start = torch.tensor([pos], dtype=torch.int64, device=dev)
                out.fill_(float("nan"))
                ca(q, kc, vc, start, out, pdl=False)
                torch.cuda.synchronize()
                ref = reference(q, kc, vc, pos)
                got = out.double()
                err = float((got - ref).norm() / ref.norm()) if torch.isfinite(got).all() else 1e9
                errs[pos] = err
                bad += err > 1e-2
            row: dict[str, object] = {"max_rel": max(errs.values()), "rel": errs,
                                      "compiler": ca.compiler, "smem": ca.smem}
            for pos in (512, 4096):
                start = torch.tensor([pos], dtype=torch.int64, device=dev)
                row[f"us@{pos}"] = graph_time(functools.partial(ca, q, kc, vc, start, out,
                                                                 pdl=False))
            res[key] = row
            print(key, json.dumps(row), flush=True)
        nsplit, bs = {1536: (32, 64), 896: (64, 64)}[a.n_embd]
        o_part = torch.empty(nsplit, 1, a.n_head, a.head_dim, device=dev)
        ml_part = torch.empty(nsplit, 1, a.n_head, 2, device=dev)
        for pos in (512, 4096):
            start = torch.tensor([pos], dtype=torch.int64, device=dev)
            res[f"{name} triton us@{pos}"] = graph_time(functools.partial(
                K.attention, q, kc, vc, start, out, o_part, ml_part, block_s=bs))
            print(name, "triton", pos, res[f"{name} triton us@{pos}"], flush=True)
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    (out_dir / "attn_cluster.json").write_text(json.dumps(res, indent=1))
    print("FAILED" if bad else "ok", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
