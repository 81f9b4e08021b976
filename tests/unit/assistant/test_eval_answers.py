"""scripts/eval_answers.py's judge: what counts as an answer that says what it should."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_answers import QUESTIONS, judge, load_questions

TERMS = ["daemon", "index", "router", "speculative"]


def test_an_answer_that_uses_enough_of_the_terms_passes() -> None:
    v = judge("The client asks the daemon; the router picks local, and speculative decoding answers.",
              "stop", TERMS, 3)
    assert v.passed and v.found == ("daemon", "router", "speculative") and v.why == ""


def test_the_three_failures_a_person_would_see() -> None:
    # the 1.5B's reply to a code question this session: a file name alone
    bare = judge("openjarvis/config.py:277", "stop", ["config.py"], 1)
    assert not bare.passed and bare.why == "a bare citation (0 words besides citations)"
    looped = judge("The daemon indexes.\n" * 6 + "router speculative", "repetition", TERMS, 2)
    assert not looped.passed and looped.why == "stopped: it began repeating itself"
    missed = judge("It is a tool that helps people write software on their own machines.", "stop", TERMS, 2)
    assert not missed.passed and missed.why == "uses 0 of the terms, needs 2"


def test_the_question_set_is_well_formed_and_a_bad_line_is_named(tmp_path: Path) -> None:
    assert len(load_questions(QUESTIONS)) >= 8
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "q", "expect": ["a"], "need": 1}\n{"question": "q", "expect": ["a"], "need": 2}\n')
    with pytest.raises(SystemExit, match=r"q.jsonl:2: each line needs question, expect \(terms\) and need"):
        load_questions(bad)


def test_saved_answers_are_judged_again_against_revised_terms(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from eval_answers import main

    q = {"question": "Where does a request flow?", "expect": ["daemon", "rout"], "need": 2}
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps(q) + "\n")
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"answers": [{**q, "expect": ["daemon", "router"], "tokens": 30,
                                              "finish_reason": "stop",
                                              "answer": "The client asks the daemon, then routing decides where."}]}))
    assert main(["--questions", str(questions), "--rejudge", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "| Where does a request flow? | 30 | stop | 2 of 2 (needs 2) | pass |" in out
    assert out.endswith("1 of 1 answers pass\n")
