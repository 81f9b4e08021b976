"""Protocol methods that do the assistant's work: chat, complete, search, index, edits, history.

Each handler is thin: it resolves the workspace, runs the blocking work in a worker thread with
``in_thread`` (which streams notifications back through the event loop and turns the asyncio
cancellation of the request into a flag the generation loop polls every step), and shapes the
result. The shared state (the warm ``Assistant``, the ``Workspaces``, previewed edits) lives in
``daemon.state``, created on first use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from openjarvis import paths
from openjarvis.daemon.protocol import (
    ChatParams,
    ChatResult,
    CompleteParams,
    CompleteResult,
    ConversationGetParams,
    ConversationGetResult,
    ConversationMessage,
    ConversationsListParams,
    ConversationsListResult,
    ConversationSummary,
    EditIdParams,
    EditsFilesResult,
    EditsPreviewParams,
    EditsPreviewResult,
    EditsUndoParams,
    ErrorCode,
    GenerateParams,
    GenerateResult,
    IndexAddResult,
    IndexParams,
    IndexStatusResult,
    ProtocolError,
    SearchHit,
    SearchParams,
    SearchResult,
    SourceRef,
)
from openjarvis.daemon.server import Call, Daemon
from openjarvis.errors import ContextOverflow, EditError, JarvisError, ModelError

T = TypeVar("T")
log = logging.getLogger("openjarvis.daemon")


def _state(daemon: Daemon) -> dict[str, Any]:
    st = daemon.state
    if "assistant" not in st:
        from openjarvis.assistant.service import Assistant
        from openjarvis.config import load_config
        from openjarvis.daemon.workspaces import Workspaces

        config = load_config(repo_file=False)  # per-repository settings apply per request
        st["config"] = config
        st["assistant"] = Assistant(config)
        st["workspaces"] = Workspaces(config)
        st["previews"] = {}

        idle = asyncio.create_task(_unload_when_idle(st["assistant"], config.daemon.idle_unload_minutes * 60.0))

        async def close() -> None:
            idle.cancel()
            await asyncio.to_thread(st["workspaces"].close)
            await asyncio.to_thread(st["assistant"].unload)

        daemon.on_shutdown.append(close)
    return st


async def _unload_when_idle(assistant: Any, idle_s: float) -> None:
    """Give the models' memory back after ``idle_s`` without a request (0 keeps them loaded)."""
    if idle_s <= 0:
        return
    while True:
        await asyncio.sleep(max(1.0, min(60.0, idle_s / 4)))
        if assistant.loaded and not assistant.gate.busy and time.monotonic() - assistant.last_used > idle_s:
            log.info("models idle for %.0f s: unloading", idle_s)
            await asyncio.to_thread(assistant.unload)


