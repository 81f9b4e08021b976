"""The speculator on the tiny pair: greedy equivalence, exact sampling, stops, streaming, cancel."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from stats_helpers import chi_square_p

from openjarvis.engine.drafters import ModelDrafter
from openjarvis.engine.llama import LlamaEngine
from openjarvis.engine.prefix_cache import run_of
from openjarvis.engine.sampling import SamplingParams, distribution
from openjarvis.engine.speculative import PREFILL_CHUNK, Request, Speculator
from openjarvis.errors import IncompatiblePair

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nWrite a function that returns the sum of a list.<|im_end|>\n"
    "<|im_start|>assistant\n",
    # Repetitive text, so the n-gram drafter finds matches.
    "for index in range(10):\n    print(index)\n" * 4,
]


def plain(verifier: LlamaEngine, prompt: list[int], **kw: object) -> list[int]:
    return Speculator(verifier).generate(Request(prompt, drafter="none", **kw)).run().tokens


@pytest.mark.parametrize("mode", ["model", "ngram", "auto"])
def test_greedy_output_equals_verifier_alone(
    mode: str, verifier: LlamaEngine, drafter: LlamaEngine
) -> None:
    spec = Speculator(verifier, model_drafter=ModelDrafter(drafter, verifier=verifier))
    for text in PROMPTS:
        prompt = verifier.tokenize(text)
        expected = plain(verifier, prompt, max_tokens=160)
        gen = spec.generate(Request(prompt, max_tokens=160, drafter=mode)).run()
        assert gen.tokens == expected
        assert gen.text == verifier.detokenize(expected).decode("utf-8", errors="replace")
    if mode == "model":
        # The tiny pair agrees often but not always: drafts were both accepted and rejected.
        model = gen.stats.per_drafter["model"]
        assert 0 < model.accepted < model.drafted


def test_forced_ngram_drafts_from_the_corpus(verifier: LlamaEngine) -> None:
    prompt = verifier.tokenize(PROMPTS[0])
    expected = plain(verifier, prompt, max_tokens=60)
    # The caller's corpus holds the answer itself: every draft is accepted.
    spec = Speculator(verifier)
    gen = spec.generate(
        Request(prompt, max_tokens=60, drafter="ngram", corpus=(prompt + expected,))
    ).run()
    assert gen.tokens == expected
    ngram = gen.stats.per_drafter["ngram"]
    assert ngram.accepted == ngram.drafted > 30
    assert gen.stats.steps < len(expected) / 3


def test_stop_string_inside_an_accepted_draft(verifier: LlamaEngine) -> None:
    prompt = verifier.tokenize(PROMPTS[0])
    full_tokens = plain(verifier, prompt, max_tokens=60)
    full = verifier.detokenize(full_tokens).decode("utf-8", errors="replace")
    stop = full[25:29]
    spec = Speculator(verifier)
    gen = spec.generate(
        Request(prompt, max_tokens=60, drafter="ngram", stop=(stop,), corpus=(prompt + full_tokens,))
    )
    pieces = [p.text for p in gen]
    assert gen.text == "".join(pieces) == full[: full.index(stop)]
    assert gen.stats.finish_reason == "stop"
    assert len(pieces) > 3  # streamed, not returned in one piece


def test_max_tokens_inside_an_accepted_draft(verifier: LlamaEngine) -> None:
    prompt = verifier.tokenize(PROMPTS[0])
    full = plain(verifier, prompt, max_tokens=60)
    gen = Speculator(verifier).generate(
        Request(prompt, max_tokens=17, drafter="ngram", corpus=(prompt + full,))
    ).run()
    assert gen.tokens == full[:17]
    assert gen.stats.finish_reason == "length"


def test_mean_logprob_is_kept_only_when_asked_and_matches_the_logits(verifier: LlamaEngine) -> None:
    prompt = verifier.tokenize(PROMPTS[0])
    full = plain(verifier, prompt, max_tokens=20)
    verifier.rollback(0)
    rows = verifier.eval(prompt + full[:-1])[len(prompt) - 1 :]
    ref = np.mean([r[t] - (r.max() + np.log(np.exp(r - r.max()).sum())) for r, t in zip(rows, full, strict=True)])
    verifier.rollback(0)
    asked = Speculator(verifier).generate(
        Request(prompt, max_tokens=20, drafter="ngram", corpus=(prompt + full,), logprobs=True)
    ).run()
    assert asked.tokens == full and asked.stats.logprob_count == 20
    assert asked.stats.mean_logprob == pytest.approx(ref, abs=2e-3)  # batched vs one-row evals
    verifier.rollback(0)
    plain_run = Speculator(verifier).generate(Request(prompt, max_tokens=20)).run()
    assert plain_run.stats.mean_logprob is None  # no softmax per token when nobody reads it


def test_eos_ends_the_answer_and_is_not_emitted(verifier: LlamaEngine) -> None:
    prompt = verifier.tokenize(PROMPTS[1])
    full = plain(verifier, prompt, max_tokens=400)
    gen = Speculator(verifier).generate(Request(prompt, max_tokens=400)).run()
    assert gen.tokens == full
    assert not set(gen.tokens) & verifier.eos_token_ids
    assert gen.stats.finish_reason == ("stop" if len(full) < 400 else "length")


def test_cancel_stops_within_one_step(verifier: LlamaEngine, drafter: LlamaEngine) -> None:
    spec = Speculator(verifier, model_drafter=ModelDrafter(drafter))
    cancelled = False
    gen = spec.generate(
        Request(verifier.tokenize(PROMPTS[0]), max_tokens=200, drafter="model", max_draft=4),
        cancel=lambda: cancelled,
    )
    seen = 0
    for _ in gen:
        seen += 1
        if seen == 5:
            cancelled = True
    assert gen.stats.finish_reason == "cancelled"
    assert 5 <= len(gen.tokens) <= 5 + 4  # at most the rest of one verified draft (+1 token)


def test_drafter_with_another_tokenizer_is_refused(
    verifier: LlamaEngine, other: LlamaEngine
) -> None:
    with pytest.raises(IncompatiblePair, match="tokenizer differs"):
        ModelDrafter(other, verifier=verifier)


def test_stats_count_every_draft(verifier: LlamaEngine, drafter: LlamaEngine) -> None:
    spec = Speculator(verifier, model_drafter=ModelDrafter(drafter))
    gen = spec.generate(Request(verifier.tokenize(PROMPTS[0]), max_tokens=50, drafter="model"))
    gen.run()
    s = gen.stats
    assert s.tokens == len(gen.tokens) == 50
    assert s.drafted == s.per_drafter["model"].drafted > 0
    assert 0 <= s.accepted <= s.drafted
    assert s.ttft is not None and s.ttft <= s.time_total
    assert "tok/s" in s.line() and "model" in s.line()


@pytest.mark.parametrize("mode", ["model", "ngram"])
def test_sampling_first_token_follows_the_verifier_distribution(
    mode: str, verifier: LlamaEngine, drafter: LlamaEngine
) -> None:
    """Chi-square: tokens emitted by the draft/accept/reject step are distributed as p."""
    params = SamplingParams(temperature=1.5, top_k=40)
    text = "for index in range(10):\n    print(index)\nfor index in range(10):\n    print("
    prompt = verifier.tokenize(text)
    p = distribution(verifier.eval(prompt, last_only=True)[0], params)
    verifier.rollback(0)
    spec = Speculator(verifier, model_drafter=ModelDrafter(drafter))
    # The corpus continues the whole prompt with the 4th likeliest token: a poor guess.
    corpus = (prompt + [int(np.argsort(-p)[3]), 7, 8],)
    n = 1500
    seen: Counter[int] = Counter()
    for seed in range(n):
        gen = spec.generate(
            Request(prompt, max_tokens=2, sampling=params, drafter=mode, seed=seed, corpus=corpus)
        ).run()
        seen[gen.tokens[0] if gen.tokens else gen.stop_token] += 1
    assert spec.acceptance.accepted or spec.acceptance.rejected  # drafts were really verified
    assert chi_square_p(seen, p, n) > 0.001


def test_near_tie_recheck_keeps_output_and_counts(
    verifier: LlamaEngine, drafter: LlamaEngine
) -> None:
    prompt = verifier.tokenize(PROMPTS[0])
    expected = plain(verifier, prompt, max_tokens=40)
    # A huge margin treats every batched row as a near-tie: each is re-decided single-token.
    spec = Speculator(verifier, model_drafter=ModelDrafter(drafter), tie_margin=100.0)
    gen = spec.generate(Request(prompt, max_tokens=40, drafter="model")).run()
    assert gen.tokens == expected
    assert gen.stats.tie_rechecks > 0


def test_greedy_decisions_from_argmaxes_equal_those_from_the_rows(verifier: LlamaEngine) -> None:
    """Greedy verify steps now get each row's argmax alone (``base.greedy_eval``): deciding on
    those gives the same tokens, accepted drafts and cache length as deciding on the rows."""
    from openjarvis.engine.stats import Stats

    spec = Speculator(verifier)
    rng = np.random.default_rng(0)
    req = Request([1, 2, 3])
    for k in (0, 1, 4):
        rows = rng.standard_normal((k + 1, 50)).astype(np.float32)
        best = [int(np.argmax(r)) for r in rows]
        for n_ok in range(k + 1):  # the drafts right up to n_ok, then wrong
            drafted = tuple(best[:n_ok]) + tuple((b + 1) % 50 for b in best[n_ok:k])
            batch = [7, *drafted]
            from_rows = spec._decide(req, rows, None, batch, drafted, None, 10, rng, Stats())
            from_picks = spec._decide(req, None, best, batch, drafted, None, 10, rng, Stats())
            assert from_rows == from_picks
            assert from_rows[1] == n_ok and from_rows[2] == 10 + 1 + n_ok
            assert from_rows[0] == best[: n_ok + 1]


LOOPED = (
    "- The root README comes first: it is the one page nearly every repository has.\n"
    "- Then the other root documents, then the docs folder's.\n"
)


def test_an_answer_writing_one_block_of_lines_over_again_is_caught_at_its_nth_copy() -> None:
    """``repeats_itself``: the answer the default 1.5B wrote about this repository (a two-line
    block 24 times) is caught as its third or fourth copy ends, at a line end only."""
    from openjarvis.engine.speculative import repeats_itself

    head = "The repository does the following:\n- It indexes the codebase you work in.\n"
    assert not repeats_itself(head + LOOPED * 3, 4)
    assert repeats_itself(head + LOOPED * 4, 4)
    assert repeats_itself(head + LOOPED * 3, 3)
    assert not repeats_itself(head + LOOPED * 4 + "- The root", 4)  # not mid-line
    assert not repeats_itself(head + LOOPED * 4, 0)  # 0: never
    # a copy that differs anywhere breaks the run
    broken = LOOPED * 2 + LOOPED.replace("folder's", "folder") + LOOPED
    assert not repeats_itself(head + broken, 4)
    # the last copies are found however long the answer before them
    assert repeats_itself("x" * 100_000 + "\n" + LOOPED * 4, 4)


def test_short_lines_a_real_answer_repeats_never_stop_it() -> None:
    """Closing braces, ``pass`` bodies, blank lines and a table's rule repeat in real answers:
    a block counts only with LOOP_MIN_CHARS non-blank characters."""
    from openjarvis.engine.speculative import LOOP_MIN_CHARS, repeats_itself

    # (however many copies of a short line one block holds: its distinct lines are counted)
    for text in ("}\n" * 20, "    pass\n" * 20, "\n" * 20, "|---|---|\n" * 10, "x = 1\ny = 2\n" * 6,
                 "    [0, 0, 0, 0, 0, 0, 0, 0],\n" * 8, "# ----------\n" * 40, "\n" * 8191):
        assert not repeats_itself(text, 4), text[:20]
    line = "y" * LOOP_MIN_CHARS + "\n"
    assert repeats_itself(line * 4, 4) and not repeats_itself(line[1:] * 4, 4)


class _Bytes:
    """An engine's detokenizer only: token i is the i-th byte string given."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces

    def detokenize(self, tokens: list[int]) -> bytes:
        return b"".join(self.pieces[t] for t in tokens)


