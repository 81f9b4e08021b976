"""The router as the daemon uses it: config on disk -> decision -> redacted request -> audit -> cap."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from router_fake_cloud import FakeCloud, stream

from openjarvis import paths
from openjarvis.engine.templates import Message
from openjarvis.router.cloud import CloudReply, Retry, Timeouts
from openjarvis.router.policy import Decision, RouteRequest, Signals, Trigger
from openjarvis.router.service import Router


def user_config(fake_cloud: FakeCloud, router: str) -> None:
    path = paths.user_config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"[router]\n{router}\n\n"
        "[[router.targets]]\n"
        'name = "fake"\n'
        f'base_url = "{fake_cloud.url}"\n'
        'model = "fake-model"\n'
        # Priced so that one request of 9000 tokens in, 7 out costs $0.90.
        "input_usd_per_1k = 0.1\n"
        "output_usd_per_1k = 0.0\n",
        encoding="utf-8",
    )


def send(router: Router, decision: Decision, text: str) -> CloudReply:
    return asyncio.run(router.send(decision, [Message("user", text)], max_tokens=16))


def make(workspace: Path) -> Router:
    return Router.for_workspace(workspace, timeouts=Timeouts(read_s=2.0), retry=Retry(attempts=1))


def test_a_prompt_too_big_goes_out_redacted_is_audited_and_the_cap_then_holds(
    workspace: Path, fake_cloud: FakeCloud
) -> None:
    user_config(fake_cloud, 'cloud = "auto"\ndaily_spend_cap_usd = 1.0')
    fake_cloud.script(stream("Sure."), stream("never sent"))
    router = make(workspace)
    request = RouteRequest(str(workspace), prompt_tokens=9000, max_tokens=16)
    signals = Signals(local_context=8192)

    d = router.decide(request, signals)
    assert d.target is not None and d.target.name == "fake" and d.trigger is Trigger.CONTEXT
    reply = send(router, d, "key: ghp_abcdefghijklmnopqrstuvwxyz0123456789")
    assert reply.text == "Sure." and reply.tokens_in == 42  # the fake reports usage (42, 7)
    assert "ghp_" not in fake_cloud.received[0].body.decode()

    [row] = router.audit.records()
    assert (row.workspace, row.target, row.trigger, row.redactions) == (
        str(workspace),
        "fake",
        "context",
        {"github_token": 1},
    )

    # $0.0042 spent; the next request's worst case is 9000 tokens at $0.1/1k = $0.90 -> still fits.
    assert router.decide(request, signals).target is not None
    # A bigger one would not: $0.0042 + $1.20 > $1.00.
    big = replace(request, prompt_tokens=12000)
    d = router.decide(big, replace(signals, local_context=8192))
    assert d.local and "daily spend cap: $0.00 spent today, this request up to $1.20, cap $1.00" in d.reason


def test_never_leave_in_the_repo_file_keeps_the_workspace_home(workspace: Path, fake_cloud: FakeCloud) -> None:
    user_config(fake_cloud, 'cloud = "auto"')
    (workspace / ".jarvis.toml").write_text("[router]\nnever_leave = true\n")
    router = make(workspace)
    # The fake cloud is on 127.0.0.1, so it is still allowed: bytes stay on this machine.
    d = router.decide(RouteRequest(str(workspace), 9000, 16), Signals(local_context=8192))
    assert d.target is not None
    assert router.policy.never_leave


def test_ask_mode_does_not_ask_for_a_server_on_this_machine(workspace: Path, fake_cloud: FakeCloud) -> None:
    user_config(fake_cloud, 'cloud = "ask"')
    d = make(workspace).decide(RouteRequest(str(workspace), 9000, 16), Signals(local_context=8192))
    assert d.target is not None and not d.needs_confirmation


def test_send_refuses_a_local_or_unconfirmed_decision(workspace: Path, fake_cloud: FakeCloud) -> None:
    user_config(fake_cloud, 'cloud = "ask"')
    router = make(workspace)
    target = router.policy.targets[0]
    with pytest.raises(ValueError, match="confirmation"):
        send(router, Decision(target, "context", Trigger.CONTEXT, needs_confirmation=True), "hi")
    with pytest.raises(ValueError, match="target"):
        send(router, Decision(None, "local"), "hi")
    assert fake_cloud.received == []


def test_send_blocking_from_a_worker_thread_and_its_cancel(workspace: Path, fake_cloud: FakeCloud) -> None:
    user_config(fake_cloud, 'cloud = "auto"')
    router = make(workspace)
    d = router.decide(RouteRequest(str(workspace), 9000, 16), Signals(local_context=8192))
    fake_cloud.script(stream("all", " of it"))
    seen: list[str] = []
    reply = router.send_blocking(d, [Message("user", "hi")], max_tokens=16, on_text=seen.append)
    assert (reply.text, reply.finish_reason, seen) == ("all of it", "stop", ["all", " of it"])

    stalled = stream("first", " second")
    stalled.stall_after = 1  # the target goes quiet after one token; the person presses Esc
    fake_cloud.script(stalled)
    seen.clear()
    reply = router.send_blocking(
        d, [Message("user", "hi")], max_tokens=16, on_text=seen.append, cancel=lambda: bool(seen)
    )
    assert (reply.text, reply.finish_reason) == ("first", "cancelled")
    assert [r.status for r in router.audit.records()] == ["ok", "cancelled"]
