"""The GPU backend: Qwen2 in PyTorch + Triton, weights read from the same GGUF files as llama.cpp.

Importing this package needs neither torch nor a GPU; the modules below it import torch. Layout
(gpt-fast's shape):

    config.py   ModelArgs: the shape of a model, read from GGUF metadata, with derived fields
    weights.py  GGUF tensors -> dequantized, packed torch tensors (fused QKV, gate/up)
    cache.py    the static KV cache; rollback is a position reset
    model.py    Qwen2 forward in plain torch ops (the reference path; float32 CPU tests)
    kernels.py  Triton kernels for the bs=1 path (GEMV+RMSNorm, RoPE+KV write, split attention)
    tuning.py   tiles measured on the H200 for the default pair's shapes
    generate.py Runner: one forward per token count, captured once as a CUDA graph per count
    engine.py   TorchEngine, the Engine Protocol over a Runner

Example::

    from openjarvis.engine.torch import load_engine
    engine = load_engine(path, device="cuda")
    logits = engine.eval(engine.tokenize("def f():"))   # float32 [len, n_vocab]
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openjarvis.engine.torch.engine import TorchEngine

__all__ = ["load_engine", "require_torch", "torch_available"]


def torch_available() -> bool:
    """True when the ``gpu`` extra (torch) is importable; says nothing about CUDA."""
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as absent
        return False


def require_torch() -> None:
    """Raise the one-line EngineError a user sees when the torch backend lacks its extra."""
    from openjarvis.errors import EngineError

    if not torch_available():
        raise EngineError(
            "the torch backend needs the gpu extra; run `pip install 'openjarvis[gpu]'` "
            "or set engine.backend = \"llama\""
        )


def load_engine(path: str | Path, **kwargs: object) -> TorchEngine:
    """Load a GGUF file into a :class:`TorchEngine`; raises EngineError without the gpu extra."""
    require_torch()
    from openjarvis.engine.torch.engine import TorchEngine

    return TorchEngine.from_gguf(path, **kwargs)  # type: ignore[arg-type]
