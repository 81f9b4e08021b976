"""The daemon's methods: one small async function per protocol method, registered in ``METHODS``.

Handlers validate nothing by hand (``protocol.decode_params`` did) and block nothing: anything
slow is sent to a thread with ``asyncio.to_thread``. Feature areas (index, generation, edits)
register their methods here as they land, each in a few lines calling its own module.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from openjarvis import __version__
from openjarvis.daemon.protocol import (
    PROTOCOL_VERSION,
    CancelParams,
    CancelResult,
    ErrorCode,
    InitializeParams,
    InitializeResult,
    ModelInfo,
    ModelsListParams,
    ModelsListResult,
    ProtocolError,
    ShutdownParams,
    ShutdownResult,
    StatsParams,
    StatsResult,
)
from openjarvis.daemon.server import Call, Daemon, Method


async def initialize(params: InitializeParams, call: Call) -> InitializeResult:
    if params.protocol_version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.VERSION_MISMATCH,
            f"client speaks protocol {params.protocol_version}, daemon speaks {PROTOCOL_VERSION}; "
            "restart the daemon (`jarvis daemon stop`) after upgrading",
        )
    call.connection.initialized = True
    call.connection.client_name = params.client_name
    return InitializeResult(
        protocol_version=PROTOCOL_VERSION,
        server_version=__version__,
        pid=os.getpid(),
        methods=sorted(METHODS),
        capabilities={"streaming": True, "cancel": True},
    )


async def cancel(params: CancelParams, call: Call) -> CancelResult:
    task = call.connection.tasks.get(params.id)
    if task is None or task.done():
        return CancelResult(cancelled=False)
    task.cancel()
    return CancelResult(cancelled=True)


async def stats(params: StatsParams, call: Call) -> StatsResult:
    d = call.daemon
    return StatsResult(
        uptime_s=round(time.monotonic() - d.started, 3),
        connections=len(d.connections),
        requests=d.requests,
        in_flight=d.in_flight,
        workspaces=sorted(d.state["workspaces"].roots) if "workspaces" in d.state else [],
        models_loaded=_loaded_models(d),
    )


def _loaded_models(d: Daemon) -> list[str]:
    assistant = d.state.get("assistant")
    if assistant is None or not assistant.loaded:
        return []
    return [m for m in assistant.model_ids if m]


async def shutdown(params: ShutdownParams, call: Call) -> ShutdownResult:
    # Answer first, then stop: the caller learns the daemon heard it.
    asyncio.get_running_loop().call_later(0.05, call.daemon.stopping.set)
    return ShutdownResult(stopping=True)


async def models_list(params: ModelsListParams, call: Call) -> ModelsListResult:
    from openjarvis.config import load_config
    from openjarvis.models import Catalog

    def collect() -> list[ModelInfo]:
        catalog = Catalog.load(load_config())
        roles: dict[str, str] = {}
        for p in catalog.pairs.values():
            roles.setdefault(p.drafter, "drafter")
            roles.setdefault(p.verifier, "verifier")
        out = []
        for m in sorted(catalog.models.values(), key=lambda m: m.id):
            st = catalog.status(m)
            out.append(
                ModelInfo(m.id, roles.get(m.id, ""), m.quantization, m.size, st.installed, st.verified, str(st.path))
            )
        return out

    return ModelsListResult(models=await asyncio.to_thread(collect))


def _m(params: type, handler: Any, *, before_init: bool = False) -> Method:
    return Method(params, handler, before_init)


METHODS: dict[str, Method] = {
    "initialize": _m(InitializeParams, initialize, before_init=True),
    "cancel": _m(CancelParams, cancel),
    "stats": _m(StatsParams, stats),
    "shutdown": _m(ShutdownParams, shutdown),
    "models/list": _m(ModelsListParams, models_list),
}


def _register_assistant_methods() -> None:
    from openjarvis.daemon import assist
    from openjarvis.daemon import protocol as p

    METHODS.update(
        {
            "chat": _m(p.ChatParams, assist.chat),
            "complete": _m(p.CompleteParams, assist.complete),
            "generate": _m(p.GenerateParams, assist.generate),
            "search": _m(p.SearchParams, assist.search),
            "index/status": _m(p.IndexParams, assist.index_status),
            "index/add": _m(p.IndexParams, assist.index_add),
            "edits/preview": _m(p.EditsPreviewParams, assist.edits_preview),
            "edits/apply": _m(p.EditIdParams, assist.edits_apply),
            "edits/undo": _m(p.EditsUndoParams, assist.edits_undo),
            "conversations/list": _m(p.ConversationsListParams, assist.conversations_list),
            "conversations/get": _m(p.ConversationGetParams, assist.conversation_get),
        }
    )


_register_assistant_methods()
