"""route(): every rule of the policy as a row of one table."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openjarvis.router.policy import Decision, Policy, RouteRequest, Signals, Trigger, route
from openjarvis.router.targets import Target

CLOUD = Target("cloud", "https://api.example.com/v1", "big", input_usd_per_1k=0.001, output_usd_per_1k=0.002)
CHEAP = Target("cheap", "https://cheap.example.com/v1", "small", input_usd_per_1k=0.0001)
OWN = Target("workstation", "http://10.0.0.5:8000/v1", "qwen-32b", local=True, context=32768)
LOOP = Target("ollama", "http://127.0.0.1:11434/v1", "qwen-7b", context=16384)

FITS = {"prompt_tokens": 1000}
TOO_BIG = {"prompt_tokens": 9000}  # local context below is 8192


@dataclass(frozen=True)
class Row:
    id: str
    policy: dict[str, Any]
    request: dict[str, Any] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)
    _: KW_ONLY
    target: str | None = None
    trigger: Trigger | None = None
    confirm: bool = False
    reason: str = ""


ROWS = [
    Row("fits-stays-local", {"cloud": "auto", "targets": (CLOUD,)}, FITS, reason="local"),
    Row(
        "context-auto-goes",
        {"cloud": "auto", "targets": (CLOUD,)},
        TOO_BIG,
        target="cloud",
        trigger=Trigger.CONTEXT,
        reason="prompt of 9000 tokens does not fit the local context of 8192; sending to cloud (big)",
    ),
    Row(
        "context-never-stays",
        {"cloud": "never", "targets": (CLOUD,)},
        TOO_BIG,
        trigger=Trigger.CONTEXT,
        reason="prompt of 9000 tokens does not fit the local context of 8192; staying local: "
        "cloud: router.cloud = never; allow it with `jarvis config set router.cloud ask`",
    ),
    Row("never-admits-own-engine", {"cloud": "never", "targets": (CLOUD, OWN)}, TOO_BIG, target="workstation"),
    Row("never-admits-loopback", {"cloud": "never", "targets": (LOOP,)}, TOO_BIG, target="ollama"),
    Row("ask-needs-confirmation", {"cloud": "ask", "targets": (CLOUD,)}, TOO_BIG, target="cloud", confirm=True),
    Row("ask-confirmed", {"cloud": "ask", "targets": (CLOUD,)}, {**TOO_BIG, "confirmed": True}, target="cloud"),
    Row("ask-own-engine-no-question", {"cloud": "ask", "targets": (OWN,)}, TOO_BIG, target="workstation"),
    Row(
        "asked-is-consent",
        {"cloud": "ask", "targets": (CLOUD,)},
        {**FITS, "asked": True},
        target="cloud",
        trigger=Trigger.ASKED,
        reason="you asked (/cloud); sending to cloud (big)",
    ),
    Row(
        "asked-but-never",
        {"cloud": "never", "targets": (CLOUD,)},
        {**FITS, "asked": True},
        trigger=Trigger.ASKED,
        reason="you asked (/cloud); staying local: cloud: router.cloud = never; "
        "allow it with `jarvis config set router.cloud ask`",
    ),
    Row(
        "asked-unknown-name",
        {"cloud": "auto", "targets": (CLOUD, OWN)},
        {**FITS, "asked": True, "asked_target": "gpt5"},
        trigger=Trigger.ASKED,
        reason="you asked (/cloud); staying local: no target named 'gpt5'; known: cloud, workstation",
    ),
    Row(
        "asked-by-name",
        {"cloud": "auto", "targets": (CLOUD, OWN)},
        {**FITS, "asked": True, "asked_target": "workstation"},
        target="workstation",
    ),
    Row(
        "preferred-first",
        {"cloud": "auto", "targets": (CLOUD, OWN), "preferred": "workstation"},
        TOO_BIG,
        target="workstation",
    ),
    Row(
        "offline-admits-loopback",
        {"cloud": "auto", "offline": True, "targets": (CLOUD, LOOP)},
        TOO_BIG,
        target="ollama",
    ),
    Row(
        "offline-refuses-remote",
        {"cloud": "auto", "offline": True, "targets": (CLOUD, OWN)},
        TOO_BIG,
        trigger=Trigger.CONTEXT,
        reason="prompt of 9000 tokens does not fit the local context of 8192; staying local: "
        "cloud: offline mode (router.offline)",
    ),
    Row(
        "never-leave-refuses-own-remote-engine",
        {"cloud": "auto", "never_leave": True, "targets": (OWN,)},
        {**FITS, "asked": True},
        trigger=Trigger.ASKED,
        reason="you asked (/cloud); staying local: workstation: this workspace never leaves the machine "
        "(router.never_leave)",
    ),
    Row(
        "never-leave-admits-loopback",
        {"cloud": "auto", "never_leave": True, "targets": (LOOP,)},
        TOO_BIG,
        target="ollama",
    ),
    Row(
        "spend-cap-reached",
        {"cloud": "auto", "daily_spend_cap_usd": 1.0, "targets": (CLOUD,)},
        {**TOO_BIG, "max_tokens": 500},
        {"spent_today_usd": 0.995},
        trigger=Trigger.CONTEXT,
        reason="prompt of 9000 tokens does not fit the local context of 8192; staying local: cloud: daily spend cap: "
        "$0.99 spent today, this request up to $0.01, cap $1.00 (router.daily_spend_cap_usd)",
    ),
    Row(
        "spend-cap-falls-through-to-cheaper",
        {"cloud": "auto", "daily_spend_cap_usd": 1.0, "targets": (CLOUD, CHEAP)},
        {**TOO_BIG, "max_tokens": 500},
        {"spent_today_usd": 0.995},
        target="cheap",
    ),
    Row(
        "zero-cap-admits-free",
        {"cloud": "auto", "daily_spend_cap_usd": 0.0, "targets": (CLOUD, OWN)},
        TOO_BIG,
        target="workstation",
    ),
    Row(
        "target-context-too-small",
        {"cloud": "auto", "targets": (LOOP, OWN)},
        {"prompt_tokens": 20000},
        target="workstation",
        reason="prompt of 20000 tokens does not fit the local context of 8192; sending to workstation (qwen-32b)",
    ),
    Row(
        "local-failed-goes",
        {"cloud": "auto", "targets": (CLOUD,)},
        FITS,
        {"local_error": "model file missing"},
        target="cloud",
        trigger=Trigger.LOCAL_FAILED,
        reason="local engine failed: model file missing; sending to cloud (big)",
    ),
    Row(
        "low-logprob-goes",
        {"cloud": "auto", "targets": (CLOUD,)},
        FITS,
        {"mean_logprob": -2.0, "answer_tokens": 40},
        target="cloud",
        trigger=Trigger.LOW_CONFIDENCE,
        reason="local answer unsure (mean log-prob -2.00); sending to cloud (big)",
    ),
    Row(
        "a-looping-answer-goes-though-its-tokens-look-sure",
        {"cloud": "auto", "targets": (CLOUD,)},
        FITS,
        {"mean_logprob": -0.05, "answer_tokens": 258, "repeated": True},
        target="cloud",
        trigger=Trigger.LOW_CONFIDENCE,
        reason="local answer began repeating itself; sending to cloud (big)",
    ),
    Row(
        "a-looping-answer-stays-under-never",
        {"cloud": "never", "targets": (CLOUD,)},
        FITS,
        {"mean_logprob": -0.05, "answer_tokens": 258, "repeated": True},
        trigger=Trigger.LOW_CONFIDENCE,
        reason="local answer began repeating itself; staying local: "
        "cloud: router.cloud = never; allow it with `jarvis config set router.cloud ask`",
    ),
    Row("confident-stays", {"cloud": "auto", "targets": (CLOUD,)}, FITS, {"mean_logprob": -0.3, "answer_tokens": 40}),
    Row("too-short-to-judge", {"cloud": "auto", "targets": (CLOUD,)}, FITS, {"mean_logprob": -3.0, "answer_tokens": 5}),
    Row(
        "low-acceptance-goes-when-enabled",
        {"cloud": "auto", "min_acceptance": 0.5, "targets": (CLOUD,)},
        FITS,
        {"mean_logprob": -0.3, "acceptance": 0.2, "answer_tokens": 40},
        target="cloud",
        trigger=Trigger.LOW_CONFIDENCE,
        reason="local answer unsure (acceptance 20%); sending to cloud (big)",
    ),
    Row(
        "low-acceptance-ignored-by-default",
        {"cloud": "auto", "targets": (CLOUD,)},
        FITS,
        {"acceptance": 0.1, "answer_tokens": 40},
    ),
    Row(
        "local-only-wins-over-context",
        {"cloud": "auto", "targets": (CLOUD,)},
        {**TOO_BIG, "local_only": True},
        trigger=Trigger.CONTEXT,
        reason="prompt of 9000 tokens does not fit the local context of 8192; staying local: "
        "you asked for this machine only (/local)",
    ),
    Row("local-only-fits", {"cloud": "auto", "targets": (CLOUD,)}, {**FITS, "local_only": True}, reason="local"),
    Row(
        "no-targets",
        {"cloud": "auto"},
        TOO_BIG,
        trigger=Trigger.CONTEXT,
        reason="prompt of 9000 tokens does not fit the local context of 8192; staying local: "
        "no targets configured (add [[router.targets]] to your user config)",
    ),
]


def decide(row: Row) -> Decision:
    request = RouteRequest(**{"workspace": "/src/app", "prompt_tokens": 0, "max_tokens": 1024, **row.request})
    signals = Signals(**{"local_context": 8192, **row.signals})
    return route(request, Policy(**row.policy), signals)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_route(row: Row) -> None:
    d = decide(row)
    assert (d.target.name if d.target else None) == row.target
    assert d.needs_confirmation is row.confirm
    if row.trigger is not None:
        assert d.trigger is row.trigger
    if row.reason:
        assert d.reason == row.reason


def test_a_local_decision_after_a_failure_is_a_dead_end() -> None:
    d = decide(Row("x", {"cloud": "never", "targets": (CLOUD,)}, FITS, {"local_error": "out of memory"}))
    assert d.local and d.dead_end
    assert d.reason.startswith("local engine failed: out of memory; staying local: cloud: router.cloud = never")
    assert not decide(Row("y", {"cloud": "never"}, TOO_BIG)).dead_end
    only_here = decide(
        Row("z", {"cloud": "auto", "targets": (CLOUD,)}, {**FITS, "local_only": True}, {"local_error": "oom"})
    )
    assert only_here.dead_end


def test_the_decision_carries_the_worst_case_cost() -> None:
    d = decide(Row("x", {"cloud": "auto", "targets": (CLOUD,)}, {**TOO_BIG, "max_tokens": 500}))
    assert d.estimated_cost_usd == pytest.approx(9 * 0.001 + 0.5 * 0.002)


# Properties over random requests, policies and signals: the promises no table row may break.

TARGETS = st.lists(st.sampled_from([CLOUD, CHEAP, OWN, LOOP]), unique_by=lambda t: t.name, max_size=4).map(tuple)
POLICIES = st.builds(
    Policy,
    cloud=st.sampled_from(["never", "ask", "auto"]),
    offline=st.booleans(),
    never_leave=st.booleans(),
    daily_spend_cap_usd=st.floats(0, 5),
    low_confidence_logprob=st.floats(-5, 0),
    min_acceptance=st.floats(0, 1),
    preferred=st.sampled_from(["", "cloud", "workstation", "nope"]),
    targets=TARGETS,
)
REQUESTS = st.builds(
    RouteRequest,
    workspace=st.just("/src/app"),
    prompt_tokens=st.integers(0, 40000),
    max_tokens=st.integers(1, 4096),
    asked=st.booleans(),
    asked_target=st.sampled_from(["", "cloud", "ollama", "nope"]),
    confirmed=st.booleans(),
    local_only=st.booleans(),
)
SIGNALS = st.builds(
    Signals,
    local_context=st.integers(512, 32768),
    spent_today_usd=st.floats(0, 5),
    local_error=st.sampled_from(["", "out of memory"]),
    mean_logprob=st.none() | st.floats(-6, 0),
    acceptance=st.none() | st.floats(0, 1),
    answer_tokens=st.integers(0, 100),
    repeated=st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(request=REQUESTS, policy=POLICIES, signals=SIGNALS)
def test_no_decision_breaks_a_promise(request: RouteRequest, policy: Policy, signals: Signals) -> None:
    d = route(request, policy, signals)
    assert d.reason and "\n" not in d.reason
    if d.target is None:
        return
    t = d.target
    assert d.trigger is not None and not request.local_only
    assert t in policy.targets
    if policy.offline or policy.never_leave:
        assert t.on_this_machine
    if policy.cloud == "never":
        assert t.local or t.on_this_machine
    if d.estimated_cost_usd > 0:
        assert signals.spent_today_usd + d.estimated_cost_usd <= policy.daily_spend_cap_usd
    if d.needs_confirmation:
        assert policy.cloud == "ask" and not request.asked and not request.confirmed
    if request.asked_target:
        assert t.name == request.asked_target
