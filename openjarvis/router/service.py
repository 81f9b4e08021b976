"""The router as the daemon holds it: decide with today's spend, then send where the decision says.

:func:`openjarvis.router.policy.route` is pure; this is the thin I/O shell around it. It reads
today's spend from the audit log before each decision (so the cap holds across processes and
restarts), and sends a remote decision through a :class:`CloudClient` that redacts, enforces the
offline guard and writes the audit row.

The daemon's flow for one chat request::

    router = Router.for_workspace(workspace)                  # once per workspace (config may change)
    request = RouteRequest(str(workspace), prompt_tokens, max_tokens, asked=cloud_flag)
    d = router.decide(request, Signals(local_context=engine_context))
    if d.needs_confirmation:   # router.cloud = "ask": show d.reason, ask, then
        d = router.decide(replace(request, confirmed=True), signals)
    if d.local:
        ... generate locally; then, with the answer's mean log-prob / acceptance,
        d = router.decide(request, replace(signals, mean_logprob=lp, acceptance=acc, answer_tokens=n))
        # (or, on an engine error, signals with local_error=str(exc)); d.dead_end: report d.reason
    if not d.local:
        reply = await router.send(d, messages, max_tokens=max_tokens, on_text=notify)
        # or, from a worker thread: router.send_blocking(d, messages, ..., on_text=notify, cancel=cancelled)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from openjarvis.config import Config, load_config
from openjarvis.engine.templates import Message
from openjarvis.router.audit import AuditLog
from openjarvis.router.cloud import (
    CHARS_PER_TOKEN,
    DEFAULT_RETRY,
    DEFAULT_TIMEOUTS,
    CloudClient,
    CloudReply,
    Retry,
    TextSink,
    Timeouts,
)
from openjarvis.router.policy import Decision, Policy, RouteRequest, Signals, route
from openjarvis.router.targets import load_router

#: How often :meth:`Router.send_blocking` asks its ``cancel`` callable, in seconds.
CANCEL_POLL_S = 0.05


class Router:
    """Policy + audit log + how to reach targets, for one workspace."""

    def __init__(
        self,
        policy: Policy,
        *,
        workspace: str,
        audit: AuditLog | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retry: Retry = DEFAULT_RETRY,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.policy = policy
        self.workspace = workspace
        self.audit = audit or AuditLog()
        self.timeouts = timeouts
        self.retry = retry
        self._environ = environ

    @classmethod
    def for_workspace(
        cls,
        workspace: Path,
        config: Config | None = None,
        *,
        audit: AuditLog | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retry: Retry = DEFAULT_RETRY,
    ) -> Router:
        """The router for ``workspace``: its layered config, the user's targets, the shared audit log."""
        config = config or load_config(workspace)
        policy = load_router(config, workspace)
        return cls(policy, workspace=str(workspace), audit=audit, timeouts=timeouts, retry=retry)

    def decide(self, request: RouteRequest, signals: Signals) -> Decision:
        """``route()`` with ``signals.spent_today_usd`` read from the audit log now."""
        return route(request, self.policy, replace(signals, spent_today_usd=self.audit.spent_today()))

    async def send(
        self,
        decision: Decision,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        on_text: TextSink | None = None,
    ) -> CloudReply:
        """Stream the answer from ``decision.target``; redacted, offline-guarded and audited.

        ``never_leave`` is enforced here too (as offline), so a decision made under an older
        policy still cannot take this workspace's bytes off the machine.
        """
        if decision.target is None:
            raise ValueError("send() needs a decision with a target; run a local decision on the engine")
        if decision.needs_confirmation:
            raise ValueError("the decision needs the person's confirmation; decide again with confirmed=True")
        async with CloudClient(
            decision.target,
            offline=self.policy.offline or self.policy.never_leave,
            audit=self.audit,
            workspace=self.workspace,
            trigger=decision.trigger.value if decision.trigger else "",
            timeouts=self.timeouts,
            retry=self.retry,
            environ=self._environ,
        ) as client:
            return await client.stream_chat(messages, max_tokens=max_tokens, temperature=temperature, on_text=on_text)

    def send_blocking(
        self,
        decision: Decision,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        on_text: Callable[[str], None] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> CloudReply:
        """:meth:`send` for a worker thread (the daemon generates off its event loop).

        Runs its own event loop in the calling thread, which must not be running one. ``cancel``
        is polled every :data:`CANCEL_POLL_S`; once it returns True the request is abandoned (and
        audited as cancelled) and the reply carries the text so far, ``finish_reason="cancelled"``
        and token counts estimated from it.
        """
        shown: list[str] = []

        def sink(text: str) -> None:
            shown.append(text)
            if on_text is not None:
                on_text(text)

        async def run() -> CloudReply:
            task = asyncio.ensure_future(
                self.send(decision, messages, max_tokens=max_tokens, temperature=temperature, on_text=sink)
            )
            while cancel is not None and not task.done():
                if cancel():
                    task.cancel()
                    break
                await asyncio.wait({task}, timeout=CANCEL_POLL_S)
            return await task

        try:
            return asyncio.run(run())
        except asyncio.CancelledError:
            assert decision.target is not None
            text = "".join(shown)
            tokens_out = math.ceil(len(text) / CHARS_PER_TOKEN)
            return CloudReply(
                text=text,
                target=decision.target.name,
                model=decision.target.model,
                finish_reason="cancelled",
                tokens_in=0,
                tokens_out=tokens_out,
                usage_reported=False,
                cost_usd=decision.target.cost_usd(0, tokens_out),
                bytes_sent=0,
            )