def test_a_paused_generation_hands_on_a_split_character_and_a_held_stop_string() -> None:
    """``Generation.text_state`` -> ``Request.text_state``: what the assistant's pause carries, so
    an answer paused inside a character or a stop string reads as one without the pause."""
    from openjarvis.engine.speculative import _TextOut

    eng = _Bytes(b"caf", b"\xc3", b"\xa9 <|im", b"_end|>", b"ok")
    first = _TextOut(eng, ("<|im_end|>",))  # type: ignore[arg-type]
    assert [first.push(t) for t in (0, 1)] == [("caf", False), ("", False)]
    state = first.state()
    assert state == (b"\xc3", "")
    assert first.flush() == "\ufffd"  # what the pause's flush would have shown, and now does not
    second = _TextOut(eng, ("<|im_end|>",), state)  # type: ignore[arg-type]
    assert second.push(2) == ("é ", False)  # the character whole; "<|im" held as a stop's start
    third = _TextOut(eng, ("<|im_end|>",), second.state())  # type: ignore[arg-type]
    assert third.push(3) == ("", True)  # the stop string completes across the second pause
    assert third.state() == (b"", "") and third.flush() == ""


SENTENCE = "The index is kept fresh by a watcher that reparses changed files. "


def test_an_answer_looping_within_one_line_is_caught_at_its_nth_copy() -> None:
    """``repeats_in_line``: a sentence written again and again with no line end, which the
    line check never sees, is caught once the fourth copy is written, wherever the text
    stops inside a copy; a copy that differs breaks the run."""
    from openjarvis.engine.speculative import repeats_in_line

    head = "Here is how it works:\n- Indexing: "
    assert not repeats_in_line(head + SENTENCE * 3, 4)
    assert repeats_in_line(head + SENTENCE * 4, 4)
    assert repeats_in_line(head + SENTENCE * 4 + SENTENCE[:17], 4)  # mid-copy: still a loop
    assert repeats_in_line(head + SENTENCE * 3, 3)
    assert not repeats_in_line(head + SENTENCE * 4, 0)  # 0: never
    assert not repeats_in_line(head + SENTENCE * 4 + "\nNext line", 4)  # the last line only
    broken = SENTENCE * 2 + SENTENCE.replace("fresh", "current") + SENTENCE
    assert not repeats_in_line(head + broken, 4)
    assert repeats_in_line("x" * 7000 + " " + SENTENCE * 4, 4)


