"""The assistant on the tiny model pair: a chat answer pauses for an inline completion and resumes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from openjarvis.assistant.gate import CHAT
from openjarvis.assistant.service import Assistant, ChatRequest
from openjarvis.config import load_config


def test_chat_pauses_for_a_completion_and_the_answer_is_whole(tiny_setup: Path) -> None:
    assistant = Assistant(load_config())
    try:
        # The same answer without interruption, for comparison (greedy, so deterministic).
        plain = assistant.chat(ChatRequest("Explain Router.", max_tokens=40, drafter="none"), None)
        streamed: list[str] = []
        completion: dict[str, str] = {}

        def complete() -> None:
            completion["text"], _ = assistant.complete("def add(a, b):\n    return ", "\n", max_tokens=4)

        started: list[threading.Thread] = []

        def on_text(text: str) -> None:
            streamed.append(text)
            if not started:  # at the first token, an editor asks for a completion
                t = threading.Thread(target=complete)
                t.start()
                started.append(t)
                deadline = time.monotonic() + 5
                while not assistant.gate.urgent_waiting(CHAT) and time.monotonic() < deadline:
                    time.sleep(0.001)

        answer = assistant.chat(ChatRequest("Explain Router.", max_tokens=40, drafter="none"), None, on_text=on_text)
        started[0].join(10)
        assert "text" in completion  # the completion was served in the middle of the chat
        assert answer.stats["pauses"] == 1
        assert "".join(streamed) == answer.text
        assert answer.text == plain.text  # pausing changed nothing in the answer
        assert answer.stats["tokens"] == plain.stats["tokens"]
    finally:
        assistant.unload()
