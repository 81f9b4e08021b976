"""Open a verifier and, when it can pay, a model drafter, as one ready :class:`Speculator`.

Shared by ``jarvis generate`` and the daemon. With ``drafter="auto"`` the drafter model is loaded
only if the measured costs (cached from an earlier run) leave it any chance of paying; on a CPU
where verifying k tokens costs nearly k steps it never can, and loading 0.5 GB for nothing would
only slow the start. Without cached costs it is loaded, measured once, and judged from then on.

Example::

    spec = open_speculator(config, verifier_path=v, drafter_path=d, drafter="auto")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openjarvis.config import Config
from openjarvis.engine import costs
from openjarvis.engine.drafters import ModelDrafter
from openjarvis.engine.llama import LlamaEngine, cost_key_for
from openjarvis.engine.planner import Option, choose
from openjarvis.engine.prefix_cache import PrefixCache
from openjarvis.engine.speculative import DrafterChoice, Speculator

#: Acceptance assumed when asking whether a drafter could pay at all (a very good drafter).
OPTIMISTIC_ACCEPTANCE = 0.9


def drafter_can_pay(verifier_key: str, drafter_key: str) -> bool | None:
    """Whether a model drafter could beat plain decoding here; None if costs are not measured."""
    v = costs.cached(verifier_key)
    d = costs.cached(drafter_key)
    if v is None or d is None:
        return None
    option = Option("model", 16, per_token=d.step())
    return choose(v, [option], {"model": OPTIMISTIC_ACCEPTANCE}).key is not None


def open_speculator(
    config: Config,
    *,
    verifier_path: Path,
    drafter_path: Path | None,
    drafter: DrafterChoice = "auto",
    prefix_cache: bool | None = None,
) -> Speculator:
    """Load the engines for one generation setup; the caller closes ``spec.verifier`` etc.

    ``prefix_cache`` (default ``engine.prefix_cache``) attaches the persistent prefix cache,
    shared by the verifier and the model drafter (each in files keyed by its own model).
    """
    if prefix_cache is None:
        prefix_cache = config.engine.prefix_cache
    ec = config.engine
    load_drafter = drafter_path is not None and drafter in ("auto", "model")
    # The cached costs are llama.cpp's; a GPU backend is measured once loaded, where verifying is cheap.
    if (load_drafter and drafter == "auto" and drafter_path is not None and ec.backend == "llama"
            and drafter_backend(config) == "llama"):
        pays = drafter_can_pay(
            cost_key_for(verifier_path, ec.threads, ec.flash_attn),
            cost_key_for(drafter_path, ec.threads, ec.flash_attn),
        )
        load_drafter = pays is not False
    verifier = open_engine(verifier_path, config)
    model_drafter = None
    if load_drafter and drafter_path is not None:
        try:
            model_drafter = open_model_drafter(drafter_path, config, verifier)
        except BaseException:
            verifier.close()
            raise
    return Speculator(
        verifier,
        model_drafter=model_drafter,
        prefix_cache=PrefixCache() if prefix_cache else None,
    )


def open_model_drafter(path: Path, config: Config, verifier: Any) -> ModelDrafter:
    """The drafter model on ``engine.drafter_backend`` (default: the verifier's backend),
    checked to share the verifier's tokenizer. Also for a request that asks for the model
    drafter where ``open_speculator`` did not load it (``Speculator.model_drafter`` is None)."""
    return ModelDrafter(open_engine(path, config, backend=drafter_backend(config)), verifier=verifier)


def drafter_backend(config: Config) -> str:
    """The backend the drafter model runs on: ``engine.drafter_backend``, "same" meaning the
    verifier's ``engine.backend``."""
    ec = config.engine
    return ec.backend if ec.drafter_backend == "same" else ec.drafter_backend


def open_engine(path: Path, config: Config, backend: str | None = None) -> Any:
    """The engine ``backend`` (default ``engine.backend``) names: llama.cpp, or the torch
    backend (the ``gpu`` extra). A drafter may name another than its verifier's
    (``engine.drafter_backend``): the issue's heterogeneous case, llama.cpp's drafter on the CPU
    beside the torch verifier on the GPU."""
    if (backend or config.engine.backend) == "torch":
        from openjarvis.engine.torch import require_torch

        require_torch()
        from openjarvis.engine.torch.engine import TorchEngine

        return TorchEngine.from_config(path, config.engine)
    return LlamaEngine.from_config(path, config.engine)


def close_speculator(spec: Speculator) -> None:
    engines = [spec.verifier] + ([spec.model_drafter.engine] if spec.model_drafter is not None else [])
    for engine in engines:
        close = getattr(engine, "close", None)  # every engine we build has one
        if close is not None:
            close()
