"""The n-gram drafter: nearly free drafts where coding work repeats text.

It matches the last few tokens of the context against earlier text (the prompt, the answer so
far, and any corpus the caller supplies, such as the file being edited or retrieved chunks) and
proposes what followed there. No model call: a dictionary lookup per step. The longest match
wins; among equal matches the most recent. The proposal carries the match length, which the
speculator uses to price it (a 6-token match is far likelier to continue than a 2-token one).

Example::

    d = NgramDrafter(corpus=[file_tokens])
    d.reset(prompt_tokens)
    draft = d.propose(context_tokens, max_len=8)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from openjarvis.engine.drafters import Draft
from openjarvis.engine.sampling import SamplingParams

#: Match lengths tried, longest first; a 1-token match proposes too much noise to pay.
MIN_MATCH = 2
MAX_MATCH = 8
#: How far back two equal-length matches are compared to pick the better one.
EXTEND_MATCH = 64
#: Longest draft proposed (the speculator may use fewer).
MAX_DRAFT = 16


class NgramDrafter:
    """Prompt-lookup / corpus-lookup drafting over token ids."""

    name = "ngram"

    def __init__(
        self,
        corpus: Iterable[Sequence[int]] = (),
        *,
        min_match: int = MIN_MATCH,
        max_match: int = MAX_MATCH,
        max_draft: int = MAX_DRAFT,
    ) -> None:
        self.min_match = min_match
        self.max_match = max_match
        self.max_draft = max_draft
        #: Sources: index 0 is the live context, later ones the fixed corpus.
        self._sources: list[list[int]] = [[]]
        #: n-gram -> (source, index of the token that followed it), most recent wins; the live
        #: context has its own index, consulted first, so a reset keeps the corpus intact.
        self._context_index: dict[tuple[int, ...], tuple[int, int]] = {}
        self._corpus_index: dict[tuple[int, ...], tuple[int, int]] = {}
        for doc in corpus:
            self._sources.append(list(doc))
        for s in range(1, len(self._sources)):
            self._index_range(self._corpus_index, s, 0, len(self._sources[s]))

    def _index_range(
        self, index: dict[tuple[int, ...], tuple[int, int]], source: int, start: int, end: int
    ) -> None:
        """Index every n-gram ending just before position i (start <= i < end) of a source."""
        toks = self._sources[source]
        for i in range(max(start, 1), end):
            for n in range(self.min_match, self.max_match + 1):
                if i - n < 0:
                    break
                index[tuple(toks[i - n : i])] = (source, i)

    def reset(self, context: Sequence[int]) -> None:
        """Start a new request: forget the old context (keeps the corpus)."""
        self._sources[0] = []
        self._context_index = {}
        self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens to the live context."""
        ctx = self._sources[0]
        start = len(ctx)
        ctx.extend(tokens)
        self._index_range(self._context_index, 0, start, len(ctx))

    def sync(self, context: Sequence[int]) -> None:
        """Make the live context equal ``context`` (append-only fast path, else rebuild)."""
        ctx = self._sources[0]
        if len(context) >= len(ctx) and list(context[: len(ctx)]) == ctx:
            self.extend(context[len(ctx) :])
        else:
            self.reset(context)

    def propose(
        self,
        context: Sequence[int],
        max_len: int,
        params: SamplingParams | None = None,
        rng: np.random.Generator | None = None,
    ) -> Draft | None:
        """The continuation of the longest earlier match of the context's suffix, or None."""
        self.sync(context)
        max_len = min(max_len, self.max_draft)
        if max_len <= 0:
            return None
        for n in range(min(self.max_match, len(context)), self.min_match - 1, -1):
            key = tuple(context[-n:])
            hits = [h for h in (self._context_index.get(key), self._corpus_index.get(key)) if h]
            if not hits:
                continue
            # Equal n-gram matches: the one whose match extends further back wins (then recency).
            lengths = [(self._match_length(context, *h), h) for h in hits]
            ext, (source, pos) = max(lengths, key=lambda x: x[0])
            cont = self._sources[source][pos : pos + max_len]
            if cont:
                # The bucket follows how far back the match really goes: a continuation of a
                # 40-token match (copying a file out of the prompt) is far likelier to hold
                # than one of a 4-token match, and the planner's prior must say so up front,
                # or a cold start never drafts and never learns (see planner.PRIORS).
                m = max(n, ext)
                return Draft(tokens=tuple(cont), probs=None, key=match_key(m), match=m)
        return None

    def _match_length(self, context: Sequence[int], source: int, pos: int) -> int:
        """How many tokens before ``pos`` in the source equal the end of ``context`` (capped)."""
        toks = self._sources[source]
        n = 0
        while n < EXTEND_MATCH and n < pos and n < len(context) and toks[pos - 1 - n] == context[-1 - n]:
            n += 1
        return n

    def keys(self) -> list[str]:
        return sorted({match_key(n) for n in range(self.min_match, EXTEND_MATCH + 1)})


def match_key(n: int) -> str:
    """Acceptance-tracking bucket of a match of n tokens: 2, 3, 4 (4-7), 8 (8-15) or 16
    (16 and more, as far back as ``EXTEND_MATCH``)."""
    return f"ngram:{16 if n >= 16 else 8 if n >= 8 else 4 if n >= 4 else n}"
