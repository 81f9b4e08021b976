"""Offline mode: no connection to a non-loopback address is ever opened, proven at the socket level.

The autouse ``net_guard`` fixture sees every ``socket.connect`` and ``getaddrinfo`` in the process
(a Python audit hook). The control test shows it does catch a real attempt, so the other tests'
empty attempt lists mean what they say.
"""

from __future__ import annotations

import asyncio

import pytest
from router_fake_cloud import FakeCloud, NetGuard, stream

from openjarvis.engine.templates import Message
from openjarvis.errors import CloudOffline, CloudUnavailable
from openjarvis.router.audit import AuditLog
from openjarvis.router.cloud import CloudClient, CloudReply, Retry, Timeouts
from openjarvis.router.targets import Target


def ask(target: Target, *, offline: bool) -> CloudReply:
    async def go() -> CloudReply:
        async with CloudClient(
            target,
            offline=offline,
            audit=AuditLog(),
            timeouts=Timeouts(connect_s=0.5, read_s=2.0),
            retry=Retry(attempts=1),
        ) as client:
            return await client.stream_chat([Message("user", "hi")], max_tokens=8)

    return asyncio.run(go())


@pytest.mark.parametrize(
    "url",
    ["https://api.openai.com/v1", "http://203.0.113.7:9/v1", "http://[2001:db8::1]:8000/v1", "http://10.0.0.5:8000/v1"],
)
def test_offline_refuses_every_non_loopback_target_before_any_socket(url: str, net_guard: NetGuard) -> None:
    with pytest.raises(CloudOffline) as exc:
        ask(Target("t", url, "m"), offline=True)
    assert str(exc.value).startswith("offline mode: refusing to connect to ")
    assert net_guard.attempts == []  # not even a DNS lookup
    assert AuditLog().records() == []


def test_control_the_guard_does_see_an_attempt_when_offline_is_off(net_guard: NetGuard) -> None:
    net_guard.expect_attempts = True
    with pytest.raises(CloudUnavailable):
        ask(Target("t", "http://203.0.113.7:9/v1", "m"), offline=False)
    assert net_guard.attempts and all(host == "203.0.113.7" for _, host in net_guard.attempts)


def test_offline_still_reaches_a_server_on_this_machine(fake_cloud: FakeCloud, net_guard: NetGuard) -> None:
    fake_cloud.script(stream("local", " ok"))
    assert ask(Target("ollama", fake_cloud.url, "m"), offline=True).text == "local ok"
    assert net_guard.attempts == []


def test_offline_ignores_proxies_from_the_environment(
    fake_cloud: FakeCloud, net_guard: NetGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(var, "http://203.0.113.9:3128")
    fake_cloud.script(stream("direct"))
    assert ask(Target("ollama", fake_cloud.url, "m"), offline=True).text == "direct"
    assert net_guard.attempts == []
