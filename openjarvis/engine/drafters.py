"""Drafters propose tokens for the verifier to check; one interface, several kinds.

A drafter sees the committed context (prompt + accepted tokens) and proposes up to ``max_len``
tokens. It returns the distribution each token was drawn from (``probs``), or None for a
deterministic proposal; the speculator's accept/reject rule needs it to keep sampling exact.

- :class:`ModelDrafter`: a smaller model of the same vocabulary, its own KV cache kept in step
  with the committed context and rolled back past rejected drafts.
- :class:`~openjarvis.engine.ngram.NgramDrafter`: lookup in the prompt, the answer so far and a
  caller-supplied corpus; costs no model call.

More can be added (the GPU backend brings its own); the speculator needs only this Protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from openjarvis.engine.base import CostModel, Engine, Logits, greedy_eval
from openjarvis.engine.prefix_cache import (
    PrefixCache,
    common_prefix,
    eval_head,
    eval_runs,
    restore_head,
    run_of,
)
from openjarvis.engine.sampling import Probs, SamplingParams, distribution, sample
from openjarvis.errors import IncompatiblePair


@dataclass(frozen=True, slots=True)
class Draft:
    """Proposed tokens; ``probs[i]`` is the distribution ``tokens[i]`` was drawn from."""

    tokens: tuple[int, ...]
    probs: tuple[Probs, ...] | None
    #: Acceptance is tracked per key (``"model"``, ``"ngram:3"``...): drafts of one key behave alike.
    key: str
    #: For lookup drafters, the length of the context suffix that matched.
    match: int = 0


class Drafter(Protocol):
    name: str

    def propose(
        self,
        context: Sequence[int],
        max_len: int,
        params: SamplingParams | None = None,
        rng: np.random.Generator | None = None,
    ) -> Draft | None: ...

    def keys(self) -> list[str]:
        """The acceptance-tracking keys this drafter's drafts can carry."""
        ...


