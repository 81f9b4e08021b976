"""Which of a step's global loads carry an L2 eviction hint, read from the PTX this Triton built.

Every weight load asks for ``evict_first`` (``tuning.WEIGHT_EVICT``): a step reads each weight
once, and lines it will not read again should leave L2 before those it will (the K/V cache,
the residual, norms and biases). A load that Triton pipelines into shared memory becomes a
``cp.async``, and whether the hint survives that lowering depends on the Triton version: the
PTX says. For every kernel this module compiled while one greedy step of each kind ran
(plain and screened, the 1.5B's or the 0.5B's shapes, random weights): how many ``ld.global``
and ``cp.async`` instructions carry ``L2::cache_hint`` and how many do not.

    python3 scripts/ptx_hints.py --model 0.5B
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: An L2 hint: a policy operand (``L2::cache_hint``, what Triton emits for an eviction policy)
#: or a direct eviction-priority qualifier (``L2::evict_first`` and its kin).
_HINT = r"\S*L2::(?:cache_hint|evict_)"
#: The forms counted (bulk ``cp.async.bulk`` copies are not: Triton 3.6 and 3.9 emit none here).
FORMS = {
    "ld_hint": re.compile(r"\bld\.global" + _HINT),
    "ld_plain": re.compile(r"\bld\.global(?!" + _HINT + ")"),
    "cp_async_hint": re.compile(r"\bcp\.async\.c[ag]" + _HINT),
    "cp_async_plain": re.compile(r"\bcp\.async\.c[ag](?!" + _HINT + ")"),
}


def count_forms(ptx: str) -> dict[str, int]:
    """Global loads in ``ptx`` by form: ``ld.global`` and ``cp.async`` (the pipelined loads
    into shared memory), each with or without an ``L2::cache_hint`` (an eviction policy)."""
    return {name: len(rx.findall(ptx)) for name, rx in FORMS.items()}


def compiled_kernels() -> dict[str, dict[str, int]]:
    """Each compiled specialization of ``kernels``' Triton functions: its load forms."""
    from openjarvis.engine.torch import kernels as K

    out: dict[str, dict[str, int]] = {}
    seen: dict[str, int] = {}
    for name, ck in K.compiled_kernels():
        i = seen[name] = seen.get(name, -1) + 1
        out[f"{name}#{i}"] = count_forms(ck.asm["ptx"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("0.5B", "1.5B"), default="0.5B")
    ap.add_argument("--out", type=Path, default=None, help="write hints.json here")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("ptx_hints: needs a CUDA GPU (the kernels compile for the one present)",
              file=sys.stderr)
        return 2
    import triton

    from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B
    from openjarvis.engine.torch.generate import Runner
    from openjarvis.engine.torch.model import Transformer
    from openjarvis.engine.torch.weights import random_weights

    a = {"0.5B": QWEN25_0_5B, "1.5B": QWEN25_1_5B}[args.model]
    model = Transformer(a, random_weights(a, torch.bfloat16, "cuda", seed=0), n_pos=640)
    for screened in (False, True):
        r = Runner(model, 576, kernels="triton", graphs=True)
        r.screen_out = screened
        r.step([100], 512, greedy=True)
    torch.cuda.synchronize()
    res: dict[str, Any] = {"triton": triton.__version__, "kernels": compiled_kernels()}
    for name, forms in res["kernels"].items():
        print(f"{name:40s} " + " ".join(f"{k} {v:4d}" for k, v in forms.items()))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "hints.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
