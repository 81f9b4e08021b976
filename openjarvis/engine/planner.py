"""The speculator's per-step choice, pure: which drafter and how many tokens (zero included).

Each step either decodes one token plainly (cost: one verifier step) or drafts k tokens and
verifies them in one verifier call over k+1 tokens. With a per-token acceptance probability
``a`` (tracked per drafter), a draft of k yields on average ``1 + a + a^2 + ... + a^k`` tokens
(the accepted run plus the verifier's own next token). The choice maximises expected tokens per
second::

    rate(k) = (1 + sum_{i=1..k} a^i) / (draft_cost(k) + verify(k + 1) + overhead)

and drafting is chosen only if it beats plain decoding by ``MIN_GAIN``, so a bad cost or
acceptance estimate costs little. Example (a CPU where verify(4) = 2 steps, a model drafter
at 0.55 of a step, a = 0.8) -> plain decoding; the same drafter on a GPU where verify(9) = 1.2
steps -> k of about 6.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openjarvis.engine.base import CostModel

#: Relative gain a draft must promise over plain decoding before it is used: a margin for what
#: the cost model misses (per-step overhead, cost growth at long positions).
MIN_GAIN = 0.06
#: Python bookkeeping per verification step, seconds (logits copy, argmax, stop checks).
STEP_OVERHEAD_S = 0.0003
#: Acceptance prior per drafter kind: (acceptance, pseudo-count).
PRIORS: dict[str, tuple[float, float]] = {
    "model": (0.7, 4.0),
    "ngram:2": (0.35, 4.0),
    "ngram:3": (0.5, 4.0),
    "ngram:4": (0.6, 4.0),
    "ngram:8": (0.8, 4.0),
    # A match reaching 16+ tokens back is text being copied (an edit returning a file): the
    # prior must clear the gain threshold on its own even where verify costs are measured
    # high, or ``auto`` never tries it and never learns (session 2: 0.99x on the copy-heavy
    # edit with verify(4) measured at 3.0 steps; 2.3x when drafted).
    "ngram:16": (0.9, 4.0),
}
DEFAULT_PRIOR = (0.5, 4.0)
#: Each step multiplies past evidence by this, so acceptance follows the text (copying, then
#: writing new code) and an unused drafter drifts back to its prior and is tried again.
DECAY = 0.98


@dataclass(frozen=True, slots=True)
class Option:
    """One drafter available this step."""

    key: str
    #: Longest draft it can give now (an n-gram continuation may be short).
    max_len: int
    #: Seconds to draft k tokens = fixed + per_token * k.
    per_token: float = 0.0
    fixed: float = 0.0


@dataclass(frozen=True, slots=True)
class Plan:
    key: str | None
    k: int
    rate: float
    plain_rate: float


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens emitted by verifying a draft of k at per-token acceptance ``alpha``."""
    return 1.0 + sum(alpha**i for i in range(1, k + 1))


def choose(
    verifier: CostModel,
    options: list[Option],
    acceptance: dict[str, float],
    *,
    overhead: float = STEP_OVERHEAD_S,
    min_gain: float = MIN_GAIN,
) -> Plan:
    """The best (drafter key, k) for this step; ``key=None, k=0`` is plain decoding."""
    plain = 1.0 / (verifier.step() + overhead)
    best = Plan(None, 0, plain, plain)
    for opt in options:
        a = acceptance.get(opt.key, PRIORS.get(opt.key, DEFAULT_PRIOR)[0])
        for k in range(1, opt.max_len + 1):
            t = opt.fixed + opt.per_token * k + verifier.verify(k + 1) + overhead
            rate = expected_tokens(a, k) / t
            if rate > best.rate and rate > plain * (1.0 + min_gain):
                best = Plan(opt.key, k, rate, plain)
    return best


@dataclass(slots=True)
class Acceptance:
    """Per-key acceptance estimates: decayed counts of accepted and rejected draft tokens."""

    accepted: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, float] = field(default_factory=dict)

    def record(self, key: str, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens of which the first ``accepted`` were accepted."""
        self.accepted[key] = self.accepted.get(key, 0.0) + accepted
        if accepted < drafted:
            self.rejected[key] = self.rejected.get(key, 0.0) + 1.0

    def decay(self) -> None:
        for table in (self.accepted, self.rejected):
            for key in table:
                table[key] *= DECAY

    def estimate(self, key: str) -> float:
        """Posterior mean of the per-token acceptance (geometric model, Beta prior)."""
        prior, weight = PRIORS.get(key, DEFAULT_PRIOR)
        acc = self.accepted.get(key, 0.0) + prior * weight
        rej = self.rejected.get(key, 0.0) + (1.0 - prior) * weight
        return acc / (acc + rej)

    def table(self, keys: list[str]) -> dict[str, float]:
        return {k: self.estimate(k) for k in keys}
