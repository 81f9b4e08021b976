"""The cloud client against a real HTTP server on 127.0.0.1 that misbehaves on purpose.

Each test asserts what a person sees: the text streamed, the one-line error, the audit rows, and
the (redacted) request the server received.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from email.utils import formatdate
from typing import Any

import pytest
from router_fake_cloud import FakeCloud, Reply, chunk, error, stream

from openjarvis.engine.templates import Message
from openjarvis.errors import (
    CloudAuthError,
    CloudError,
    CloudNotFound,
    CloudProtocolError,
    CloudRateLimited,
    CloudServerError,
    CloudTimeout,
    CloudUnavailable,
)
from openjarvis.router.audit import AuditLog
from openjarvis.router.cloud import CloudClient, CloudReply, Retry, Timeouts
from openjarvis.router.targets import Target

KEY = "test-key-0123456789-abcdefghij"
#: Roomy enough that a loaded machine's pause in the in-process fake target never reads as a
#: silent one (read timeouts are not retried); the slow-target test asks for ``SLOW_READ``.
FAST = Timeouts(connect_s=2.0, read_s=5.0, write_s=2.0)
SLOW_READ = Timeouts(connect_s=2.0, read_s=0.3, write_s=2.0)


class Sleeps(list[float]):
    """Records the waits the client asks for instead of sleeping: retries cost no test time."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


def target(url: str, **kw: Any) -> Target:
    fields: dict[str, Any] = {
        "api_key_env": "FAKE_CLOUD_KEY",
        "input_usd_per_1k": 0.01,
        "output_usd_per_1k": 0.02,
        **kw,
    }
    return Target("fake", url, "fake-model", **fields)


def ask(
    url: str,
    messages: Sequence[Message] = (Message("user", "hello"),),
    *,
    sleeps: Sleeps | None = None,
    on_text: Callable[[str], Any] | None = None,
    audit: AuditLog | None = None,
    timeouts: Timeouts = FAST,
    **kw: Any,
) -> CloudReply:
    async def go() -> CloudReply:
        async with CloudClient(
            target(url, **kw),
            audit=audit,
            workspace="/src/app",
            trigger="asked",
            timeouts=timeouts,
            retry=Retry(attempts=3, backoff_s=0.01),
            sleep=sleeps if sleeps is not None else Sleeps(),
        ) as client:
            return await client.stream_chat(messages, max_tokens=64, on_text=on_text)

    return asyncio.run(go())


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FAKE_CLOUD_KEY", KEY)
    return KEY


def test_streams_the_answer_sends_only_redacted_text_and_audits_it(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(stream("Hel", "lo", " world"))
    seen: list[str] = []
    audit = AuditLog()
    prompt = "settings:\nAWS AKIAIOSFODNN7EXAMPLE\nDATABASE_URL=postgres://app:s3cr3t-pw@db/app\n"
    messages = [Message("system", "be brief"), Message("user", prompt)]
    reply = ask(fake_cloud.url, messages, on_text=seen.append, audit=audit)

    assert seen == ["Hel", "lo", " world"]
    assert (reply.text, reply.finish_reason, reply.model) == ("Hello world", "stop", "fake-model-v1")
    assert (reply.tokens_in, reply.tokens_out, reply.usage_reported) == (42, 7, True)
    assert reply.cost_usd == pytest.approx(42 / 1000 * 0.01 + 7 / 1000 * 0.02)

    [got] = fake_cloud.received
    assert got.path == "/v1/chat/completions"
    assert got.headers["Authorization"] == f"Bearer {KEY}"
    body = got.json
    assert (body["model"], body["stream"], body["max_tokens"]) == ("fake-model", True, 64)
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": "settings:\nAWS [REDACTED:aws_access_key]\n"
            "DATABASE_URL=postgres://app:[REDACTED:url_password]@db/app\n",
        },
    ]
    assert b"AKIAIOSFODNN7EXAMPLE" not in got.body and b"s3cr3t-pw" not in got.body

    [row] = audit.records()
    assert (row.workspace, row.target, row.model, row.host, row.trigger) == (
        "/src/app",
        "fake",
        "fake-model-v1",
        "127.0.0.1",
        "asked",
    )
    assert row.bytes_sent == len(got.body) == reply.bytes_sent
    assert row.redactions == {"aws_access_key": 1, "url_password": 1}
    assert (row.tokens_in, row.tokens_out, row.tokens_estimated, row.status) == (42, 7, False, "ok")
    assert row.cost_usd == pytest.approx(reply.cost_usd)
    assert audit.spent_today() == pytest.approx(reply.cost_usd)


