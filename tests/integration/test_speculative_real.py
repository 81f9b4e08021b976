"""Speculative decoding on the real default pair: greedy output equals the verifier alone's.

Kept short (the machine may have 2 cores): one copy-heavy prompt, 48 tokens per drafter. Copying
keeps the verifier's top-2 gaps wide; at near-ties batched verification may legitimately pick the
other token (docs/speculative.md), which is why this test does not use open-ended prose. One
thread: on a shared 2-core machine two llama.cpp threads collapse under load.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from openjarvis.engine.drafters import ModelDrafter
from openjarvis.engine.llama import LlamaEngine
from openjarvis.engine.speculative import Request, Speculator
from openjarvis.engine.templates import Message, render_chat

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engines(real_pair: tuple[Path, Path]) -> Iterator[tuple[LlamaEngine, LlamaEngine]]:
    drafter_path, verifier_path = real_pair
    with LlamaEngine(verifier_path, context=4096, threads=1) as v, LlamaEngine(
        drafter_path, context=4096, threads=1
    ) as d:
        yield v, d


def test_greedy_speculation_matches_verifier_alone(engines: tuple[LlamaEngine, LlamaEngine]) -> None:
    import colorsys

    v, d = engines
    src = inspect.getsource(colorsys).split("# HLS:")[0]
    text = render_chat(
        v.chat_template(),
        [Message("user", f"Return this code unchanged:\n```python\n{src}```")],
    )
    prompt = v.tokenize(text)
    spec = Speculator(v, model_drafter=ModelDrafter(d, verifier=v))
    expected = spec.generate(Request(prompt, max_tokens=48, drafter="none")).run().tokens
    assert v.detokenize(expected).decode().startswith("```python")
    for mode in ("ngram", "model", "auto"):
        gen = spec.generate(Request(prompt, max_tokens=48, drafter=mode)).run()
        assert gen.tokens == expected, mode
        if mode == "ngram":
            assert gen.stats.accepted > 24  # copying: most drafts accepted


def test_an_answer_writing_the_same_line_over_again_stops_at_the_fourth_copy(
        engines: tuple[LlamaEngine, LlamaEngine]) -> None:
    """``Request.loop_repeats``: greedy decoding writing one line again and again (asked to,
    here, so that it does so every time) stops as the fourth copy ends, with finish reason
    "repetition"; with 0 it goes on to the model's own end."""
    v, _ = engines
    line = "The root README comes first: it is the one page every repository has."
    text = render_chat(v.chat_template(),
                       [Message("user", f"Write this line 12 times, one per line, and nothing "
                                        f"else:\n{line}")])
    prompt, corpus = v.tokenize(text), (v.tokenize(line),)
    spec = Speculator(v)
    gen = spec.generate(Request(prompt, max_tokens=300, drafter="ngram", corpus=corpus)).run()
    assert gen.stats.finish_reason == "repetition"
    assert gen.text == (line + "\n") * 4
    free = spec.generate(Request(prompt, max_tokens=300, drafter="ngram", corpus=corpus,
                                 loop_repeats=0)).run()
    assert free.stats.finish_reason == "stop" and free.text.count(line) > 4
    assert free.text.startswith(gen.text)
    # An answer paused after two copies and resumed (the assistant's ``_run``: the prompt plus
    # what it emitted, and that text as ``loop_prefix``) stops at the same, fourth, copy.
    two = (line + "\n") * 2
    cut = [i for i in range(len(gen.tokens)) if v.detokenize(gen.tokens[:i]) == two.encode()]
    assert cut, "the answer's tokens end no prefix at the second copy's line end"
    resumed = spec.generate(Request(prompt + gen.tokens[: cut[0]], max_tokens=300,
                                    drafter="ngram", corpus=corpus, loop_prefix=two)).run()
    assert resumed.stats.finish_reason == "repetition" and resumed.text == two


def test_an_answer_repeating_a_sentence_within_one_line_stops_at_the_fourth_copy(
        engines: tuple[LlamaEngine, LlamaEngine]) -> None:
    """``repeats_in_line``: asked to, greedy decoding writes one sentence again and again on
    one line, which the line check never sees; it stops once four copies are written, with
    finish reason "repetition" (where the text stops inside the fifth); with 0 it goes on."""
    v, _ = engines
    sentence = "The index is kept fresh by a watcher that reparses changed files."
    text = render_chat(v.chat_template(), [Message(
        "user", "Write this sentence 12 times on one single line, separated by single spaces, "
                f"with no line breaks and nothing else:\n{sentence}")])
    prompt, corpus = v.tokenize(text), (v.tokenize(sentence + " "),)
    spec = Speculator(v)
    gen = spec.generate(Request(prompt, max_tokens=200, drafter="ngram", corpus=corpus)).run()
    assert gen.stats.finish_reason == "repetition"
    assert "\n" not in gen.text and gen.text.count(sentence) == 4
    assert gen.text.startswith(" ".join([sentence] * 4))
    free = spec.generate(Request(prompt, max_tokens=len(gen.tokens) + 20, drafter="ngram",
                                 corpus=corpus, loop_repeats=0)).run()
    assert free.stats.finish_reason != "repetition" and free.text.count(sentence) > 4
    assert free.text.startswith(gen.text)