class ModelDrafter:
    """Drafts by decoding a smaller model one token at a time.

    Its cache mirrors ``cached`` (the tokens it has evaluated); each proposal first rolls back to
    the longest prefix it shares with the committed context, then evaluates only what is new.

    The request's stable head (``use_head``) gets the verifier's treatment, in this model's own
    file of the persistent prefix cache: loaded at prefill when a saved state exists (a cheap
    disk read, and the planner then prices catching up without the head), else evaluated as a
    run of its own from position 0 the first time the drafter catches up, and saved then.
    Evaluating is lazy: a drafter the planner never picks computes nothing.
    """

    name = "model"

    def __init__(self, engine: Engine, *, verifier: Engine | None = None) -> None:
        if verifier is not None and engine.vocab_fingerprint() != verifier.vocab_fingerprint():
            raise IncompatiblePair(
                "the drafter's tokenizer differs from the verifier's, so its token ids mean other"
                " text; pick a drafter of the same model family"
            )
        self.engine = engine
        warm = getattr(engine, "warm_drafts", None)  # (the torch engine: its draft graphs)
        if warm is not None:
            warm()
        self.cached: list[int] = []
        #: The current request's stable head, and where to save its state once evaluated.
        self._head: list[int] = []
        self._prefix_cache: PrefixCache | None = None

    def keys(self) -> list[str]:
        return ["model"]

    def cost_model(self) -> CostModel:
        return self.engine.cost_model()

    def missing(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` this drafter would have to evaluate before drafting."""
        return len(context) - common_prefix(self.cached, context)

    def use_head(self, head: Sequence[int], prefix_cache: PrefixCache | None) -> int:
        """Take ``head`` as the stable prefix of the coming contexts; tokens loaded from disk.

        Loads the head's saved state only if the cache does not already hold it (an earlier turn
        of the conversation); otherwise ``sync`` evaluates and saves it when it first needs it.
        """
        self._head = list(head)
        self._prefix_cache = prefix_cache
        if not head or prefix_cache is None or common_prefix(self.cached, head) >= len(head):
            return 0
        self._resync()
        return len(head) if restore_head(prefix_cache, self.engine, self.cached, self._head) else 0

    def _resync(self) -> None:
        """After an interrupted step the cache may not be what ``cached`` says: start over."""
        if len(self.cached) != self.engine.n_past:
            self.engine.rollback(0)
            self.cached.clear()

    def sync(self, context: Sequence[int]) -> Logits:
        """Bring the cache to ``context`` and return the logits row for the next token."""
        keep = self._catch_up(context)
        rows = self.engine.eval(context[keep:], last_only=True)
        self.cached.extend(context[keep:])
        return np.asarray(rows[-1], dtype=np.float32)

    def sync_greedy(self, context: Sequence[int]) -> int:
        """``sync`` for a greedy draft: only the next token's argmax (``greedy_eval``)."""
        keep = self._catch_up(context)
        tok = greedy_eval(self.engine, context[keep:], last_only=True)[-1]
        self.cached.extend(context[keep:])
        return tok

    def _catch_up(self, context: Sequence[int]) -> int:
        """``catch_up`` without a stop: how much of ``context`` the cache then holds (the rest
        the draft evaluates in one call, for its first row)."""
        self.catch_up(context, run_of(self.engine), lambda _n: True)
        return len(self.cached)

    def catch_up(self, context: Sequence[int], run: int, tick: Callable[[int], bool]) -> bool:
        """Roll the cache back to what it shares with ``context``, then read the whole runs of
        ``run`` tokens it lacks (the stable head first, as a run of its own from position 0,
        saved once whole), with ``tick(n)`` after each: a False from ``tick`` stops there, what
        was read staying cached. Less than a run is left with the last token for the draft's
        own first evaluation, so a draft that lacks a few tokens still makes one call. Argmaxes
        only (``greedy_eval``): no logits row is handed over. Returns whether ``tick`` never
        said stop."""
        if not context:
            return True
        self._resync()
        keep = min(common_prefix(self.cached, context), len(context) - 1)
        self.engine.rollback(keep)
        del self.cached[keep:]
        h = len(self._head)
        if keep < h < len(context) and list(context[:h]) == self._head:
            if not eval_head(self.engine, self.cached, context, keep, h, self._prefix_cache,
                             run=run, tick=tick, argmax=True):
                return False
            keep = h
        end = len(context) - 1
        end -= (end - keep) % run
        return eval_runs(self.engine, self.cached, context, keep, end, run, tick, argmax=True)

    def propose(
        self,
        context: Sequence[int],
        max_len: int,
        params: SamplingParams | None = None,
        rng: np.random.Generator | None = None,
    ) -> Draft | None:
        if max_len <= 0 or not context:
            return None
        params = params or SamplingParams()
        if params.greedy:
            return self._propose_greedy(context, max_len)
        row = self.sync(context)
        tokens: list[int] = []
        probs: list[Probs] = []
        assert rng is not None, "sampling needs a random generator"
        for i in range(max_len):
            p = distribution(row, params)
            tok = sample(p, rng)
            probs.append(p)
            tokens.append(tok)
            if tok in self.engine.eos_token_ids or i == max_len - 1:
                break
            row = self.engine.eval([tok])[-1]
            self.cached.append(tok)
        return Draft(tokens=tuple(tokens), probs=tuple(probs), key="model")

    def _propose_greedy(self, context: Sequence[int], max_len: int) -> Draft:
        """Greedy drafts from each step's argmax alone: an engine with ``eval_argmax`` never
        hands over a logits row (``greedy_eval``), and one with ``draft_greedy`` (the torch
        engine) drafts every token after the first in one call, one GPU graph."""
        tok = self.sync_greedy(context)
        tokens = [tok]
        eos = self.engine.eos_token_ids
        chain = getattr(self.engine, "draft_greedy", None)
        # (a chain always runs its n steps, past an end of text too: never past the context)
        n = min(max_len - 1, self.engine.n_ctx - self.engine.n_past)
        if chain is not None and tok not in eos and n >= 1:
            more: list[int] = list(chain(tok, n))
            self.cached.extend([tok, *more[:-1]])  # what the engine evaluated
            for t in more:  # an end of text ends the draft; what it drafted past that goes
                tokens.append(t)
                if t in eos:
                    break
            return Draft(tokens=tuple(tokens), probs=None, key="model")
        while tok not in eos and len(tokens) < max_len:
            tok = greedy_eval(self.engine, [tok])[-1]
            self.cached.append(tokens[-1])
            tokens.append(tok)
        return Draft(tokens=tuple(tokens), probs=None, key="model")
