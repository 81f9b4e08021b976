"""`jarvis serve --http` driven by a client no one here wrote: the official `openai` package."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from openjarvis.daemon.openai_http import open_http
from openjarvis.errors import DaemonError


@pytest.fixture
def endpoint(tiny_daemon: Path) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    srv, client = loop.run_until_complete(open_http("127.0.0.1", 0))
    port = srv.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:

        async def close() -> None:
            srv.close()
            await srv.wait_closed()
            await client.close()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_models_and_a_plain_completion(endpoint: str) -> None:
    with openai.OpenAI(base_url=endpoint, api_key="unused", max_retries=0) as client:
        ids = [m.id for m in client.models.list()]
        assert ids[0] == "openjarvis" and "tiny-v" in ids
        resp = client.chat.completions.create(
            model="openjarvis", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=6, temperature=0
        )
        choice = resp.choices[0]
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")
        assert resp.usage is not None and 1 <= resp.usage.completion_tokens <= 6 and resp.usage.prompt_tokens > 5
        # Greedy is deterministic: the same request gives the same text.
        again = client.chat.completions.create(
            model="openjarvis", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=6, temperature=0
        )
        assert again.choices[0].message.content == choice.message.content


def test_streaming_matches_the_plain_answer(endpoint: str) -> None:
    with openai.OpenAI(base_url=endpoint, api_key="unused", max_retries=0) as client:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "class Stack:"}]
        plain = client.chat.completions.create(model="tiny-v", messages=messages, max_tokens=8, temperature=0)
        stream = client.chat.completions.create(
            model="tiny-v", messages=messages, max_tokens=8, temperature=0, stream=True
        )
        parts, finishes = [], []
        for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finishes.append(chunk.choices[0].finish_reason)
        assert "".join(parts) == plain.choices[0].message.content
        assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])


def test_errors_in_openai_shape(endpoint: str) -> None:
    with openai.OpenAI(base_url=endpoint, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
        assert "model 'gpt-9' not found" in str(err.value)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="openjarvis", messages=[])
    r = httpx.post(f"{endpoint}/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "request body is not valid JSON"
    assert httpx.get(f"{endpoint}/nothing").status_code == 404


def test_only_loopback_is_served() -> None:
    with pytest.raises(DaemonError, match="binds loopback addresses only"):
        asyncio.run(open_http("0.0.0.0", 0))
