"""The prompt's stable head (system prompt + repository map) is cached on disk across processes.

Each fresh ``Assistant`` here stands for a new daemon process: the only state it shares with
the earlier ones is the disk (index, measured costs, the persistent prefix cache).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openjarvis.assistant.service import Assistant, ChatAnswer, ChatRequest, IndexRetriever
from openjarvis.cli import main
from openjarvis.config import load_config
from openjarvis.engine.prefix_cache import PrefixCache, default_dir


@contextmanager
def fresh_assistant(*, prefix_cache: bool = True) -> Iterator[Assistant]:
    overrides = {"generation.drafter": "model", "engine.prefix_cache": str(prefix_cache).lower()}
    assistant = Assistant(load_config(overrides=overrides))
    try:
        yield assistant
    finally:
        assistant.unload()


def ask(ws: Path, question: str, *, prefix_cache: bool = True) -> ChatAnswer:
    with fresh_assistant(prefix_cache=prefix_cache) as assistant:
        return assistant.chat(ChatRequest(question, max_tokens=16, drafter="model"), IndexRetriever(ws))


def kv_files() -> set[Path]:
    return set(default_dir().glob("*.kv"))


def with_map(ws: Path) -> Path:
    """The tiny workspace plus a caller, so the repository map has something to rank, indexed."""
    (ws / "app" / "main.py").write_text(
        "from app.http import Router, parse_http_response\n\n\n"
        "def serve(raw: str) -> str:\n    return Router().route(raw) + str(parse_http_response(raw))\n"
    )
    assert main(["-c", "index.workers=1", "index", str(ws)]) == 0
    return ws


def test_the_head_is_a_token_exact_prefix_of_every_question(tiny_setup: Path) -> None:
    ws = with_map(tiny_setup)
    with fresh_assistant() as assistant:
        retriever = IndexRetriever(ws)
        a = assistant.prepare(ChatRequest("How is parse_http_response used?"), retriever)
        b = assistant.prepare(ChatRequest("What does Router.route return?"), retriever)
        assert a.tokens is not None and b.tokens is not None
        assert 64 < a.head == b.head < len(a.tokens)
        assert a.tokens[: a.head] == b.tokens[: b.head]
        v = assistant.speculator().verifier
        head_text = v.detokenize(a.tokens[: a.head]).decode()
        assert head_text.endswith("<|im_end|>\n") and "Repository map" in head_text
        assert "parse_http_response" in head_text and "How is" not in head_text


def test_a_new_process_loads_the_head_and_answers_the_same(tiny_setup: Path) -> None:
    ws = with_map(tiny_setup)
    first = ask(ws, "How is parse_http_response used?")
    assert first.stats["prefix_loaded"] == 0
    saved = kv_files()
    assert len(saved) == 2  # the verifier's head and the model drafter's, each keyed by its model

    question = "What does Router.route return?"
    loaded = ask(ws, question)
    assert loaded.stats["prefix_loaded"] > 64
    assert loaded.stats["drafter_prefix_loaded"] == loaded.stats["prefix_loaded"]
    assert loaded.stats["reused_tokens"] == 0
    without = ask(ws, question, prefix_cache=False)
    assert without.stats["prefix_loaded"] == 0
    assert loaded.text == without.text and loaded.stats["tokens"] == without.stats["tokens"]
    assert kv_files() == saved

    # A corrupt file is detected, ignored and replaced; the answer does not change.
    for path in saved:
        data = bytearray(path.read_bytes())
        data[-50] ^= 0xFF
        path.write_bytes(bytes(data))
    repaired = ask(ws, question)
    assert repaired.stats["prefix_loaded"] == 0 and repaired.stats["drafter_prefix_loaded"] == 0
    assert repaired.text == loaded.text
    assert kv_files() == saved
    assert ask(ws, question).stats["prefix_loaded"] == loaded.stats["prefix_loaded"]  # sound again

    # A changed repository map is a different head: the stale one is never loaded for it.
    http = ws / "app" / "http.py"
    http.write_text("import json\n\n" + http.read_text())  # every definition moves down two lines
    assert main(["-c", "index.workers=1", "index", str(ws)]) == 0
    changed = ask(ws, question)
    assert changed.stats["prefix_loaded"] == 0
    assert len(kv_files() - saved) == 2
    with fresh_assistant() as assistant:
        prepared = assistant.prepare(ChatRequest(question), IndexRetriever(ws))
        assert prepared.tokens is not None
        head = prepared.tokens[: prepared.head]
        assert "6: def parse_http_response" in assistant.speculator().verifier.detokenize(head).decode()
        assert PrefixCache().path_for(assistant.speculator().verifier, head) in kv_files() - saved
