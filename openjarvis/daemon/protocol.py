"""The socket protocol, written down once: JSON-RPC 2.0 messages, their framing and error codes.

Framing: one JSON object per line (UTF-8, compact, ``\\n``-terminated). JSON strings escape
newlines, so a line is always one whole message; any language's line reader can frame it. A
message longer than ``MAX_MESSAGE_BYTES`` is refused with ``MESSAGE_TOO_LARGE`` and the
connection keeps working.

Every method's parameters and result are frozen dataclasses below; ``docs/protocol.md`` documents
each with an example exchange, and a test keeps the two in agreement. ``decode_params`` validates
incoming parameters against the dataclass (names and JSON types), so handlers receive typed
values and a bad request gets one clear ``INVALID_PARAMS`` line.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal, TypeVar

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
JSONRPC = "2.0"


class ErrorCode(IntEnum):
    """Stable error codes: JSON-RPC's own, then ours in -32000..-32099."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    MESSAGE_TOO_LARGE = -32001
    NOT_INITIALIZED = -32002
    SHUTTING_DOWN = -32003
    VERSION_MISMATCH = -32004
    CANCELLED = -32800
    MODEL_UNAVAILABLE = -32010
    WORKSPACE_ERROR = -32011
    POLICY_REFUSED = -32020
    CLOUD_ERROR = -32021
    EDIT_FAILED = -32030
    NOT_FOUND = -32040


class ProtocolError(Exception):
    """An error that becomes a JSON-RPC error object; ``message`` is one line for a person."""

    def __init__(self, code: ErrorCode, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": int(self.code), "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


# -- messages ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    id: int | str
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Response:
    id: int | str | None
    result: Any = None
    error: dict[str, Any] | None = None


Message = Request | Notification | Response


def encode(msg: Message) -> bytes:
    """One framed line."""
    obj: dict[str, Any] = {"jsonrpc": JSONRPC}
    if isinstance(msg, Request):
        obj.update(id=msg.id, method=msg.method, params=msg.params)
    elif isinstance(msg, Notification):
        obj.update(method=msg.method, params=msg.params)
    elif msg.error is not None:
        obj.update(id=msg.id, error=msg.error)
    else:
        obj.update(id=msg.id, result=msg.result)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes) -> Message:
    """Parse one line; raises ``ProtocolError`` (PARSE_ERROR / INVALID_REQUEST) when it is not one."""
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(ErrorCode.PARSE_ERROR, f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("jsonrpc") != JSONRPC:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, 'expected a JSON object with "jsonrpc": "2.0"')
    if "method" in obj:
        method, params = obj["method"], obj.get("params", {})
        if not isinstance(method, str) or not isinstance(params, dict):
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "method must be a string and params an object")
        if "id" in obj:
            if not isinstance(obj["id"], int | str) or isinstance(obj["id"], bool):
                raise ProtocolError(ErrorCode.INVALID_REQUEST, "id must be an integer or a string")
            return Request(obj["id"], method, params)
        return Notification(method, params)
    if "id" in obj and ("result" in obj or "error" in obj):
        return Response(obj["id"], obj.get("result"), obj.get("error"))
    raise ProtocolError(ErrorCode.INVALID_REQUEST, "neither a request, a notification nor a response")


# -- typed parameters and results ----------------------------------------------------------------

T = TypeVar("T")


def _check(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        for alt in typing.get_args(tp):
            try:
                return _check(alt, value, where)
            except ProtocolError:
                continue
        raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where}: unexpected value {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            allowed = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where} must be one of {allowed}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where} must be a list")
        (item,) = typing.get_args(tp)
        return [_check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where} must be an object")
        return value
    if tp is type(None):
        if value is not None:
            raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where} must be null")
        return None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where} must be an object")
        return decode_params(tp, value, where)  # type: ignore[arg-type]
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }[tp](value)
    if not ok:
        raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where} must be {tp.__name__}, got {type(value).__name__}")
    return float(value) if tp is float else value


def decode_params(cls: type[T], params: dict[str, Any], where: str = "params") -> T:
    """Build ``cls`` from a JSON object, checking names and types; unknown names are refused."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(params) - names
    if unknown:
        raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in params:
            kwargs[f.name] = _check(hints[f.name], params[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(ErrorCode.INVALID_PARAMS, f"{where}: missing required field {f.name!r}")
    return cls(**kwargs)


def to_json(obj: Any) -> Any:
    """A dataclass (or list of them) as plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj


@dataclass(frozen=True, slots=True)
class InitializeParams:
    protocol_version: int
    client_name: str
    capabilities: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InitializeResult:
    protocol_version: int
    server_version: str
    pid: int
    methods: list[str]
    capabilities: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CancelParams:
    id: int | str


