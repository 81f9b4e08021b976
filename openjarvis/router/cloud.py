"""The client for router targets: OpenAI-compatible chat completions over httpx, streamed.

One :class:`CloudClient` per target. :meth:`CloudClient.stream_chat` redacts every message,
checks the offline guard, sends, streams the answer's text to a callback as server-sent events
arrive, and writes one audit row for the request, whatever its outcome. It returns a
:class:`CloudReply` with the text, the token counts and the cost.

Failures become one-line errors of the ``CloudError`` tree naming the target, never its key:

- 429 and 5xx are retried with exponential backoff, honouring ``Retry-After`` (a wait longer than
  :attr:`Retry.max_retry_after_s` fails at once instead), and so are failed connects; only before
  any text arrived, since text already shown cannot be taken back;
- a read timeout is not retried: the target may be generating (and billing) already;
- 401/403 (``CloudAuthError``, naming the variable or file the key came from), 404
  (``CloudNotFound``), invalid JSON or a stream cut off before its end (``CloudProtocolError``).

Usage comes from ``stream_options.include_usage``; a server that rejects that option (400) is
asked once more without it, and token counts are then estimated (:data:`CHARS_PER_TOKEN`) and
marked so in the reply and the audit row.

With ``offline=True`` (pass ``policy.offline or policy.never_leave``) the URL is checked by
:func:`openjarvis.netguard.check_allowed` before anything is resolved or connected, and proxies
from the environment are ignored, so no connection to a non-loopback address is opened.

Example::

    async with CloudClient(target, audit=AuditLog(), workspace="/src/app") as client:
        reply = await client.stream_chat([Message("user", "Explain this diff")], max_tokens=512,
                                         on_text=lambda t: print(t, end=""))
    reply.tokens_out, reply.cost_usd
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

import httpx

from openjarvis.engine.templates import Message
from openjarvis.errors import (
    CloudAuthError,
    CloudError,
    CloudNotFound,
    CloudOffline,
    CloudProtocolError,
    CloudRateLimited,
    CloudServerError,
    CloudTimeout,
    CloudUnavailable,
)
from openjarvis.netguard import check_allowed
from openjarvis.router.audit import IN_FLIGHT, AuditLog, AuditRecord
from openjarvis.router.redact import known_secrets_from_env, redact
from openjarvis.router.targets import Target

log = logging.getLogger(__name__)

TextSink = Callable[[str], Awaitable[None] | None]
#: Characters per token when a target reports no usage (a rough, documented estimate).
CHARS_PER_TOKEN = 4
#: Longest server error text quoted in our one-line errors.
SERVER_MESSAGE_CHARS = 160


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds to open a connection, and the longest silence between two bytes of an answer."""

    connect_s: float = 10.0
    read_s: float = 120.0
    write_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Retry:
    """How often and how patiently 429, 5xx and failed connects are retried."""

    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 16.0
    #: A Retry-After longer than this is reported, not waited for.
    max_retry_after_s: float = 60.0

    def delay(self, attempt: int) -> float:
        """Backoff before retry number ``attempt`` (1-based): 0.5, 1, 2, ... capped."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1))


DEFAULT_TIMEOUTS = Timeouts()
DEFAULT_RETRY = Retry()


@dataclass(frozen=True, slots=True)
class CloudReply:
    """A finished answer from a target, with what it cost."""

    text: str
    target: str
    model: str
    finish_reason: str
    tokens_in: int
    tokens_out: int
    #: False when the target reported no usage and the counts are estimates.
    usage_reported: bool
    cost_usd: float
    bytes_sent: int
    redactions: Mapping[str, int] = field(default_factory=dict)
    attempts: int = 1


class _Retryable(Exception):
    """An attempt failed in a way worth retrying; carries the error to raise when out of tries."""

    def __init__(self, error: CloudError, wait_s: float | None = None, *, drop_stream_options: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait_s = wait_s
        #: The target rejected ``stream_options`` (older OpenAI-compatible servers): retry without.
        self.drop_stream_options = drop_stream_options


@dataclass(slots=True)
class _Progress:
    text: list[str] = field(default_factory=list)
    chars: int = 0
    finish_reason: str = ""
    done: bool = False
    model: str = ""
    usage: tuple[int, int] | None = None
    bytes_sent: int = 0


class CloudClient:
    """Talks to one target; use as ``async with`` so its connections are closed."""

    def __init__(
        self,
        target: Target,
        *,
        offline: bool = False,
        audit: AuditLog | None = None,
        workspace: str = "",
        trigger: str = "",
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retry: Retry = DEFAULT_RETRY,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.target = target
        self.offline = offline
        self.audit = audit
        self.workspace = workspace
        self.trigger = trigger
        self.retry = retry
        self._environ = os.environ if environ is None else environ
        self._sleep = sleep
        self._url = target.base_url.rstrip("/") + "/chat/completions"
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=timeouts.connect_s, read=timeouts.read_s, write=timeouts.write_s, pool=5.0),
            follow_redirects=False,
            trust_env=not offline,  # an environment proxy must not carry offline traffic off the machine
        )
        self._timeouts = timeouts

    async def __aenter__(self) -> CloudClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close pooled connections; ``async with`` does it for you."""
        await self._http.aclose()

    async def stream_chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        on_text: TextSink | None = None,
    ) -> CloudReply:
        """Send ``messages`` (redacted) and stream the answer to ``on_text``; audit the request.

        Raises ``CloudOffline`` before any connection when offline forbids the target, and the
        other ``CloudError`` subclasses as described in the module docstring.
        """
        check_allowed(self._url, offline=self.offline, error=CloudOffline)
        key = self.target.api_key(self._environ)
        known = (key, *known_secrets_from_env(self._environ)) if key else known_secrets_from_env(self._environ)
        counts: dict[str, int] = {}
        sent_messages = []
        for m in messages:
            r = redact(m.content, known)
            for kind, n in r.counts.items():
                counts[kind] = counts.get(kind, 0) + n
            sent_messages.append({"role": m.role, "content": r.text})
        body = {
            "model": self.target.model,
            "messages": sent_messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key:
            headers["Authorization"] = f"Bearer {key}"

        progress = _Progress()
        attempt = 0
        status = "ok"
        started = time.time()
        row = None
        if self.audit is not None:  # written first: a crash mid-request still leaves its row
            pending = replace(self._reply(progress, counts, 0, sent_messages), bytes_sent=len(payload))
            row = self.audit.write(self._audit_record(started, pending, IN_FLIGHT))
        try:
            while True:
                attempt += 1
                try:
                    await self._attempt(payload, headers, progress, on_text, key)
                    break
                except _Retryable as exc:
                    if exc.drop_stream_options and "stream_options" in body:
                        del body["stream_options"]  # usage is then estimated
                        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
                        continue
                    if attempt >= self.retry.attempts or progress.chars:
                        raise exc.error from exc.__cause__
                    wait = exc.wait_s if exc.wait_s is not None else self.retry.delay(attempt)
                    log.info("%s: %s; retry %d in %.2fs", self.target.name, exc.error, attempt, wait)
                    await self._sleep(wait)
        except CloudError as exc:
            status = str(exc)
            raise
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except BaseException as exc:  # e.g. on_text failed because the client went away; re-raised
            status = f"interrupted: {_reason(exc)}"
            raise
        finally:
            reply = self._reply(progress, counts, attempt, sent_messages)
            if self.audit is not None and row is not None:
                if progress.bytes_sent:
                    self.audit.update(row, self._audit_record(started, reply, status))
                else:
                    self.audit.delete(row)
        return reply

    async def _attempt(
        self,
        payload: bytes,
        headers: Mapping[str, str],
        progress: _Progress,
        on_text: TextSink | None,
        key: str,
    ) -> None:
        """One HTTP exchange, adding to ``progress``. Retryable failures raise ``_Retryable``.

        Bytes count as sent once the connection is open: a response (any status), a read timeout
        or a connection dropped by the peer all mean the target may have read the request.
        """
        name = self.target.name
        opened = False

        def sent() -> None:
            nonlocal opened
            if not opened:
                progress.bytes_sent += len(payload)
                opened = True

        try:
            async with self._http.stream("POST", self._url, content=payload, headers=headers) as resp:
                sent()
                if resp.status_code != 200:
                    await resp.aread()
                    raise self._status_error(resp, key)
                ctype = resp.headers.get("content-type", "")
                if "text/event-stream" in ctype:
                    await self._read_sse(resp, progress, on_text)
                else:
                    await self._read_json(resp, progress, on_text)
        except httpx.ConnectTimeout as exc:
            raise _Retryable(
                CloudTimeout(
                    f"target {name!r}: no connection to {self.target.host} within {self._timeouts.connect_s:g} s"
                )
            ) from exc
        except httpx.ConnectError as exc:
            raise _Retryable(
                CloudUnavailable(f"target {name!r}: cannot connect to {self.target.host}: {_reason(exc)}")
            ) from exc
        except httpx.ReadTimeout as exc:
            sent()
            if progress.done:
                return  # finished (finish_reason seen); the target just never closed the stream
            where = "mid-answer" if progress.chars else "before answering"
            raise CloudTimeout(
                f"target {name!r} went silent {where} for {self._timeouts.read_s:g} s (read timeout); try again later"
            ) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            sent()
            if progress.chars:
                raise CloudProtocolError(
                    f"target {name!r} cut the stream off after {progress.chars} characters; the answer is incomplete"
                ) from exc
            raise _Retryable(CloudServerError(f"target {name!r} closed the connection without an answer")) from exc
        except (httpx.WriteTimeout, httpx.PoolTimeout) as exc:
            sent()
            raise CloudTimeout(f"target {name!r}: could not send the request in time ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise CloudUnavailable(f"target {name!r}: {type(exc).__name__}: {_reason(exc)}") from exc
        if not progress.done:
            raise CloudProtocolError(
                f"target {name!r} ended the stream after {progress.chars} characters without finishing "
                "(no finish_reason or [DONE]); the answer is incomplete"
            )

    def _status_error(self, resp: httpx.Response, key: str) -> Exception:
        name, code = self.target.name, resp.status_code
        detail = _server_message(resp, key)
        if code in (401, 403):
            source = (
                f"environment variable {self.target.api_key_env}"
                if self.target.api_key_env
                else f"key file {self.target.api_key_file}"
                if self.target.api_key_file
                else "no key configured (set api_key_env or api_key_file)"
            )
            return CloudAuthError(f"target {name!r} refused the key ({code}{detail}); check {source}")
        if code == 404:
            return CloudNotFound(
                f"target {name!r}: 404 at {self._url} ({detail.lstrip(': ') or 'not found'}); "
                f"check base_url and model {self.target.model!r}"
            )
        if code == 429:
            wait = _retry_after(resp)
            if wait is not None and wait > self.retry.max_retry_after_s:
                return CloudRateLimited(f"target {name!r} is rate limiting (429{detail}); it asks to wait {wait:g} s")
            return _Retryable(
                CloudRateLimited(f"target {name!r} is rate limiting (429{detail}); try again later"), wait
            )
        if code >= 500:
            wait = _retry_after(resp)
            wait = wait if wait is not None and wait <= self.retry.max_retry_after_s else None
            return _Retryable(CloudServerError(f"target {name!r} failed ({code}{detail}); try again later"), wait)
        error = CloudError(f"target {name!r} rejected the request ({code}{detail})")
        if code in (400, 422) and "stream_options" in detail:
            return _Retryable(error, 0.0, drop_stream_options=True)
        return error

    async def _read_sse(self, resp: httpx.Response, progress: _Progress, on_text: TextSink | None) -> None:
        data: list[str] = []
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and data:
                await self._event("\n".join(data), progress, on_text)
                data = []
                if progress.done and progress.usage is not None:
                    return
        if data:
            await self._event("\n".join(data), progress, on_text)

    async def _event(self, data: str, progress: _Progress, on_text: TextSink | None) -> None:
        if data.strip() == "[DONE]":
            progress.done = True
            return
        chunk = self._json(data, "in its stream")
        self._check_error(chunk)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise CloudProtocolError(f"target {self.target.name!r} sent a chunk whose 'choices' is not a list")
        for choice in choices[:1]:
            delta = choice.get("delta") or {} if isinstance(choice, dict) else {}
            text = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(text, str) and text:
                await self._deliver(text, progress, on_text)
            if isinstance(choice, dict) and choice.get("finish_reason"):
                progress.finish_reason = str(choice["finish_reason"])
                progress.done = True
        self._take_meta(chunk, progress)

    async def _read_json(self, resp: httpx.Response, progress: _Progress, on_text: TextSink | None) -> None:
        """A target that ignores ``stream: true`` answers with one JSON object; accept it."""
        await resp.aread()
        if resp.text.lstrip().startswith("data:"):  # server-sent events without their content type
            for event in resp.text.replace("\r\n", "\n").split("\n\n"):
                data = "\n".join(line[5:].removeprefix(" ") for line in event.splitlines() if line.startswith("data:"))
                if data:
                    await self._event(data, progress, on_text)
            return
        body = self._json(resp.text, f"(HTTP {resp.status_code})")
        self._check_error(body)
        try:
            choice = body["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise CloudProtocolError(
                f"target {self.target.name!r} answered JSON without choices[0].message.content; "
                "is base_url an OpenAI-compatible /v1 endpoint?"
            ) from exc
        if text:
            await self._deliver(str(text), progress, on_text)
        progress.finish_reason = str(choice.get("finish_reason") or "stop")
        progress.done = True
        self._take_meta(body, progress)

    def _json(self, text: str, where: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            snippet = redact(text[:60].replace("\n", " ")).text
            raise CloudProtocolError(
                f"target {self.target.name!r} sent invalid JSON {where}: {snippet!r}; "
                "is base_url an OpenAI-compatible /v1 endpoint?"
            ) from exc
        if not isinstance(value, dict):
            raise CloudProtocolError(f"target {self.target.name!r} sent JSON that is not an object {where}")
        return value

    def _check_error(self, obj: Mapping[str, Any]) -> None:
        if "error" in obj and obj["error"]:
            err = obj["error"]
            message = err.get("message", "") if isinstance(err, dict) else str(err)
            raise CloudServerError(f"target {self.target.name!r} reported an error: {_one_line(str(message))}")

    @staticmethod
    def _take_meta(obj: Mapping[str, Any], progress: _Progress) -> None:
        if isinstance(obj.get("model"), str) and obj["model"]:
            progress.model = obj["model"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            pin, pout = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(pin, int) and isinstance(pout, int):
                progress.usage = (pin, pout)

    @staticmethod
    async def _deliver(text: str, progress: _Progress, on_text: TextSink | None) -> None:
        progress.text.append(text)
        progress.chars += len(text)
        if on_text is not None:
            result = on_text(text)
            if inspect.isawaitable(result):
                await result

    def _reply(
        self,
        progress: _Progress,
        counts: Mapping[str, int],
        attempts: int,
        sent_messages: Sequence[Mapping[str, str]],
    ) -> CloudReply:
        text = "".join(progress.text)
        if progress.usage is not None:
            tokens_in, tokens_out = progress.usage
        else:
            chars_in = sum(len(m["content"]) for m in sent_messages) if progress.bytes_sent else 0
            tokens_in = math.ceil(chars_in / CHARS_PER_TOKEN)
            tokens_out = math.ceil(len(text) / CHARS_PER_TOKEN)
        return CloudReply(
            text=text,
            target=self.target.name,
            model=progress.model or self.target.model,
            finish_reason=progress.finish_reason,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            usage_reported=progress.usage is not None,
            cost_usd=self.target.cost_usd(tokens_in, tokens_out),
            bytes_sent=progress.bytes_sent,
            redactions=dict(counts),
            attempts=attempts,
        )

    def _audit_record(self, started: float, reply: CloudReply, status: str) -> AuditRecord:
        return AuditRecord(
            time=started,
            workspace=self.workspace,
            target=self.target.name,
            model=reply.model,
            host=self.target.host,
            bytes_sent=reply.bytes_sent,
            redactions=reply.redactions,
            tokens_in=reply.tokens_in,
            tokens_out=reply.tokens_out,
            cost_usd=reply.cost_usd,
            status=status,
            trigger=self.trigger,
            tokens_estimated=not reply.usage_reported,
        )


def _retry_after(resp: httpx.Response) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date); None if absent or bad."""
    value = resp.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SERVER_MESSAGE_CHARS else text[: SERVER_MESSAGE_CHARS - 1] + "…"


def _server_message(resp: httpx.Response, key: str) -> str:
    """The server's own error text, redacted and shortened, as ``": text"``; "" when none."""
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    message: Any = body
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message", "")))
        message = err.get("message", "") if isinstance(err, dict) else err
    text = _one_line(redact(str(message), (key,) if key else ()).text) if message else ""
    return f": {text}" if text else ""


def _reason(exc: BaseException) -> str:
    return _one_line(str(exc)) or type(exc).__name__
