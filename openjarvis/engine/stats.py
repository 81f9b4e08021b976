"""Per-request statistics of a generation: what telemetry records and ``--stats`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class DrafterStats:
    drafted: int = 0
    accepted: int = 0
    drafts: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(slots=True)
class Stats:
    prompt_tokens: int = 0
    #: Prompt tokens already in the verifier's cache (earlier turn of the conversation).
    reused_tokens: int = 0
    #: Prompt tokens loaded from the persistent prefix cache on disk (not in ``reused_tokens``).
    prefix_loaded: int = 0
    #: Prompt tokens the model drafter loaded from its own file of the prefix cache.
    drafter_prefix_loaded: int = 0
    tokens: int = 0
    steps: int = 0
    #: Greedy near-ties re-decided with a single-token evaluation.
    tie_rechecks: int = 0
    per_drafter: dict[str, DrafterStats] = field(default_factory=dict)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0
    #: Seconds from the request to the first emitted text (None until then).
    ttft: float | None = None
    finish_reason: str = ""
    #: Sum and count of the emitted tokens' log-probabilities under the verifier.
    logprob_sum: float = 0.0
    logprob_count: int = 0

    def record(self, drafter: str, drafted: int, accepted: int) -> None:
        s = self.per_drafter.setdefault(drafter, DrafterStats())
        s.drafted += drafted
        s.accepted += accepted
        s.drafts += 1

    def add_logprob(self, logprob: float) -> None:
        self.logprob_sum += logprob
        self.logprob_count += 1

    @property
    def mean_logprob(self) -> float | None:
        """Mean natural-log probability of the emitted tokens under the verifier (None if none)."""
        return self.logprob_sum / self.logprob_count if self.logprob_count else None

    def mark_first_token(self, seconds: float) -> None:
        if self.ttft is None:
            self.ttft = seconds

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.per_drafter.values())

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.per_drafter.values())

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per draft verified."""
        drafts = sum(s.drafts for s in self.per_drafter.values())
        return self.accepted / drafts if drafts else 0.0

    @property
    def decode_seconds(self) -> float:
        return self.time_draft + self.time_verify

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: generated tokens over draft + verify time (prefill excluded)."""
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def line(self) -> str:
        """One line for stderr (``jarvis generate --stats``)."""
        parts = [
            f"tokens {self.tokens}",
            f"{self.tokens_per_second:.1f} tok/s",
            f"ttft {self.ttft or 0.0:.2f}s",
            f"prompt {self.prompt_tokens} (reused {self.reused_tokens + self.prefix_loaded})",
            f"steps {self.steps}",
        ]
        if self.drafted:
            per = ", ".join(
                f"{name} {s.accepted}/{s.drafted}" for name, s in sorted(self.per_drafter.items())
            )
            parts.append(f"accepted {self.acceptance:.0%} ({per}), mean run {self.mean_accepted:.2f}")
        parts.append(f"draft {self.time_draft:.2f}s verify {self.time_verify:.2f}s")
        parts.append(f"finish {self.finish_reason}")
        return " | ".join(parts)