def test_short_units_a_real_line_repeats_never_stop_it() -> None:
    """Lists of zeros, rules, padding, repeated calls and rows of data repeat a unit within
    one line however long: the shortest unit must read as a sentence (LOOP_MIN_UNIT_CHARS
    non-blank characters, LOOP_MIN_WORDS distinct words; a unit repeated is not a longer
    unit), or as a short one written LOOP_SHORT_FACTOR times as often."""
    from openjarvis.engine.speculative import LOOP_SHORT_FACTOR, repeats_in_line

    for text in ("[" + "0, " * 400, "# " + "-" * 300, " " * 500, "x = " + "f(a) + " * 80,
                 "| --- " * 60, "0x00000000, " * 50, "ab" * 2000, "the the " * 100,
                 "board = [" + "[0, 0, 0, 0, 0, 0, 0, 0, 0], " * 9,
                 "m = [" + "[0.0, 0.0, 0.0, 0.0, 0.0], " * 5, "VALUES " + "(NULL, NULL, NULL, NULL), " * 9,
                 "ids = [" + "'00000000-0000-0000-0000-000000000000', " * 6,
                 "box-shadow: " + "0 0 0 1px rgba(0,0,0,.1), " * 8):
        assert not repeats_in_line(text, 4), text[:20]
        assert not repeats_in_line(text, 4, code=True), text[:20]
    short = "I do not know. "  # 11 non-blank characters, two words of three letters or more
    assert not repeats_in_line(short * (4 * LOOP_SHORT_FACTOR - 1), 4)
    assert repeats_in_line(short * 4 * LOOP_SHORT_FACTOR, 4)
    assert not repeats_in_line(short * 200, 4, code=True)  # in code, never a short unit


