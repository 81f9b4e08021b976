"""Local or not: the router's decision as one pure function of the request, the policy and signals.

``route(request, policy, signals) -> Decision`` reads no files, opens no sockets and looks at no
clock, so every rule below is a row in a table-driven test. The daemon gathers the inputs (the
prompt's token count, today's spend from the audit log, the local answer's statistics) and acts
on the decision.

When a request may leave the local engine (the *triggers*, checked in this order):

1. ``asked``: the person asked for it (``/cloud`` in a chat, ``--cloud`` on the command line);
   asking counts as consent, so ``cloud = "ask"`` does not ask again. The opposite request,
   ``local_only`` (``/local``), keeps everything here whatever fires.
2. ``local-failed``: the local engine raised (model missing, out of memory, a crash).
3. ``context``: the prompt plus a minimal answer (:data:`MIN_ANSWER_TOKENS`) does not fit the
   local model's context.
4. ``low-confidence``: a local answer was generated and the model itself was unsure of it.

The confidence signal is the **mean token log-probability** of the local answer under the
verifier (the larger model). Speculative decoding computes the verifier's distribution for every
emitted token anyway, so it costs nothing, and it measures what we care about: how surprised the
model is by its own answer. It is judged only on answers of at least
:data:`MIN_TOKENS_FOR_CONFIDENCE` tokens, because the mean of a handful of log-probs is noise. The
speculative **acceptance rate** (drafted tokens the verifier kept) is a second, optional signal
(``router.min_acceptance``, off by default): it measures how far the answer is from what the small
drafter expects, which tracks difficulty only loosely; verbatim copying from the prompt drives it
up and terse unusual identifiers drive it down regardless of correctness.

Where it may go (*gates*, each target checked in preference order: the one named with ``/cloud
NAME``, else ``router.target``, else file order):

- offline mode and ``never_leave`` admit only targets on this machine (loopback addresses);
- ``router.cloud = "never"`` admits only the person's own engines (``local = true`` or loopback);
  ``"ask"`` admits the others but the decision ``needs_confirmation`` unless the person asked;
- a target with a known context must hold the prompt too;
- a paid target must keep today's spend, plus this request's worst case (the whole prompt and
  ``max_tokens`` of answer at its prices), within ``router.daily_spend_cap_usd``.

No admissible target means the request stays local, and the reason says which gate refused the
first choice, e.g. ``"prompt of 9000 tokens does not fit the local context of 8192; staying local:
openai: offline mode"``.

Example::

    policy = Policy(cloud="auto", targets=(Target("openai", "https://api.openai.com/v1", "gpt-4o-mini"),))
    d = route(RouteRequest(workspace="/src/app", prompt_tokens=9000, max_tokens=512), policy,
              Signals(local_context=8192))
    d.target.name, d.trigger   # ("openai", Trigger.CONTEXT)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from openjarvis.router.targets import Target

CloudMode = Literal["never", "ask", "auto"]
#: Loosest last; ``openjarvis.config.RouterConfig.cloud`` accepts exactly these.
CLOUD_MODES: tuple[CloudMode, ...] = ("never", "ask", "auto")

#: The smallest answer worth generating: a prompt that leaves less room than this does not fit.
MIN_ANSWER_TOKENS = 256
#: Answers shorter than this are not judged for confidence (the mean of few log-probs is noise).
MIN_TOKENS_FOR_CONFIDENCE = 16


class Trigger(StrEnum):
    """Why a request wants to leave the local engine."""

    ASKED = "asked"
    LOCAL_FAILED = "local-failed"
    CONTEXT = "context"
    LOW_CONFIDENCE = "low-confidence"


@dataclass(frozen=True, slots=True)
class Policy:
    """The person's written routing policy plus the targets it may use (see ``load_router``)."""

    cloud: CloudMode = "never"
    offline: bool = False
    never_leave: bool = False
    daily_spend_cap_usd: float = 1.0
    low_confidence_logprob: float = -1.2
    min_acceptance: float = 0.0
    preferred: str = ""
    targets: tuple[Target, ...] = ()


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the assistant is about to do: a prompt of a size, for a workspace."""

    workspace: str
    prompt_tokens: int
    max_tokens: int
    #: The person asked for a target (``/cloud``, ``--cloud``).
    asked: bool = False
    #: ``/cloud NAME``: the target they asked for by name; "" = the policy's preference.
    asked_target: str = ""
    #: The person already confirmed an earlier ``needs_confirmation`` decision for this request.
    confirmed: bool = False
    #: The person asked for this machine only (``/local``, the protocol's ``route: "local"``).
    local_only: bool = False


@dataclass(frozen=True, slots=True)
class Signals:
    """What the daemon measured: local capacity, spend so far, and the local answer if any."""

    local_context: int
    spent_today_usd: float = 0.0
    #: One-line message of the local engine's failure; "" when it did not fail.
    local_error: str = ""
    #: Mean log-probability (natural log) of the local answer's tokens under the verifier.
    mean_logprob: float | None = None
    #: Fraction of drafted tokens the verifier accepted while generating that answer.
    acceptance: float | None = None
    #: Length of that answer in tokens.
    answer_tokens: int = 0
    #: That answer was stopped because it began writing the same lines over again (finish
    #: reason "repetition", ``generation.loop_repeats``): a loop's tokens are likely, so its
    #: mean log-probability reads as confidence, yet the answer is cut short.
    repeated: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """Where the request goes (``target`` None = the local engine) and why, in one line."""

    target: Target | None
    reason: str
    trigger: Trigger | None = None
    #: ``router.cloud = "ask"``: show ``reason`` and ask before sending anything.
    needs_confirmation: bool = False
    #: Worst-case cost of this request at the target's prices (whole prompt, max_tokens out).
    estimated_cost_usd: float = 0.0

    @property
    def local(self) -> bool:
        """True when the request runs on the local engine pair."""
        return self.target is None

    @property
    def dead_end(self) -> bool:
        """The local engine failed and no target may take over: the caller reports ``reason``."""
        return self.target is None and self.trigger is Trigger.LOCAL_FAILED


def route(request: RouteRequest, policy: Policy, signals: Signals) -> Decision:
    """Decide where ``request`` runs; pure, so the daemon can log and test every outcome."""
    found = _trigger(request, policy, signals)
    if found is None:
        return Decision(None, "local")
    trigger, why = found
    if request.local_only:
        return Decision(None, f"{why}; staying local: you asked for this machine only (/local)", trigger)
    candidates = _candidates(request, policy)
    if isinstance(candidates, str):
        return Decision(None, f"{why}; staying local: {candidates}", trigger)
    refusals: list[str] = []
    for target in candidates:
        refusal = _gate(target, request, policy, signals)
        if refusal is not None:
            refusals.append(f"{target.name}: {refusal}")
            continue
        own = target.local or target.on_this_machine
        confirm = policy.cloud == "ask" and not own and not request.asked and not request.confirmed
        cost = target.cost_usd(request.prompt_tokens, request.max_tokens)
        return Decision(target, f"{why}; sending to {target.name} ({target.model})", trigger, confirm, cost)
    return Decision(None, f"{why}; staying local: {refusals[0]}", trigger)


def _trigger(request: RouteRequest, policy: Policy, signals: Signals) -> tuple[Trigger, str] | None:
    if request.asked and not request.local_only:
        return Trigger.ASKED, "you asked (/cloud)"
    if signals.local_error:
        return Trigger.LOCAL_FAILED, f"local engine failed: {signals.local_error}"
    if request.prompt_tokens + MIN_ANSWER_TOKENS > signals.local_context:
        return (
            Trigger.CONTEXT,
            f"prompt of {request.prompt_tokens} tokens does not fit the local context of {signals.local_context}",
        )
    if signals.repeated:
        return Trigger.LOW_CONFIDENCE, "local answer began repeating itself"
    if signals.answer_tokens >= MIN_TOKENS_FOR_CONFIDENCE:
        lp = signals.mean_logprob
        if lp is not None and lp < policy.low_confidence_logprob:
            return Trigger.LOW_CONFIDENCE, f"local answer unsure (mean log-prob {lp:.2f})"
        acc = signals.acceptance
        if acc is not None and acc < policy.min_acceptance:
            return Trigger.LOW_CONFIDENCE, f"local answer unsure (acceptance {acc:.0%})"
    return None


def _candidates(request: RouteRequest, policy: Policy) -> tuple[Target, ...] | str:
    """Targets in preference order, or why there are none."""
    if not policy.targets:
        return "no targets configured (add [[router.targets]] to your user config)"
    names = [t.name for t in policy.targets]
    if request.asked_target:
        if request.asked_target not in names:
            return f"no target named {request.asked_target!r}; known: {', '.join(names)}"
        return tuple(t for t in policy.targets if t.name == request.asked_target)
    return _prefer(policy.targets, policy.preferred)


def _prefer(targets: Iterable[Target], name: str) -> tuple[Target, ...]:
    ordered = list(targets)
    return tuple(sorted(ordered, key=lambda t: t.name != name))  # stable: file order otherwise


def _gate(target: Target, request: RouteRequest, policy: Policy, signals: Signals) -> str | None:
    """Why ``target`` may not take this request, or None when it may."""
    here = target.on_this_machine
    if policy.offline and not here:
        return "offline mode (router.offline)"
    if policy.never_leave and not here:
        return "this workspace never leaves the machine (router.never_leave)"
    if policy.cloud == "never" and not (target.local or here):
        return "router.cloud = never; allow it with `jarvis config set router.cloud ask`"
    if target.context and request.prompt_tokens + MIN_ANSWER_TOKENS > target.context:
        return f"prompt does not fit its context of {target.context} either"
    cost = target.cost_usd(request.prompt_tokens, request.max_tokens)
    if cost > 0 and signals.spent_today_usd + cost > policy.daily_spend_cap_usd:
        return (
            f"daily spend cap: ${signals.spent_today_usd:.2f} spent today, this request up to ${cost:.2f}, "
            f"cap ${policy.daily_spend_cap_usd:.2f} (router.daily_spend_cap_usd)"
        )
    return None
