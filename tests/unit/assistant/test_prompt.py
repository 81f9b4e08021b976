"""Budgeted prompt assembly: what fits, what is dropped first, and the overflow error."""

from __future__ import annotations

import pytest

from openjarvis.assistant.prompt import SYSTEM_PROMPT, EditorContext, Source, assemble
from openjarvis.engine.templates import Message
from openjarvis.errors import ContextOverflow


def words(text: str) -> int:
    return len(text.split())


def src(name: str, score: float, n: int = 20) -> Source:
    return Source(f"{name}.py", 1, n, "\n".join(f"line {i} of {name}" for i in range(n)), symbol=name, score=score)


def test_everything_fits_in_a_large_budget() -> None:
    p = assemble(
        "what does foo do?",
        budget=10_000,
        count=words,
        history=[Message("user", "hi"), Message("assistant", "hello")],
        sources=[src("foo", 2.0), src("bar", 1.0)],
        editor=EditorContext("app.py", "a\nb\nc", selection="b", cursor_line=2),
        repo_map="foo.py:\n  def foo()\nbar.py:\n  def bar()",
    )
    assert [m.role for m in p.messages] == ["system", "user", "assistant", "user"]
    # The system turn is the stable head: the system prompt and the map, nothing question-bound.
    assert p.messages[0].content == f"{SYSTEM_PROMPT}\n\nRepository map (the most relevant definitions):\n" + (
        "foo.py:\n  def foo()\nbar.py:\n  def bar()"
    )
    assert p.stable == 1
    user = p.messages[-1].content
    assert user.index("Selected in app.py") < user.index("Open in the editor: app.py") < user.index("Relevant code")
    assert user.index("foo.py:1-20 (foo)") < user.index("bar.py:1-20 (bar)")  # best first
    assert user.endswith("\n\nwhat does foo do?")  # the question comes last
    assert [s.path for s in p.sources] == ["foo.py", "bar.py"]
    assert p.dropped == ()
    assert p.tokens <= 10_000


def test_the_head_does_not_depend_on_the_question() -> None:
    """Whatever the question brings (chunks, history, an editor), the map keeps its size and place."""
    repo_map = "\n".join(f"f{i}.py: def f{i}()" for i in range(100))
    heads = {
        assemble(q, budget=300, count=words, repo_map=repo_map, map_budget=60, sources=srcs, history=hist).messages[0]
        for q, srcs, hist in [
            ("q", [], []),
            ("a much longer question " * 5, [src("big", 1.0, 60)], []),
            ("why?", [src("a", 2.0), src("b", 1.0)], [Message("user", "x " * 50), Message("assistant", "y " * 50)]),
        ]
    }
    assert len(heads) == 1
    # ...also when one request is re-assembled at a smaller budget (room for the answer locally).
    small = assemble("q", budget=200, count=words, repo_map=repo_map, map_budget=60, sources=[src("a", 1.0)])
    assert small.messages[0] in heads


def test_lower_priorities_are_dropped_first_and_reported() -> None:
    p = assemble(
        "q",
        budget=250,
        count=words,
        sources=[src("best", 3.0, 10), src("good", 2.0, 10), src("meh", 1.0, 60)],
        repo_map="\n".join(f"f{i}.py: def f{i}()" for i in range(100)),
    )
    assert [s.path for s in p.sources] == ["best.py", "good.py"]
    assert "1 of 3 retrieved chunks" in p.dropped
    assert "part of the repository map" in p.dropped
    # The map got its reserved share (MAP_SHARE: 50 of 250) before the chunks: 12 lines of 3 words + 1.
    assert p.messages[0].content.count(".py: def ") == 12
    assert p.tokens <= 250


def test_history_keeps_whole_recent_turns() -> None:
    history = [Message("user" if i % 2 == 0 else "assistant", f"turn {i} " + "x " * 20) for i in range(10)]
    p = assemble("now?", budget=200, count=words, history=history)
    kept = [m.content.split()[1] for m in p.messages[1:-1]]
    assert kept == [str(i) for i in range(10 - len(kept), 10)]  # the most recent, in order
    assert 0 < len(kept) < 10
    assert f"{10 - len(kept)} of 10 earlier messages" in p.dropped


def test_open_file_window_is_around_the_cursor() -> None:
    text = "\n".join(f"line{i}" for i in range(1, 1001))
    p = assemble("q", budget=120, count=words, editor=EditorContext("big.py", text, cursor_line=500))
    window = p.messages[-1].content
    assert "line500" in window and "line1\n" not in window and "line1000" not in window


def test_question_that_cannot_fit_is_an_overflow() -> None:
    with pytest.raises(ContextOverflow, match="the question alone needs .* prompt budget is 50"):
        assemble("word " * 100, budget=50, count=words)


def test_chunks_are_cut_at_a_wide_gap_in_their_scores_and_not_reported_dropped() -> None:
    # The README's own question: design and README pages, then a docstring that mentions READMEs.
    p = assemble("what does this repository do?", budget=10_000, count=words,
                 sources=[src("design", 0.168), src("design2", 0.165), src("readme", 0.144),
                          src("readme2", 0.085), src("rank", 0.041)])
    assert [s.path for s in p.sources] == ["design.py", "design2.py", "readme.py", "readme2.py"]
    assert "rank.py" not in p.messages[-1].content and p.dropped == ()
    kept = [
        # a code question's chunks score alike; a named symbol's definition scores 2-3x the rest
        [0.065, 0.047, 0.044, 0.042, 0.041],
        [0.104, 0.052, 0.050, 0.037, 0.0366],
        # a cluster across any share of the best is never split
        [0.143, 0.128, 0.085, 0.081, 0.049, 0.048, 0.0475, 0.047],
        # past the first three only: the gap after the best does not cut
        [0.3, 0.05, 0.04, 0.035],
        [0.0, 0.0, 0.0, 0.0],
    ]
    for scores in kept:
        chunks = [src(f"c{i}", x) for i, x in enumerate(scores)]
        got = assemble("where is x?", budget=10_000, count=words, sources=chunks).sources
        assert [s.score for s in got] == scores