def test_a_loop_ending_in_a_run_of_one_character_is_still_found() -> None:
    """The nearest repeat of the line's end can be a short run inside the unit ("===="): the
    search goes on to the unit's own length."""
    from openjarvis.engine.speculative import repeats_in_line

    unit = "The watcher batches the events it sees ==== "
    assert repeats_in_line("head: " + unit * 4 + "The watcher batches the events it sees ====", 4)


def test_the_loop_check_holds_fenced_code_to_its_rule_and_sees_a_line_a_piece_ended() -> None:
    """``_LoopCheck``: inside fenced code (which writes rows of data) a line stops only where
    a sentence-like unit runs LOOP_CODE_FACTOR times as long as in prose: a runaway parameter
    list does (the 1.5B wrote one for 400 tokens answering "How do I add a new configuration
    option?"), and so do 16 identical records of three words or more, as four identical lines
    already do anywhere; records of fewer words never do. A piece that ends a looping line and
    starts the next is still caught, judged by the fences before that line's end; a resumed
    generation counts the fences and copies of its prefix."""
    from openjarvis.engine.speculative import LOOP_CODE_FACTOR, _LoopCheck

    code = "```python\nrows = [" + '{"name": "a b c", "value": 0}, ' * 20 + "]\n"
    check = _LoopCheck(4, "")
    assert not any(check.push(code[i : i + 7]) for i in range(0, len(code), 7))
    assert check.fences == 1
    params = "name: str, value: int, default: str, help: str, "
    head = "```python\ndef add_option(self, "
    runaway = head + params * 4 * LOOP_CODE_FACTOR
    check = _LoopCheck(4, "")
    first = next(i + 7 for i in range(0, len(runaway), 7) if check.push(runaway[i : i + 7]))
    assert first > len(head) + (4 * LOOP_CODE_FACTOR - 1) * len(params)  # in the 16th copy
    in_code = _LoopCheck(4, "```text\n")
    assert in_code.push(SENTENCE * 4) is False  # four copies: prose's loop, not code's
    assert in_code.push(SENTENCE * (4 * LOOP_CODE_FACTOR - 4)) is True
    # a piece that ends a line and then opens or closes a fence: the line ended is judged by
    # where it was written
    row = '"hello world", ' * 20  # a short unit: a loop in prose at 12 copies, never in code
    closing = _LoopCheck(4, "```text\n")
    assert [closing.push(p) for p in (row[:100], row[100:-1] + "\n```")] == [False, False]
    opening = _LoopCheck(4, "")
    pieces = [SENTENCE * 3, SENTENCE[:-1], " \n```"]
    assert [opening.push(p) for p in pieces] == [False, False, True]
    records = '{"name": "Alice", "role": "admin"}, '  # three words: identical records stop
    rows = _LoopCheck(4, "```json\n[")
    assert rows.push(records * (4 * LOOP_CODE_FACTOR - 1)) is False
    assert rows.push(records) is True
    check = _LoopCheck(4, "```\nx\n```\n")  # a closed block before: prose again
    pieces = [SENTENCE * 3, SENTENCE[:-1], " \nNext"]
    assert [check.push(p) for p in pieces] == [False, False, True]
    resumed = _LoopCheck(4, "Intro.\n" + SENTENCE * 3)
    assert resumed.push(SENTENCE[:30]) is False and resumed.push(SENTENCE[30:]) is True
    assert _LoopCheck(0, "").push(SENTENCE * 10) is False
    split = _LoopCheck(4, "")  # a fence of four backticks, streamed as three and one: one fence
    for piece in ("```", "`", "python\n"):
        split.push(piece)
    assert split.fences == 1


