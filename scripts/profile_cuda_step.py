"""Three eager launches of the CUDA one-token step (1.5B shapes, random weights, position 512),
for ``ncu``: ``ncu --clock-control none -k decode_step -s 2 -c 1 python3 scripts/profile_cuda_step.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjarvis.engine.torch.config import QWEN25_0_5B, QWEN25_1_5B  # noqa: E402
from openjarvis.engine.torch.generate import Runner  # noqa: E402
from openjarvis.engine.torch.model import Transformer  # noqa: E402
from openjarvis.engine.torch.weights import random_weights  # noqa: E402

a = QWEN25_0_5B if "0.5B" in sys.argv else QWEN25_1_5B
w = random_weights(a, torch.bfloat16, "cuda", seed=0)
r = Runner(Transformer(a, w, n_pos=1024), 960, kernels="triton", graphs=False)
r.use_cuda_step()
for _ in range(3):
    r.step([100], 512)
torch.cuda.synchronize()
print("ok", float(r._steps[1].logits.float().abs().mean()))
