"""What the assistant puts in front of the model for a question, from a real index of a small repo."""

from __future__ import annotations

from pathlib import Path

from openjarvis.assistant.service import Assistant, ChatRequest, IndexRetriever
from openjarvis.config import load_config


def test_an_overview_question_puts_the_readme_opening_in_the_prompt(
        overview_repo: Path, overview_question: str) -> None:
    """Within a budget that holds only part of what retrieval offers, the README's opening is kept."""
    config = load_config(overview_repo, overrides={"generation.prompt_budget": "350"})
    # No model is installed in the test's home: the prompt is still built, sized by an estimate.
    prepared = Assistant(config).prepare(ChatRequest(overview_question), IndexRetriever(overview_repo))
    assert prepared.tokens is None and prepared.local_error
    prompt = prepared.prompt
    assert ("README.md", 1) in [(s.path, s.start_line) for s in prompt.sources]
    assert "Tiny shop is a point-of-sale tool" in prompt.messages[-1].content
    assert any("retrieved chunks" in note for note in prompt.dropped), "the budget did cut something"


def test_a_question_about_one_definition_keeps_it_first(overview_repo: Path) -> None:
    config = load_config(overview_repo)
    prepared = Assistant(config).prepare(
        ChatRequest("How does this project compute price_order totals?"), IndexRetriever(overview_repo)
    )
    first = prepared.prompt.sources[0]
    assert (first.path, first.symbol) == ("shop/pricing/orders.py", "price_order")