LONG = "import os\nimport sys\n" * 50 + PROMPTS[2]


def test_the_prompt_is_read_in_runs_that_report_progress_and_answer_as_one_run_would(
    verifier: LlamaEngine,
) -> None:
    """A long prompt is prefilled in runs of ``PREFILL_CHUNK`` with progress after each, and the
    answer is the one a single run of the prompt gives (the runs leave the same cache bits)."""
    prompt = verifier.tokenize(LONG)
    n = len(prompt) - 1  # the last prompt token is evaluated by the first step
    assert n > 2 * PREFILL_CHUNK
    seen: list[tuple[int, int]] = []
    gen = Speculator(verifier).generate(
        Request(prompt, max_tokens=24, drafter="none"), progress=lambda d, t: seen.append((d, t))
    ).run()
    assert seen == [(min(n, d), n) for d in range(PREFILL_CHUNK, n + PREFILL_CHUNK, PREFILL_CHUNK)]
    # The reference: the prompt in one eval call, then one greedy token at a time.
    verifier.rollback(0)
    verifier.eval(prompt[:-1], last_only=True)
    expected, tok = [], prompt[-1]
    for _ in range(len(gen.tokens)):
        tok = int(np.argmax(verifier.eval([tok])[0]))
        expected.append(tok)
    assert gen.tokens == expected


