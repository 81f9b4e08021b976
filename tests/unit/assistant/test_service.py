"""The assistant on the tiny model pair: a chat answer pauses for an inline completion and resumes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from openjarvis.assistant.gate import CHAT
from openjarvis.assistant.service import Assistant, ChatRequest
from openjarvis.config import load_config


def ask_for_a_completion(assistant: Assistant, done: Any) -> threading.Thread:
    """An editor's completion on a thread of its own (``done(text)`` once served), returned
    once the gate sees it waiting, so the chat will pause for it at its next poll."""

    def complete() -> None:
        done(assistant.complete("def add(a, b):\n    return ", "\n", max_tokens=4)[0])

    t = threading.Thread(target=complete)
    t.start()
    deadline = time.monotonic() + 5
    while not assistant.gate.urgent_waiting(CHAT) and time.monotonic() < deadline:
        time.sleep(0.001)
    return t


def test_chat_pauses_for_a_completion_and_the_answer_is_whole(
    tiny_setup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openjarvis.engine.speculative import Speculator

    requests: list[Any] = []
    generate = Speculator.generate

    def spy(self: Speculator, req: Any, *a: Any, **k: Any) -> Any:
        requests.append(req)
        return generate(self, req, *a, **k)

    monkeypatch.setattr(Speculator, "generate", spy)
    assistant = Assistant(load_config())
    try:
        # The same answer without interruption, for comparison (greedy, so deterministic).
        plain = assistant.chat(ChatRequest("Explain Router.", max_tokens=40, drafter="none"), None)
        streamed: list[str] = []
        completion: dict[str, str] = {}
        started: list[threading.Thread] = []

        def on_text(text: str) -> None:
            streamed.append(text)
            if not started:  # at the first token, an editor asks for a completion
                started.append(ask_for_a_completion(assistant, lambda t: completion.update(text=t)))

        del requests[:]
        answer = assistant.chat(ChatRequest("Explain Router.", max_tokens=40, drafter="none"), None, on_text=on_text)
        started[0].join(10)
        # the resumed generation was handed the answer so far, so a loop spanning the pause counts
        chat = [r for r in requests if r.max_tokens > 4]
        assert [r.loop_prefix for r in chat][0] == "" and len(chat) == 2
        assert chat[1].loop_prefix and answer.text.startswith(chat[1].loop_prefix)
        assert len(chat[1].prompt) - len(chat[0].prompt) == chat[0].max_tokens - chat[1].max_tokens
        assert "text" in completion  # the completion was served in the middle of the chat
        assert answer.stats["pauses"] == 1
        assert "".join(streamed) == answer.text
        assert answer.text == plain.text  # pausing changed nothing in the answer
        assert answer.stats["tokens"] == plain.stats["tokens"]
    finally:
        assistant.unload()


def test_a_completion_asked_while_the_chat_reads_its_prompt_goes_first(tiny_setup: Path) -> None:
    """The chat's prompt is read in runs with the gate asked between them: an editor's
    completion waits for one run, not the whole prompt, and the chat then reads on and gives
    the answer it would have given uninterrupted."""
    assistant = Assistant(load_config())
    question = "Explain Router.\n" + "The router reads the policy file and decides.\n" * 8
    try:
        plain = assistant.chat(ChatRequest(question, max_tokens=30, drafter="none"), None)
        assistant.unload()  # so that the prompt is read again, not found in the models' memory
        events: list[str] = []
        started: list[threading.Thread] = []
        reads: list[tuple[int, int]] = []

        def on_progress(done: int, total: int) -> None:
            reads.append((done, total))
            events.append("read")
            if not started:  # after the first run of the prompt, an editor asks for a completion
                started.append(ask_for_a_completion(assistant, lambda _t: events.append("completion")))

        answer = assistant.chat(
            ChatRequest(question, max_tokens=30, drafter="none"),
            None,
            on_text=lambda _t: events.append("token"),
            on_progress=on_progress,
        )
        started[0].join(10)
        # the chat paused partway through its prompt for the completion (not only once it had
        # read it all), then read on and answered
        first = events.index("completion")
        before = reads[: events[:first].count("read")]
        assert before and before[-1][0] < before[-1][1]
        assert events.index("token") > first
        assert answer.stats["pauses"] == 1 and answer.stats["ttft_s"] is not None
        assert reads[0][1] > 128 and reads[-1][0] == reads[-1][1]  # the prompt read to its end
        assert answer.text == plain.text
    finally:
        assistant.unload()