@dataclass(frozen=True, slots=True)
class CancelResult:
    cancelled: bool


@dataclass(frozen=True, slots=True)
class StatsParams:
    pass


@dataclass(frozen=True, slots=True)
class StatsResult:
    uptime_s: float
    connections: int
    requests: int
    in_flight: int
    workspaces: list[str]
    models_loaded: list[str]


@dataclass(frozen=True, slots=True)
class ShutdownParams:
    pass


@dataclass(frozen=True, slots=True)
class ShutdownResult:
    stopping: bool


@dataclass(frozen=True, slots=True)
class ModelsListParams:
    pass


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    role: str
    quantization: str
    size: int
    installed: bool
    verified: bool | None
    path: str


@dataclass(frozen=True, slots=True)
class ModelsListResult:
    models: list[ModelInfo]


@dataclass(frozen=True, slots=True)
class EditorParams:
    """What the editor shows: the open file (relative or absolute path), its text, the selection."""

    path: str
    text: str = ""
    selection: str = ""
    cursor_line: int = 1


@dataclass(frozen=True, slots=True)
class SourceRef:
    path: str
    symbol: str
    start_line: int
    end_line: int
    score: float


@dataclass(frozen=True, slots=True)
class ChatParams:
    workspace: str
    message: str
    conversation: str | None = None
    editor: EditorParams | None = None
    route: Literal["auto", "local", "cloud"] = "auto"
    #: With ``route = "cloud"``: the target's name (default: the policy's preferred one).
    target: str | None = None
    #: The person confirmed sending this request off the machine (router.cloud = "ask").
    confirm_cloud: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    drafter: Literal["auto", "model", "ngram", "none"] | None = None


@dataclass(frozen=True, slots=True)
class ChatResult:
    answer: str
    conversation: str
    sources: list[SourceRef]
    route: str
    model: str
    stats: dict[str, Any]
    dropped: list[str]
    #: Why the request went where it did, in one line ("local", or the router's reason).
    route_reason: str = "local"
    #: True when the answer was produced off this machine (a cloud target).
    left_machine: bool = False


@dataclass(frozen=True, slots=True)
class CompleteParams:
    prefix: str
    suffix: str = ""
    max_tokens: int = 64
    multiline: bool = True
    workspace: str | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class CompleteResult:
    text: str
    stats: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SearchParams:
    workspace: str
    query: str
    k: int = 10


@dataclass(frozen=True, slots=True)
class SearchHit:
    path: str
    symbol: str
    kind: str
    start_line: int
    end_line: int
    score: float
    snippet: str


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: list[SearchHit]


@dataclass(frozen=True, slots=True)
class IndexParams:
    workspace: str


@dataclass(frozen=True, slots=True)
class IndexStatusResult:
    workspace: str
    indexed: bool
    indexing: bool
    watching: bool
    files: int
    symbols: int
    chunks: int
    last_run: float | None
    skipped: dict[str, int]
    #: While ``indexing``: files done and files to do in the run in progress.
    progress_done: int = 0
    progress_total: int = 0


@dataclass(frozen=True, slots=True)
class IndexAddResult:
    workspace: str
    scanned: int
    indexed: int
    unchanged: int
    deleted: int
    errors: int
    seconds: float


@dataclass(frozen=True, slots=True)
class EditsPreviewParams:
    workspace: str
    text: str


@dataclass(frozen=True, slots=True)
class EditsPreviewResult:
    edit_id: str
    diff: str
    files: list[str]


@dataclass(frozen=True, slots=True)
class EditIdParams:
    edit_id: str


@dataclass(frozen=True, slots=True)
class EditsUndoParams:
    workspace: str
    edit_id: str | None = None


@dataclass(frozen=True, slots=True)
class EditsFilesResult:
    edit_id: str
    files: list[str]


@dataclass(frozen=True, slots=True)
class ConversationsListParams:
    workspace: str
    limit: int = 50


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    id: str
    title: str
    updated: float
    messages: int


@dataclass(frozen=True, slots=True)
class ConversationsListResult:
    conversations: list[ConversationSummary]


@dataclass(frozen=True, slots=True)
class ConversationGetParams:
    id: str


@dataclass(frozen=True, slots=True)
class ConversationMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class ConversationGetResult:
    id: str
    workspace: str
    title: str
    messages: list[ConversationMessage]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """Generation from the caller's own messages: no retrieval, no history, no system prompt added."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    drafter: Literal["auto", "model", "ngram", "none"] | None = None
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class GenerateResult:
    text: str
    model: str
    finish_reason: str
    prompt_tokens: int
    stats: dict[str, Any]