def test_a_cancel_while_the_prompt_is_read_stops_at_the_next_run_and_keeps_what_was_read(
    verifier: LlamaEngine,
) -> None:
    prompt = verifier.tokenize(LONG)
    n = len(prompt) - 1
    spec = Speculator(verifier)
    seen: list[tuple[int, int]] = []
    gen = spec.generate(
        Request(prompt, max_tokens=24, drafter="none"),
        cancel=lambda: bool(seen),  # cancelled as soon as the first run is read
        progress=lambda d, t: seen.append((d, t)),
    )
    assert list(gen) == [] and gen.tokens == []
    assert gen.stats.finish_reason == "cancelled" and gen.stats.ttft is None
    assert seen == [(PREFILL_CHUNK, n)]
    assert verifier.n_past == PREFILL_CHUNK == len(spec.cached)
    # Asked again, the request reads on from there and answers as a fresh reader would.
    seen.clear()
    again = spec.generate(Request(prompt, max_tokens=24, drafter="none"),
                          progress=lambda d, t: seen.append((d, t))).run()
    assert again.stats.reused_tokens == PREFILL_CHUNK and seen[-1] == (n - PREFILL_CHUNK,) * 2
    assert again.tokens == plain(verifier, prompt, max_tokens=24)


def test_a_generation_stopped_while_reading_hands_on_the_text_it_continues(
    verifier: LlamaEngine,
) -> None:
    """A generation that continues a paused one (``Request.text_state``) and is cancelled
    before its first token passes the decoder's state on unchanged and lets out what it held,
    as a cancel in the loop would: here the start of a stop string."""
    prompt = verifier.tokenize(LONG)
    gen = Speculator(verifier).generate(
        Request(prompt, max_tokens=8, drafter="none", stop=("<|im_end|>",), text_state=(b"", "<|im")),
        cancel=lambda: True,
    )
    pieces = list(gen)
    assert gen.tokens == [] and gen.stats.finish_reason == "cancelled"
    assert gen.text_state == (b"", "<|im")  # a pause would resume from here
    assert [p.text for p in pieces] == ["<|im"] and not pieces[0].tokens


def test_a_cancel_while_the_model_drafter_catches_up_stops_within_a_run(
    verifier: LlamaEngine, drafter: LlamaEngine
) -> None:
    """The model drafter's first draft of a request reads the whole prompt: in runs, with the
    cancel polled between them, not in one call."""
    prompt = verifier.tokenize(LONG)
    md = ModelDrafter(drafter, verifier=verifier)
    spec = Speculator(verifier, model_drafter=md)
    gen = spec.generate(Request(prompt, max_tokens=24, drafter="model"),
                        cancel=lambda: drafter.n_past >= PREFILL_CHUNK)
    assert list(gen) == [] and gen.stats.finish_reason == "cancelled"
    assert drafter.n_past == PREFILL_CHUNK == len(md.cached) < len(prompt) - 1
    # Asked again, it reads on and drafts as before.
    again = spec.generate(Request(prompt, max_tokens=24, drafter="model")).run()
    assert again.tokens == plain(verifier, prompt, max_tokens=24)
    assert again.stats.per_drafter["model"].drafted > 0


