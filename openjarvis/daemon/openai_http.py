"""``jarvis serve --http``: an OpenAI-compatible endpoint on 127.0.0.1, backed by the daemon.

Tools people already use (editors, agents, the ``openai`` package) can point at Jarvis:
``POST /v1/chat/completions`` (streaming as server-sent events, or not) and ``GET /v1/models``.
The server is a client of the daemon like every other (its ``generate`` method), so the local pair,
speculative decoding, scheduling and telemetry are the same for it. It binds loopback addresses
only; the minimal HTTP/1.1 here (one request per connection, close-delimited bodies) is all these
clients need and keeps the dependency list short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

from openjarvis.daemon.client import AsyncClient
from openjarvis.errors import DaemonError
from openjarvis.netguard import is_loopback

log = logging.getLogger("openjarvis.http")

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large",
           500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip


class HTTPError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def _head(status: int, content_type: str, length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}", f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    else:
        lines.append("Cache-Control: no-cache")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _json_response(status: int, obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return _head(status, "application/json", len(body)) + body


def _error_body(err: HTTPError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": "invalid_request_error", "code": err.code, "param": None}}


def _parse_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "messages must be a non-empty array")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise HTTPError(400, f"messages[{i}].role must be system, user or assistant")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise HTTPError(400, f"messages[{i}].content must be a string")
        out.append({"role": m["role"], "content": content})
    return out


class OpenAIServer:
    def __init__(self, client: AsyncClient, model_ids: list[str]) -> None:
        self.client = client
        self.model_ids = model_ids

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except HTTPError as err:
            writer.write(_json_response(err.status, _error_body(err)))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # top-level request loop: log and answer 500, keep serving
            log.exception("request failed")
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(_json_response(500, _error_body(HTTPError(500, "internal error", "server_error"))))
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise HTTPError(413, "request headers too large") from None
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, _ = lines[0].split(" ", 2)
        except ValueError:
            raise HTTPError(400, "malformed request line") from None
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        path = target.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            if method != "GET":
                raise HTTPError(405, "use GET /v1/models")
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "openjarvis"} for m in self.model_ids]
            writer.write(_json_response(200, {"object": "list", "data": data}))
            return
        if path != "/v1/chat/completions":
            raise HTTPError(
                404, f"no route {path}; this server offers /v1/chat/completions and /v1/models", "not_found"
            )
        if method != "POST":
            raise HTTPError(405, "use POST /v1/chat/completions")
        length = int(headers.get("content-length", "0") or 0)
        if length > MAX_BODY_BYTES:
            raise HTTPError(413, f"request body over {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        try:
            body = json.loads(await reader.readexactly(length))
        except json.JSONDecodeError:
            raise HTTPError(400, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "request body must be a JSON object")
        await self._chat(body, writer)

    async def _chat(self, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        model = body.get("model") or self.model_ids[0]
        if model not in self.model_ids:
            raise HTTPError(404, f"model {model!r} not found; GET /v1/models lists them", "model_not_found")
        params: dict[str, Any] = {"messages": _parse_messages(body)}
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None:
            params["max_tokens"] = int(max_tokens)
        for key in ("temperature", "top_p", "seed"):
            if body.get(key) is not None:
                params[key] = body[key]
        stop = body.get("stop")
        if stop:
            params["stop"] = [stop] if isinstance(stop, str) else list(stop)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if not body.get("stream"):
            try:
                result = await self.client.call("generate", params)
            except DaemonError as exc:
                raise HTTPError(503 if exc.code is None else 400, str(exc), "jarvis_error") from exc
            writer.write(_json_response(200, _completion(cid, created, model, result)))
            return
        await self._stream(params, writer, cid, created, model)

    async def _stream(
        self, params: dict[str, Any], writer: asyncio.StreamWriter, cid: str, created: int, model: str
    ) -> None:
        writer.write(_head(200, "text/event-stream"))

        def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
            obj: dict[str, Any] = {
                "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }  # fmt: skip
            if usage is not None:
                obj["usage"] = usage
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        writer.write(chunk({"role": "assistant", "content": ""}))
        stream = self.client.stream("generate", params)
        try:
            async for method, payload in stream:
                if method == "generate/token":
                    writer.write(chunk({"content": payload["text"]}))
                    await writer.drain()
                elif method == "result":
                    usage = _usage(payload)
                    writer.write(chunk({}, _finish(payload["finish_reason"]), usage))
        except (ConnectionError, OSError):
            # The HTTP client went away: stop generating for it.
            with contextlib.suppress(DaemonError, ConnectionError, OSError):
                await self.client.cancel(self.client.last_request_id)
            return
        except DaemonError as exc:
            err = {"error": {"message": str(exc), "type": "server_error", "code": "jarvis_error"}}
            writer.write(b"data: " + json.dumps(err).encode() + b"\n\n")
        writer.write(b"data: [DONE]\n\n")


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(result: dict[str, Any]) -> dict[str, int]:
    completion = int(result["stats"]["tokens"])
    return {
        "prompt_tokens": int(result["prompt_tokens"]),
        "completion_tokens": completion,
        "total_tokens": int(result["prompt_tokens"]) + completion,
    }


def _completion(cid: str, created: int, model: str, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result["text"]},
                "finish_reason": _finish(result["finish_reason"]),
            }
        ],
        "usage": _usage(result),
    }


async def open_http(host: str, port: int) -> tuple[asyncio.Server, AsyncClient]:
    """Connect to the daemon (starting it if needed) and listen; the caller serves and closes."""
    if not is_loopback(f"http://{host}/"):
        raise DaemonError(f"refusing to listen on {host}: the HTTP endpoint binds loopback addresses only")
    client = await AsyncClient(client_name="jarvis-http").connect()
    models = (await client.call("models/list"))["models"]
    ids = ["openjarvis", *(m["id"] for m in models if m["role"] == "verifier" and m["installed"])]
    server = OpenAIServer(client, ids)
    try:
        srv = await asyncio.start_server(server.handle, host, port, limit=MAX_HEADER_BYTES)
    except OSError as exc:
        await client.close()
        raise DaemonError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port") from exc
    return srv, client


async def serve_http(host: str, port: int) -> None:
    """Serve until interrupted."""
    srv, client = await open_http(host, port)
    try:
        async with srv:
            addr = srv.sockets[0].getsockname()
            log.info("OpenAI-compatible endpoint on http://%s:%d/v1", addr[0], addr[1])
            print(f"serving OpenAI-compatible API on http://{addr[0]}:{addr[1]}/v1 (Ctrl-C stops)", flush=True)
            await srv.serve_forever()
    finally:
        await client.close()
