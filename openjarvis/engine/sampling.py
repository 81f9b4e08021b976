"""Sampling math, pure: logits -> distribution, and the speculative accept/reject rule.

The speculative rule (Leviathan et al. 2023, Chen et al. 2023): a draft token ``x`` drawn from the
drafter's distribution ``q`` is accepted with probability ``min(1, p(x) / q(x))`` where ``p`` is
the verifier's distribution; on rejection the replacement is drawn from ``norm(max(0, p - q))``.
The emitted token is then distributed exactly as ``p``, whatever ``q`` is. A deterministic
drafter (n-gram lookup) is the special case ``q = one_hot(x)``: accept with probability ``p(x)``,
else draw from ``p`` with ``x`` removed.

Shapes: a logits row is ``[n_vocab]`` float32; distributions are float64 ``[n_vocab]`` summing to 1.

Example::

    p = distribution(row, SamplingParams(temperature=0.7, top_k=40))
    token = sample(p, rng)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Probs = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a token is chosen from logits; ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def greedy(row: npt.NDArray[np.float32]) -> int:
    """The argmax token; ties go to the lowest id, as llama.cpp's greedy sampler does."""
    return int(np.argmax(row))


def top2_gap(row: npt.NDArray[np.float32]) -> float:
    """Logit difference between the best and the second-best token (small = a near-tie)."""
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def distribution(row: npt.NDArray[np.float32], params: SamplingParams) -> Probs:
    """The distribution a token is sampled from: temperature, then top-k, then top-p.

    Greedy params give the one-hot of the argmax, so the accept/reject rule covers both cases.
    """
    n = row.shape[0]
    if params.greedy:
        out = np.zeros(n, dtype=np.float64)
        out[greedy(row)] = 1.0
        return out
    z = row.astype(np.float64) / params.temperature
    if 0 < params.top_k < n:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z >= kth, z, -np.inf)
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = int(np.searchsorted(cum, params.top_p, side="left")) + 1
        mask = np.zeros(n, dtype=bool)
        mask[order[:keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


def sample(p: Probs, rng: np.random.Generator) -> int:
    """Draw one token id from ``p`` (inverse CDF; robust to rounding in the last bucket)."""
    cum = np.cumsum(p)
    u = rng.random() * cum[-1]
    return int(min(np.searchsorted(cum, u, side="right"), p.shape[0] - 1))


def accept_draft(
    p: Probs, q: Probs | None, token: int, rng: np.random.Generator
) -> tuple[bool, int | None]:
    """Speculative sampling for one draft ``token``: (accepted, replacement if rejected).

    ``q`` is the drafter's distribution the token was drawn from; None means a deterministic
    proposal (``q`` is one-hot at ``token``).
    """
    q_x = 1.0 if q is None else float(q[token])
    p_x = float(p[token])
    if q_x > 0.0 and rng.random() * q_x < p_x:
        return True, None
    residual = p.copy()
    if q is None:
        residual[token] = 0.0
    else:
        residual = np.maximum(residual - q, 0.0)
    total = residual.sum()
    if total <= 0.0:
        # p <= q everywhere means p == q; rejection then has probability 0, rounding aside.
        return True, None
    return False, sample(residual / total, rng)