def test_an_engine_with_runs_of_its_own_reads_the_prompt_in_them(
    verifier: LlamaEngine, drafter: LlamaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that asks for longer runs (``prefill_run``: the torch engine on a GPU, one wide
    step of 1,024) is read in them, the verifier's prompt and the model drafter's catching up
    alike, with progress and the cancel between runs; the answer is the same. A run that is not
    a multiple of ``RUN`` is not taken."""
    run = 2 * PREFILL_CHUNK
    assert run_of(verifier) == PREFILL_CHUNK
    monkeypatch.setattr(verifier, "prefill_run", PREFILL_CHUNK + 1, raising=False)
    assert run_of(verifier) == PREFILL_CHUNK
    monkeypatch.setattr(verifier, "prefill_run", run, raising=False)
    monkeypatch.setattr(drafter, "prefill_run", run, raising=False)
    prompt = verifier.tokenize(LONG)
    n = len(prompt) - 1
    assert n > run
    seen: list[tuple[int, int]] = []
    gen = Speculator(verifier).generate(
        Request(prompt, max_tokens=24, drafter="none"), progress=lambda d, t: seen.append((d, t))
    ).run()
    assert seen == [(min(n, d), n) for d in range(run, n + run, run)]
    assert gen.tokens == plain(verifier, prompt, max_tokens=24)
    md = ModelDrafter(drafter, verifier=verifier)
    spec = Speculator(verifier, model_drafter=md)
    stopped = spec.generate(Request(prompt, max_tokens=24, drafter="model"),
                            cancel=lambda: drafter.n_past >= PREFILL_CHUNK)
    assert list(stopped) == [] and stopped.stats.finish_reason == "cancelled"
    assert drafter.n_past == run == len(md.cached)  # one run of the drafter's own


@pytest.mark.parametrize("read_ahead_s", [0.0, math.inf])
def test_the_answer_starts_while_the_model_drafter_is_still_reading_the_prompt(
    verifier: LlamaEngine, drafter: LlamaEngine, read_ahead_s: float
) -> None:
    """After a long prompt the model drafter has all of it to read before its first draft.
    Where that would hold up a step longer than ``read_ahead_s`` (the tiny drafter reads fast:
    0 stands in for a slow one), the first step reads none of it and each later step a run,
    while the verifier answers alone; the answer is the verifier's, and once caught up the
    drafter drafts. (``math.inf``: the order before, everything read ahead of the first step.)"""
    prompt = verifier.tokenize(LONG)
    assert 2 * PREFILL_CHUNK < len(prompt) < 3 * PREFILL_CHUNK
    md = ModelDrafter(drafter, verifier=verifier)
    spec = Speculator(verifier, model_drafter=md, read_ahead_s=read_ahead_s)
    gen = spec.generate(Request(prompt, max_tokens=48, drafter="model"))
    read: list[int] = []  # what the drafter had read of this context at each piece of the answer
    for _piece in gen:
        read.append(len(md.cached))
    assert gen.tokens == plain(verifier, prompt, max_tokens=48)
    assert gen.stats.per_drafter["model"].drafted > 0
    if read_ahead_s == 0:
        # nothing at the first token, a run at the second; at the third step the drafter lacks
        # less than a run, which its draft reads: it drafts from there
        assert read[:2] == [0, PREFILL_CHUNK] and read[2] > len(prompt)
    else:  # the whole prompt read before the first token (and as much of a draft as the
        # planner's k asked for: none of it evaluated where k is 1)
        assert read[0] >= len(prompt)
