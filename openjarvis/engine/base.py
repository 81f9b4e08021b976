"""The engine interface: the few things speculation needs from a model, and nothing else.

Like httpx's transport, an Engine is deliberately narrow: it tokenizes, evaluates a run of tokens
appended to its KV cache and returns their logits, rolls the cache back, and saves/loads the cache.
Prompts, chat templates, sampling, stop strings, drafting and streaming live above it, once.

Shapes: ``eval`` returns float32 logits ``[len(tokens), n_vocab]``: row i is the distribution of
the token that follows ``tokens[i]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Measured seconds for evaluating k tokens at once, k -> seconds (k = 1 is one decode step).

    Measured once per (model, device, threads) and cached; the speculator interpolates between
    the measured k to price a draft of any length.
    """

    key: str
    seconds: dict[int, float] = field(default_factory=dict)

    def step(self) -> float:
        return self.seconds[1]

    def verify(self, k: int) -> float:
        """Seconds to evaluate k tokens in one call, linearly interpolated between measured k."""
        if k in self.seconds:
            return self.seconds[k]
        ks = sorted(self.seconds)
        if k <= ks[0]:
            return self.seconds[ks[0]] * k / ks[0]
        for lo, hi in zip(ks, ks[1:], strict=False):
            if lo < k < hi:
                w = (k - lo) / (hi - lo)
                return self.seconds[lo] * (1 - w) + self.seconds[hi] * w
        last, prev = ks[-1], ks[-2] if len(ks) > 1 else 0
        slope = (self.seconds[last] - (self.seconds[prev] if prev else 0.0)) / (last - prev)
        return self.seconds[last] + slope * (k - last)


@runtime_checkable
class Engine(Protocol):
    """One loaded model with one KV cache (one sequence)."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_past(self) -> int:
        """Tokens currently held in the KV cache."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def vocab_fingerprint(self) -> str:
        """A hash of the tokenizer (tokens, merges, types, special ids); equal means pairable."""
        ...

    def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """Bytes, not str: a token can end inside a UTF-8 character."""
        ...

    def eval(self, tokens: Sequence[int], *, last_only: bool = False) -> Logits:
        """Append ``tokens`` to the cache and return their logits ``[len(tokens), n_vocab]``.

        ``last_only=True`` returns only the last row, ``[1, n_vocab]``: prefill needs no more,
        and with a 150k-token vocabulary every extra row costs an output projection and 600 kB.
        """
        ...

    def rollback(self, n: int) -> None:
        """Keep only the first ``n`` tokens of the cache (exact: later evals see nothing else)."""
        ...

    def save_state(self) -> bytes: ...

    def load_state(self, state: bytes) -> None: ...

    def cost_model(self) -> CostModel: ...


def greedy_eval(engine: Engine, tokens: Sequence[int], *, last_only: bool = False) -> list[int]:
    """``eval`` for a greedy decision: each row's argmax (ties to the lowest id), or only the
    last row's with ``last_only``. An engine with ``eval_argmax`` (the torch engine) computes
    them without handing over its logits: on a GPU, for a 9-token verify, 5.5 MB a step not
    written nor copied to the host. Others take the argmax of ``eval``'s rows."""
    fast = getattr(engine, "eval_argmax", None)
    if fast is not None:
        return list(fast(tokens, last_only=last_only))
    return [int(np.argmax(row)) for row in engine.eval(tokens, last_only=last_only)]