def test_an_async_text_callback_is_awaited(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(stream("a", "b"))
    seen: list[str] = []

    async def sink(text: str) -> None:
        await asyncio.sleep(0)
        seen.append(text)

    assert ask(fake_cloud.url, on_text=sink).text == "ab"
    assert seen == ["a", "b"]


def test_429_waits_as_long_as_retry_after_says_then_succeeds(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(error(429, "slow down", {"Retry-After": "7"}), stream("ok"))
    sleeps = Sleeps()
    audit = AuditLog()
    reply = ask(fake_cloud.url, sleeps=sleeps, audit=audit)
    assert (reply.text, reply.attempts) == ("ok", 2)
    assert sleeps == [7.0]
    assert len(fake_cloud.received) == 2
    [row] = audit.records()
    assert row.bytes_sent == sum(len(r.body) for r in fake_cloud.received) and row.status == "ok"


def test_429_asking_for_an_hour_is_reported_not_waited_for(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(error(429, "quota exceeded", {"Retry-After": "3600"}))
    sleeps = Sleeps()
    with pytest.raises(CloudRateLimited) as exc:
        ask(fake_cloud.url, sleeps=sleeps)
    assert str(exc.value) == "target 'fake' is rate limiting (429: quota exceeded); it asks to wait 3600 s"
    assert sleeps == [] and len(fake_cloud.received) == 1


def test_500_then_success_backs_off_once(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(error(500, "boom"), stream("fine"))
    sleeps = Sleeps()
    assert ask(fake_cloud.url, sleeps=sleeps).text == "fine"
    assert sleeps == [0.01]


def test_5xx_every_time_gives_up_after_the_retries_with_one_line(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(error(503, "overloaded"), error(502), error(503, "overloaded\nplease\nwait"))
    sleeps = Sleeps()
    audit = AuditLog()
    with pytest.raises(CloudServerError) as exc:
        ask(fake_cloud.url, sleeps=sleeps, audit=audit)
    assert str(exc.value) == "target 'fake' failed (503: overloaded please wait); try again later"
    assert sleeps == [0.01, 0.02] and len(fake_cloud.received) == 3
    [row] = audit.records()
    assert row.status == str(exc.value) and row.tokens_out == 0 and row.bytes_sent > 0


def test_a_slow_target_hits_the_read_timeout_and_is_not_retried(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(Reply(delay_s=30, headers={"Content-Type": "text/event-stream"}, events=["[DONE]"]))
    with pytest.raises(CloudTimeout) as exc:
        ask(fake_cloud.url, timeouts=SLOW_READ)
    assert str(exc.value) == "target 'fake' went silent before answering for 0.3 s (read timeout); try again later"
    assert len(fake_cloud.received) == 1


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_stream_cut_off_mid_answer_keeps_the_text_shown_and_says_so(fake_cloud: FakeCloud, reset: bool) -> None:
    reply = stream("Hel", "lo", " world")
    reply.cut_after, reply.reset = 2, reset
    fake_cloud.script(reply)
    seen: list[str] = []
    audit = AuditLog()
    with pytest.raises(CloudProtocolError) as exc:
        ask(fake_cloud.url, on_text=seen.append, audit=audit)
    assert seen == ["Hel", "lo"]
    assert str(exc.value) == "target 'fake' cut the stream off after 5 characters; the answer is incomplete"
    assert len(fake_cloud.received) == 1  # text was shown: never retried
    [row] = audit.records()
    assert row.status == str(exc.value) and row.tokens_estimated and row.tokens_out == 2


def test_a_stream_that_ends_without_finishing_is_an_error(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(Reply(headers={"Content-Type": "text/event-stream"}, events=[chunk("par"), chunk("tial")]))
    with pytest.raises(CloudProtocolError) as exc:
        ask(fake_cloud.url)
    assert str(exc.value) == (
        "target 'fake' ended the stream after 7 characters without finishing (no finish_reason or [DONE]); "
        "the answer is incomplete"
    )


def test_invalid_json_in_the_stream(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(Reply(headers={"Content-Type": "text/event-stream"}, events=[chunk("ok"), "{not json"]))
    with pytest.raises(CloudProtocolError) as exc:
        ask(fake_cloud.url)
    assert str(exc.value) == (
        "target 'fake' sent invalid JSON in its stream: '{not json'; is base_url an OpenAI-compatible /v1 endpoint?"
    )


def test_an_html_page_instead_of_json(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(Reply(headers={"Content-Type": "text/html"}, body=b"<html>proxy login</html>"))
    with pytest.raises(CloudProtocolError) as exc:
        ask(fake_cloud.url)
    assert str(exc.value) == (
        "target 'fake' sent invalid JSON (HTTP 200): '<html>proxy login</html>'; "
        "is base_url an OpenAI-compatible /v1 endpoint?"
    )


def test_a_target_that_ignores_stream_true_still_answers(fake_cloud: FakeCloud) -> None:
    answer = {"role": "assistant", "content": "whole"}
    body = json.dumps({"model": "m2", "choices": [{"message": answer, "finish_reason": "stop"}]}).encode()
    fake_cloud.script(Reply(headers={"Content-Type": "application/json"}, body=body))
    seen: list[str] = []
    reply = ask(fake_cloud.url, on_text=seen.append)
    assert seen == ["whole"] and reply.model == "m2" and not reply.usage_reported


def test_an_error_object_inside_the_stream(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(
        Reply(headers={"Content-Type": "text/event-stream"}, events=['{"error": {"message": "context too long"}}'])
    )
    with pytest.raises(CloudServerError, match=r"^target 'fake' reported an error: context too long$"):
        ask(fake_cloud.url)


def test_401_names_where_the_key_came_from_and_never_the_key(
    fake_cloud: FakeCloud, caplog: pytest.LogCaptureFixture
) -> None:
    fake_cloud.script(error(401, f"Incorrect API key provided: {KEY}"))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(CloudAuthError) as exc:
        ask(fake_cloud.url)
    assert str(exc.value) == (
        "target 'fake' refused the key (401: Incorrect API key provided: [REDACTED:known_secret]); "
        "check environment variable FAKE_CLOUD_KEY"
    )
    assert KEY not in caplog.text
    assert len(fake_cloud.received) == 1


def test_404_points_at_base_url_and_model(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(error(404, "The model `fake-model` does not exist"))
    with pytest.raises(CloudNotFound) as exc:
        ask(fake_cloud.url)
    assert str(exc.value) == (
        f"target 'fake': 404 at {fake_cloud.url}/chat/completions (The model `fake-model` does not exist); "
        "check base_url and model 'fake-model'"
    )


def test_other_4xx_is_reported_with_the_servers_words(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(error(400, "max_tokens is too large"))
    with pytest.raises(CloudError, match=r"^target 'fake' rejected the request \(400: max_tokens is too large\)$"):
        ask(fake_cloud.url)


def test_a_missing_key_variable_fails_before_connecting(fake_cloud: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAKE_CLOUD_KEY")
    with pytest.raises(CloudAuthError) as exc:
        ask(fake_cloud.url)
    assert str(exc.value) == (
        "target 'fake': environment variable FAKE_CLOUD_KEY is not set or empty; export it or use api_key_file"
    )
    assert fake_cloud.received == []


def test_nothing_listening_is_retried_then_reported_and_not_audited() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    audit = AuditLog()
    with pytest.raises(CloudUnavailable, match=r"^target 'fake': cannot connect to 127\.0\.0\.1: "):
        ask(f"http://127.0.0.1:{port}/v1", sleeps=sleeps, audit=audit)
    assert sleeps == [0.01, 0.02]
    assert audit.records() == []  # nothing left the machine


def test_without_usage_the_tokens_are_estimated_and_marked(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(stream("12345678", usage=None))
    audit = AuditLog()
    reply = ask(fake_cloud.url, [Message("user", "x" * 40)], audit=audit)
    assert (reply.tokens_in, reply.tokens_out, reply.usage_reported) == (10, 2, False)
    [row] = audit.records()
    assert row.tokens_estimated and (row.tokens_in, row.tokens_out) == (10, 2)


def test_a_cancelled_request_is_audited_as_cancelled(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(stream("a", "b", "c"))
    audit = AuditLog()

    def cancel(text: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()

    with pytest.raises(asyncio.CancelledError):
        ask(fake_cloud.url, on_text=cancel, audit=audit)
    [row] = audit.records()
    assert row.status == "cancelled" and row.bytes_sent > 0


def test_the_audit_row_is_written_before_the_answer_so_a_crash_keeps_it(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(stream("a", "b"))
    audit = AuditLog()
    during: list[list[str]] = []
    ask(fake_cloud.url, on_text=lambda _: during.append([r.status for r in audit.records()]), audit=audit)
    assert during == [["in flight"], ["in flight"]]
    assert [r.status for r in audit.records()] == ["ok"]


def test_a_failing_text_sink_is_audited_as_interrupted(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(stream("a", "b"))
    audit = AuditLog()

    def gone(text: str) -> None:
        raise BrokenPipeError("client went away")

    with pytest.raises(BrokenPipeError):
        ask(fake_cloud.url, on_text=gone, audit=audit)
    [row] = audit.records()
    assert row.status == "interrupted: client went away"


def test_retry_after_as_an_http_date(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(
        error(503, "maintenance", {"Retry-After": formatdate(time.time() + 30, usegmt=True)}), stream("up")
    )
    sleeps = Sleeps()
    assert ask(fake_cloud.url, sleeps=sleeps).text == "up"
    [wait] = sleeps
    assert 20 < wait <= 30


def test_an_event_stream_without_its_content_type(fake_cloud: FakeCloud) -> None:
    events = stream("plain", " text").events or []
    body = "".join(f"data: {e}\r\n\r\n" for e in events).encode()
    fake_cloud.script(Reply(headers={"Content-Type": "text/plain"}, body=body))
    seen: list[str] = []
    assert ask(fake_cloud.url, on_text=seen.append).text == "plain text"
    assert seen == ["plain", " text"]


def test_a_server_that_rejects_stream_options_is_asked_again_without(fake_cloud: FakeCloud) -> None:
    fake_cloud.script(error(400, "Unrecognized request argument supplied: stream_options"), stream("fine", usage=None))
    sleeps = Sleeps()
    reply = ask(fake_cloud.url, sleeps=sleeps)
    assert (reply.text, reply.usage_reported) == ("fine", False)
    first, second = (r.json for r in fake_cloud.received)
    assert "stream_options" in first and "stream_options" not in second
    assert sleeps == []