class Cancellation:
    """A request's cancellation as its worker thread sees it: calling it says whether the
    request was cancelled (polled every generation step); ``commit()`` is the point after
    which the work's effects stand (a conversation turn written), decided under one lock with
    the cancel itself, so a request is either dropped with nothing kept, or answered with what
    was kept, never told CANCELLED after its turn was saved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._committed = False

    def __call__(self) -> bool:
        return self._cancelled

    def commit(self) -> bool:
        """True: the work is past the point of no return (a later cancel is answered with its
        result); False: it was cancelled first and must keep nothing."""
        with self._lock:
            if not self._cancelled:
                self._committed = True
            return self._committed

    def cancel(self) -> bool:
        """Cancel unless the work has committed; True where it had (its result stands)."""
        with self._lock:
            if not self._committed:
                self._cancelled = True
            return self._committed


async def in_thread(call: Call, fn: Callable[[Cancellation, Callable[[str, dict[str, Any]], None]], T]) -> T:
    """Run ``fn(cancelled, notify)`` in a worker thread; cancelling the request stops it in one
    step, unless the work has committed (``Cancellation.commit``): then its result is the answer."""
    loop = asyncio.get_running_loop()
    stop = Cancellation()

    def notify(method: str, params: dict[str, Any]) -> None:
        params = {"request_id": call.id, **params}
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(call.notify(method, params)))

    future = loop.run_in_executor(None, fn, stop, notify)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if stop.cancel():  # too late to drop: what the work kept is the answer
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return await asyncio.shield(future)
        try:
            await future  # the worker stops within one step; never leave it running unseen
        except Exception:  # its own outcome no longer matters to anyone
            pass
        raise


def _workspace_config(root: Path) -> Any:
    """The settings as this repository sees them (its ``.jarvis.toml`` included)."""
    from openjarvis.config import load_config
    from openjarvis.errors import ConfigError

    try:
        return load_config(root)
    except ConfigError as exc:
        raise ProtocolError(ErrorCode.WORKSPACE_ERROR, str(exc)) from exc


def _mapped(exc: JarvisError) -> ProtocolError:
    if isinstance(exc, ModelError):
        return ProtocolError(ErrorCode.MODEL_UNAVAILABLE, str(exc))
    if isinstance(exc, EditError):
        return ProtocolError(ErrorCode.EDIT_FAILED, str(exc))
    if isinstance(exc, ContextOverflow):
        return ProtocolError(ErrorCode.INVALID_PARAMS, str(exc))
    return ProtocolError(ErrorCode.INTERNAL_ERROR, str(exc))


# -- index and search ------------------------------------------------------------------------------


async def index_add(params: IndexParams, call: Call) -> IndexAddResult:
    st = _state(call.daemon)
    ws = st["workspaces"].get(params.workspace)

    def work(cancelled: Callable[[], bool], notify: Callable[[str, dict[str, Any]], None]) -> Any:
        return st["workspaces"].index(ws, lambda done, total: notify("index/progress", {"done": done, "total": total}))

    s = await in_thread(call, work)
    return IndexAddResult(str(ws.root), s.scanned, s.indexed, s.unchanged, s.deleted, s.errors, round(s.seconds, 3))


async def index_status(params: IndexParams, call: Call) -> IndexStatusResult:
    st = _state(call.daemon)
    ws = st["workspaces"].get(params.workspace)

    def work(_c: Callable[[], bool], _n: Callable[[str, dict[str, Any]], None]) -> IndexStatusResult:
        from openjarvis.errors import IndexStoreError
        from openjarvis.index.store import open_readonly

        counts: dict[str, int] = {}
        last_run = None
        skipped: dict[str, int] = {}
        try:
            store = open_readonly(ws.root)
        except IndexStoreError:
            store = None
        if store is not None:
            try:
                counts = store.counts()
                last_run = store.get_meta("last_run")
                skipped = store.get_meta("skipped", {}) or {}
            finally:
                store.close()
        return IndexStatusResult(
            workspace=str(ws.root),
            indexed=last_run is not None,
            indexing=ws.indexing,
            watching=ws.watcher is not None,
            files=counts.get("files", 0),
            symbols=counts.get("symbols", 0),
            chunks=counts.get("chunks", 0),
            last_run=last_run,
            skipped=skipped,
            progress_done=ws.progress[0],
            progress_total=ws.progress[1],
        )

    return await in_thread(call, work)


async def search(params: SearchParams, call: Call) -> SearchResult:
    st = _state(call.daemon)
    ws = st["workspaces"].get(params.workspace)

    def work(_c: Callable[[], bool], notify: Callable[[str, dict[str, Any]], None]) -> SearchResult:
        from openjarvis.index.search import search as run_search
        from openjarvis.index.store import open_readonly

        st["workspaces"].ensure_indexed(ws, lambda d, t: notify("index/progress", {"done": d, "total": t}))
        store = open_readonly(ws.root)
        try:
            hits = run_search(store, params.query, k=params.k)
        finally:
            store.close()
        return SearchResult(
            [SearchHit(h.path, h.symbol, h.kind, h.start_line, h.end_line, round(h.score, 4), h.snippet) for h in hits]
        )

    return await in_thread(call, work)


# -- chat and complete -----------------------------------------------------------------------------


def _editor(params: ChatParams, root: Path) -> Any:
    from openjarvis.assistant.prompt import EditorContext

    e = params.editor
    if e is None:
        return None
    path = Path(e.path)
    rel = path.relative_to(root).as_posix() if path.is_absolute() and root in path.parents else e.path
    text = e.text
    if not text and (root / rel).is_file():
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
    return EditorContext(rel, text, e.selection, e.cursor_line)


async def chat(params: ChatParams, call: Call) -> ChatResult:
    from openjarvis.assistant.service import ChatRequest
    from openjarvis.engine.templates import Message
    from openjarvis.history import open_history

    st = _state(call.daemon)
    ws = st["workspaces"].get(params.workspace)

    def work(cancelled: Cancellation, notify: Callable[[str, dict[str, Any]], None]) -> ChatResult:
        started = time.time()
        config = _workspace_config(ws.root)
        st["workspaces"].ensure_indexed(ws, lambda d, t: notify("index/progress", {"done": d, "total": t}))
        with open_history() as db:
            conv = params.conversation
            if conv is not None and db.conversation(conv) is None:
                raise ProtocolError(ErrorCode.NOT_FOUND, f"no conversation {conv!r}; start a new one")
            history = tuple(Message(m.role, m.content) for m in db.messages(conv)) if conv else ()  # type: ignore[arg-type]
            req = ChatRequest(
                question=params.message,
                history=history,
                editor=_editor(params, ws.root),
                max_tokens=params.max_tokens or config.generation.max_tokens,
                temperature=params.temperature if params.temperature is not None else config.generation.temperature,
                drafter=params.drafter or config.generation.drafter,
            )
            routed = _answer_routed(st["assistant"], req, ws.root, config, params, cancelled, notify)
            answer = routed.answer
            sources = [SourceRef(s.path, s.symbol, s.start_line, s.end_line, round(s.score, 4)) for s in answer.sources]
            # A cancelled turn is not part of the conversation; that includes a cancel that came
            # just after the last token, which the caller is told about (CANCELLED) all the same.
            # Past commit() the turn is kept, and a cancel that comes later gets this answer.
            dropped = answer.cancelled or not cancelled.commit()
            if not dropped:
                if conv is None:
                    conv = db.new_conversation(str(ws.root), params.message)
                db.add_message(conv, "user", params.message)
                meta = {"sources": [s.path for s in sources], "stats": answer.stats, "route": routed.route}
                db.add_message(conv, "assistant", answer.text, meta)
            stats = answer.stats
            db.record_request(
                workspace=str(ws.root), method="chat", route=routed.route, model=routed.model,
                prompt_tokens=answer.prompt_tokens, completion_tokens=stats["tokens"], ttft_s=stats.get("ttft_s"),
                total_s=time.time() - started, tokens_per_s=stats.get("tokens_per_s"),
                acceptance=stats.get("acceptance"), cost_usd=stats.get("cost_usd", 0.0),
                outcome="cancelled" if dropped else "ok",
            )  # fmt: skip
        return ChatResult(
            answer=answer.text,
            conversation=conv or "",
            sources=sources,
            route=routed.route,
            model=routed.model,
            stats=stats,
            dropped=list(answer.dropped),
            route_reason=routed.reason,
            left_machine=routed.left_machine,
        )

    return await in_thread(call, work)


@dataclass
class _Routed:
    answer: Any
    route: str
    model: str
    reason: str
    left_machine: bool


def _answer_routed(
    assistant: Any,
    req: Any,
    root: Path,
    config: Any,
    params: ChatParams,
    cancelled: Callable[[], bool],
    notify: Callable[[str, dict[str, Any]], None],
) -> _Routed:
    """Decide local or elsewhere (the person's policy, a pure function), then answer there.

    Local first whenever the policy allows; a target takes over when the person asked, the prompt
    does not fit, the local engine failed, or (router.cloud = "auto") the local answer looked
    unsure or began repeating itself, in which case the client is told to replace what it showed (``chat/restart``).
    """
    from dataclasses import replace

    from openjarvis.assistant.service import IndexRetriever
    from openjarvis.errors import CloudError, EngineError
    from openjarvis.router.policy import RouteRequest, Signals
    from openjarvis.router.service import Router

    try:
        router = Router.for_workspace(root, config)  # the repository's settings, read once per request
    except JarvisError as exc:
        raise ProtocolError(ErrorCode.POLICY_REFUSED, str(exc)) from exc
    prepared = assistant.prepare(req, IndexRetriever(root))
    prompt_tokens = len(prepared.tokens) if prepared.tokens is not None else prepared.prompt.tokens
    rreq = RouteRequest(
        str(root),
        prompt_tokens,
        req.max_tokens,
        asked=params.route == "cloud",
        asked_target=params.target or "",
        confirmed=params.confirm_cloud,
        local_only=params.route == "local",
    )
    signals = Signals(local_context=prepared.local_context, local_error=prepared.local_error)
    decision = router.decide(rreq, signals)
    local_model = assistant.model_ids[1]
    if params.route == "cloud" and decision.local:
        # They asked for a target; answering here instead would be a surprise. Say why not.
        raise ProtocolError(ErrorCode.POLICY_REFUSED, decision.reason)
    if decision.local:
        if prepared.tokens is None:
            raise ProtocolError(ErrorCode.MODEL_UNAVAILABLE, prepared.local_error)
        try:
            answer = assistant.answer(
                req,
                prepared,
                on_text=lambda t: notify("chat/token", {"text": t}),
                cancel=cancelled,
                on_progress=lambda done, total: notify("chat/progress", {"done": done, "total": total}),
            )
        except EngineError as exc:
            decision = router.decide(rreq, replace(signals, local_error=str(exc)))
            if decision.local:
                raise _mapped(exc) from exc
        else:
            if answer.cancelled:
                return _Routed(answer, "local", local_model, "local", False)
            measured = replace(
                signals,
                mean_logprob=answer.stats.get("mean_logprob"),
                acceptance=answer.stats.get("acceptance"),
                answer_tokens=answer.stats["tokens"],
                repeated=answer.stats.get("finish_reason") == "repetition",
            )
            after = router.decide(rreq, measured)
            if after.needs_confirmation:  # the answer stands; the footer says what was held back
                held = f"{after.reason}: not sent (router.cloud = ask); ask again with --cloud or /cloud to send it"
                return _Routed(answer, "local", local_model, held, False)
            if after.local:
                return _Routed(answer, "local", local_model, "local", False)
            notify("chat/restart", {"reason": after.reason})
            decision = after
    if decision.needs_confirmation:
        raise ProtocolError(
            ErrorCode.POLICY_REFUSED,
            f"{decision.reason}: confirm to send (estimated ${decision.estimated_cost_usd:.4f})",
            {"needs_confirmation": True, "target": decision.target.name if decision.target else None},
        )
    messages = list(prepared.prompt.messages)
    try:
        reply = router.send_blocking(
            decision,
            messages,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            on_text=lambda t: notify("chat/token", {"text": t}),
            cancel=cancelled,
        )
    except CloudError as exc:
        raise ProtocolError(ErrorCode.CLOUD_ERROR, str(exc)) from exc
    from openjarvis.assistant.service import ChatAnswer

    stats = {
        "prompt_tokens": reply.tokens_in,
        "tokens": reply.tokens_out,
        "cost_usd": reply.cost_usd,
        "bytes_sent": reply.bytes_sent,
        "finish_reason": reply.finish_reason,
        "acceptance": None,
        "tokens_per_s": None,
        "ttft_s": None,
    }
    answer = ChatAnswer(
        text=reply.text,
        sources=prepared.prompt.sources,
        prompt_tokens=reply.tokens_in,
        stats=stats,
        dropped=prepared.prompt.dropped,
        cancelled=reply.finish_reason == "cancelled",
    )
    assert decision.target is not None
    return _Routed(answer, reply.target, reply.model, decision.reason, not decision.target.on_this_machine)


async def complete(params: CompleteParams, call: Call) -> CompleteResult:
    st = _state(call.daemon)

    def work(cancelled: Callable[[], bool], notify: Callable[[str, dict[str, Any]], None]) -> CompleteResult:
        try:
            text, stats = st["assistant"].complete(
                params.prefix,
                params.suffix,
                max_tokens=params.max_tokens,
                multiline=params.multiline,
                on_text=lambda t: notify("complete/token", {"text": t}),
                cancel=cancelled,
            )
        except JarvisError as exc:
            raise _mapped(exc) from exc
        return CompleteResult(text, stats)

    return await in_thread(call, work)


async def generate(params: GenerateParams, call: Call) -> GenerateResult:
    from openjarvis.engine.templates import Message

    st = _state(call.daemon)
    config = st["config"]
    if not params.messages:
        raise ProtocolError(ErrorCode.INVALID_PARAMS, "messages must not be empty")

    def work(cancelled: Callable[[], bool], notify: Callable[[str, dict[str, Any]], None]) -> GenerateResult:
        assistant = st["assistant"]
        try:
            text, prompt_tokens, stats = assistant.generate(
                [Message(m.role, m.content) for m in params.messages],
                max_tokens=params.max_tokens or config.generation.max_tokens,
                temperature=params.temperature if params.temperature is not None else config.generation.temperature,
                top_p=params.top_p if params.top_p is not None else config.generation.top_p,
                stop=tuple(params.stop),
                drafter=params.drafter or config.generation.drafter,
                seed=params.seed,
                on_text=lambda t: notify("generate/token", {"text": t}),
                cancel=cancelled,
            )
        except JarvisError as exc:
            raise _mapped(exc) from exc
        return GenerateResult(text, assistant.model_ids[1], stats["finish_reason"], prompt_tokens, stats)

    return await in_thread(call, work)


# -- edits -----------------------------------------------------------------------------------------


def _edits_dir() -> Path:
    return paths.data_dir() / "edits"


async def edits_preview(params: EditsPreviewParams, call: Call) -> EditsPreviewResult:
    from openjarvis.assistant.edits import parse_edits, plan_edits

    st = _state(call.daemon)
    ws = st["workspaces"].get(params.workspace)
    try:
        plan = await asyncio.to_thread(lambda: plan_edits(ws.root, parse_edits(params.text)))
    except EditError as exc:
        raise _mapped(exc) from exc
    edit_id = uuid.uuid4().hex[:12]
    st["previews"][edit_id] = plan
    return EditsPreviewResult(edit_id, plan.diff, [c.path for c in plan.changes])


async def edits_apply(params: EditIdParams, call: Call) -> EditsFilesResult:
    from openjarvis.assistant.edits import apply_plan

    st = _state(call.daemon)
    plan = st["previews"].get(params.edit_id)
    if plan is None:
        raise ProtocolError(ErrorCode.NOT_FOUND, f"no previewed edit {params.edit_id!r}; preview it first")

    def work(_c: Callable[[], bool], _n: Callable[[str, dict[str, Any]], None]) -> None:
        apply_plan(plan)
        record = {
            "root": str(plan.root),
            "applied": time.time(),
            "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in plan.changes],
        }
        d = _edits_dir()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{params.edit_id}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, d / f"{params.edit_id}.json")

    try:
        await in_thread(call, work)
    except EditError as exc:
        raise _mapped(exc) from exc
    del st["previews"][params.edit_id]
    return EditsFilesResult(params.edit_id, [c.path for c in plan.changes])


def _last_applied(root: Path) -> str | None:
    best: tuple[float, str] | None = None
    for f in _edits_dir().glob("*.json"):
        rec = json.loads(f.read_text())
        if rec["root"] == str(root) and not rec.get("undone") and (best is None or rec["applied"] > best[0]):
            best = (rec["applied"], f.stem)
    return best[1] if best else None


async def edits_undo(params: EditsUndoParams, call: Call) -> EditsFilesResult:
    from openjarvis.assistant.edits import EditPlan, FileChange, undo

    st = _state(call.daemon)
    ws = st["workspaces"].get(params.workspace)
    edit_id = params.edit_id or _last_applied(ws.root)
    path = _edits_dir() / f"{edit_id}.json"
    if edit_id is None or not path.is_file():
        raise ProtocolError(ErrorCode.NOT_FOUND, "no applied edit to undo in this workspace")
    rec = json.loads(path.read_text())
    if rec.get("undone"):
        raise ProtocolError(ErrorCode.EDIT_FAILED, f"edit {edit_id} was already undone")
    plan = EditPlan(Path(rec["root"]), tuple(FileChange(c["path"], c["before"], c["after"]) for c in rec["changes"]))
    try:
        await asyncio.to_thread(undo, plan)
    except EditError as exc:
        raise _mapped(exc) from exc
    rec["undone"] = time.time()
    path.write_text(json.dumps(rec))
    return EditsFilesResult(edit_id, [c.path for c in plan.changes])


# -- conversations ---------------------------------------------------------------------------------


async def conversations_list(params: ConversationsListParams, call: Call) -> ConversationsListResult:
    from openjarvis.history import open_history

    ws = _state(call.daemon)["workspaces"].get(params.workspace)

    def work() -> ConversationsListResult:
        with open_history() as db:
            rows = db.conversations(str(ws.root), params.limit)
        return ConversationsListResult([ConversationSummary(r.id, r.title, r.updated, r.messages) for r in rows])

    return await asyncio.to_thread(work)


async def conversation_get(params: ConversationGetParams, call: Call) -> ConversationGetResult:
    from openjarvis.history import open_history

    def work() -> ConversationGetResult:
        with open_history() as db:
            info = db.conversation(params.id)
            if info is None:
                raise ProtocolError(ErrorCode.NOT_FOUND, f"no conversation {params.id!r}")
            msgs = [ConversationMessage(m.role, m.content) for m in db.messages(params.id)]
        return ConversationGetResult(info.id, info.workspace, info.title, msgs)

    return await asyncio.to_thread(work)
