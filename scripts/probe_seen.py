"""The wide attention with its key blocks every query row sees left unmasked, against every
block masked (``kernels.attention_wide(seen=...)``): µs a call and how far apart the outputs are.

A wide step's query block sees every key before its first token; only the blocks from there on
need the causal mask. Run 334 (docs/gpu-notes.md, "Session 38") timed both on the lent H200, the
default pair's shapes, random K/V and queries::

    python3 scripts/probe_seen.py
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    import torch
    from bench_wide import _graph_us

    from openjarvis.engine.torch import kernels as K
    from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B
    from openjarvis.engine.torch.generate import WIDE_BLOCK_S, wide_nsplit

    if not torch.cuda.is_available():
        raise SystemExit("probe_seen needs a CUDA device")
    for name, a in (("1.5B", QWEN25_1_5B), ("0.5B", QWEN25_0_5B)):
        for t, n in ((1024, 1024), (1024, 4096), (128, 4096)):
            q = torch.randn(t, a.n_head, a.head_dim, device="cuda")
            kc = torch.randn(a.n_head_kv, n + 128, a.head_dim, device="cuda").to(torch.bfloat16)
            vc = torch.randn_like(kc)
            start = torch.tensor([n - t], device="cuda")
            ns = wide_nsplit(t)
            o = torch.empty(ns, t, a.n_head, a.head_dim, device="cuda")
            ml = torch.empty(ns, t, a.n_head, 2, device="cuda")
            outs: dict[bool, torch.Tensor] = {}
            us: dict[bool, list[float]] = {}
            for seen in (False, True, False, True):  # (twice each, alternating; the best)
                out = torch.empty(t, a.q_dim, dtype=torch.bfloat16, device="cuda")
                call = functools.partial(K.attention_wide, q, kc, vc, start, out, o, ml,
                                         block_s=WIDE_BLOCK_S, seen=seen)
                us.setdefault(seen, []).append(_graph_us(call))
                outs[seen] = out.float()
            apart = float((outs[True] - outs[False]).norm() / outs[False].norm())
            masked, unmasked = min(us[False]), min(us[True])
            print(f"{name} last {t} of {n}: masked {masked:.1f} us, seen {unmasked:.1f} us "
                  f"({unmasked / masked:.3f}x); outputs apart {apart:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
