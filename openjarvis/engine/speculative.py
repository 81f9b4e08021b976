"""Draft-then-verify decoding over any verifier Engine and drafters of the same vocabulary.

Each step the planner (``planner.choose``) picks a drafter and a draft length k from measured
costs and tracked acceptance, k = 0 meaning plain decoding. The verifier evaluates the pending
token plus the k drafts in one call; drafts are accepted while they match (greedy) or pass the
speculative-sampling test (``sampling.accept_draft``), and the verifier's own next token follows.

Guarantees (tested in tests/unit/engine/test_speculative.py and, on the real pair, in
tests/integration/test_speculative_real.py; see docs/speculative.md):

- Sampling: every emitted token is distributed exactly as the verifier's (temperature, top-k,
  top-p applied), whatever the drafter.
- Greedy: every emitted token is the argmax of the verifier's logits for its position, as
  computed in verification. llama.cpp computes batched rows (and the KV entries of batched
  tokens) with other kernels than single-token steps: measured top-2 gap shifts of up to 0.68
  logits on the real pair. So the output equals the verifier decoding alone up to the first
  position whose top-2 gap is below that shift; after it both are valid greedy continuations.
  ``drafter="none"`` is identical by construction. docs/speculative.md has the measurements.
- Stops (EOS, stop strings, max tokens) falling inside an accepted draft end the answer exactly
  there; text is streamed token by token, held back only while it could still become a stop
  string or is an incomplete UTF-8 character. ``cancel`` is polled once per step, and
  between runs of ``PREFILL_CHUNK`` prompt tokens (an engine's own runs where it asks for
  them: ``prefix_cache.run_of``) while the prompt is prefilled (``progress`` is told how far
  that has got).

Example::

    spec = Speculator(verifier, model_drafter=ModelDrafter(drafter, verifier=verifier))
    gen = spec.generate(Request(prompt=verifier.tokenize(text), max_tokens=128))
    for piece in gen:
        print(piece.text, end="")
    print(gen.stats.line())
"""

from __future__ import annotations

import codecs
import functools
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from openjarvis.config import LOOP_REPEATS
from openjarvis.engine.base import CostModel, Engine, greedy_eval
from openjarvis.engine.drafters import Draft, ModelDrafter
from openjarvis.engine.ngram import NgramDrafter
from openjarvis.engine.planner import Acceptance, Option, Plan, choose
from openjarvis.engine.prefix_cache import (
    RUN,
    PrefixCache,
    common_prefix,
    eval_head,
    eval_runs,
    restore_head,
    run_of,
)
from openjarvis.engine.sampling import (
    SamplingParams,
    accept_draft,
    distribution,
    greedy,
    top2_gap,
)
from openjarvis.engine.stats import Stats
from openjarvis.errors import ContextOverflow, EngineError

DrafterChoice = Literal["auto", "model", "ngram", "none"]

#: Greedy rows of a multi-token batch whose top-2 logit gap is below this are recomputed as a
#: single-token step. Off: measured on the real pair it did not reduce divergence from the
#: verifier alone (the recomputation still reads batched KV entries); see docs/speculative.md.
TIE_MARGIN = 0.0
#: Longest draft considered.
MAX_DRAFT = 16
#: An n-gram lookup costs microseconds; price it so the planner never treats it as free.
NGRAM_COST_S = 0.00005


@dataclass(frozen=True, slots=True)
class Request:
    prompt: Sequence[int]
    max_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    drafter: DrafterChoice = "auto"
    seed: int | None = None
    #: Extra token sequences the n-gram drafter may copy from (file being edited, chunks).
    corpus: tuple[Sequence[int], ...] = ()
    #: Leading prompt tokens forming a stable head (system prompt + repository map): prefilled as
    #: a run of its own, and loaded from / saved to the disk cache when one is attached.
    cache_prefix: int = 0
    max_draft: int = MAX_DRAFT
    #: Keep the emitted tokens' mean log-probability (``Stats.mean_logprob``, the router's
    #: confidence signal): a softmax over the vocabulary per token, so only where it is read.
    logprobs: bool = False
    #: Stop once the answer ends in one block of whole lines written this many times in a row
    #: (``repeats_itself``), or its last line in one span written this many times with nothing
    #: between (``repeats_in_line``); finish reason "repetition"; 0 (or 1): never. Greedy
    #: decoding of a small model can fall into such a loop (the default 1.5B, asked about this
    #: repository, wrote one two-line block 24 times) and would otherwise fill ``max_tokens``
    #: with it.
    loop_repeats: int = LOOP_REPEATS
    #: The answer's text so far where this generation continues one (a chat answer paused for
    #: more urgent work and resumed): the loop check counts its lines with the new ones, so a
    #: loop that spans the pause stops at the same copy as one that does not.
    loop_prefix: str = ""
    #: Where this generation continues one that was paused: the text decoder's state then (the
    #: bytes of a character not yet complete, and text held back as the start of a stop string;
    #: ``Generation.text_state``), so a character or a stop string split by the pause comes out
    #: whole, as it would have without the pause.
    text_state: tuple[bytes, str] = (b"", "")


#: The prompt is prefilled in runs of this many tokens (``prefix_cache.RUN``), ``cancel`` polled
#: and ``progress`` told between them; the model drafter catches up in runs too (its engine's). A
#: 1,350-token prompt takes about 45 s to prefill on a 2-core AVX2 machine (the 1.5B at 30
#: tokens/s, compute-bound), all of it deaf before to a cancel and to a more urgent request
#: waiting for the gate. Runs of 128 prefilled as fast as one run there (runs of 128, 256 and
#: 512: 31-38, 31-35 and 30-33 tokens/s), and give the same state (``eval_runs`` says where).
#: An engine may read in longer runs of its own (``prefix_cache.run_of``: the torch engine on a
#: GPU, 1,024 tokens in one wide step of a few milliseconds).
PREFILL_CHUNK = RUN
#: The longest the model drafter's reading of what it lacks of the context may hold up a step
#: (its cost table's estimate for that many tokens): more than this (the first steps after a long
#: prompt on a CPU: 1,300 tokens of the 0.5B take about 11 s on 2 cores), it reads a run a step
#: while the verifier answers, and the first step reads nothing. A quarter of a second is about
#: what a person notices.
READ_AHEAD_S = 0.25


@dataclass(frozen=True, slots=True)
class Piece:
    """Newly emitted text and the tokens it came from (text may lag tokens at a UTF-8 split)."""

    text: str
    tokens: tuple[int, ...]


#: A repeated block counts only with at least this many non-blank characters in its distinct
#: lines, so that short lines a real answer repeats (closing braces, ``pass``, a table's rule,
#: the rows of a zero matrix) never stop it, however many of them a block holds.
LOOP_MIN_CHARS = 40
#: How far back the answer is kept for ``repeats_itself`` (characters), and the longest block
#: looked for (lines): both bound the check's cost at each line end.
LOOP_WINDOW = 8192
LOOP_MAX_LINES = 64


def repeats_itself(text: str, times: int, min_chars: int = LOOP_MIN_CHARS) -> bool:
    """Whether ``text`` (whole lines) ends with one block of whole lines written ``times``
    times in a row, the block's distinct lines holding at least ``min_chars`` non-blank
    characters. Blocks are tried shortest first, one line longer at a time; the full
    comparison runs only where the line a block's length above the last equals it."""
    if times < 2 or not text.endswith("\n"):
        return False
    lines = text.split("\n")[:-1]
    n = len(lines)
    seen: set[str] = set()
    chars = 0
    for k in range(1, min(n // times, LOOP_MAX_LINES) + 1):
        if lines[n - k] not in seen:
            seen.add(lines[n - k])
            chars += len(lines[n - k].strip())
        if chars < min_chars or lines[n - 1 - k] != lines[n - 1]:
            continue
        if all(lines[n - 1 - i - r * k] == lines[n - 1 - i]
               for r in range(1, times) for i in range(k)):
            return True
    return False


#: A span repeated within one line counts where its shortest repeating unit holds at least
#: this many non-blank characters and ``LOOP_MIN_WORDS`` distinct words (of three letters or
#: more): a looping sentence. A list of zeros, a rule of dashes, ``f(a) + f(a)`` or a row of
#: NULLs repeat a unit with fewer, however long the line.
LOOP_MIN_UNIT_CHARS = 20
LOOP_MIN_WORDS = 3
#: A shorter unit (a short sentence, "I do not know. ") counts with at least this many
#: non-blank characters and two distinct words, once written ``LOOP_SHORT_FACTOR`` times as
#: often as a long one must be.
LOOP_MIN_SHORT_CHARS = 8
LOOP_SHORT_FACTOR = 3
#: Inside fenced code a line may legitimately repeat a unit (rows of data), so only a unit that
#: reads as a sentence counts there, written this many times as often as in prose: a runaway
#: line of code (an edit block writing the same parameters again and again) still stops, a
#: few hundred characters in rather than at ``max_tokens``.
LOOP_CODE_FACTOR = 4
#: How many earlier places of the line's last characters ``repeats_in_line`` tries as the
#: unit's length (nearest first): bounds its cost at each piece of text.
LOOP_MAX_CANDIDATES = 32
_PROBE = 12
_WORD = re.compile(r"[^\W\d_]{3,}")


def _nonblank(s: str) -> int:
    return len(s) - sum(c.isspace() for c in s)


def _copies_needed(unit: str, times: int, code: bool = False) -> int:
    """How many copies in a row of ``unit`` (a shortest repeating unit) make a loop; 0: none
    ever do (too little text or too few words in it to be a sentence; in ``code``, anything
    shorter than a sentence)."""
    chars, words = _nonblank(unit), len({w.lower() for w in _WORD.findall(unit)})
    if chars >= LOOP_MIN_UNIT_CHARS and words >= LOOP_MIN_WORDS:
        return times * (LOOP_CODE_FACTOR if code else 1)
    if chars >= LOOP_MIN_SHORT_CHARS and words >= 2 and not code:
        return times * LOOP_SHORT_FACTOR
    return 0


def repeats_in_line(text: str, times: int, *, code: bool = False) -> bool:
    """Whether the last line of ``text`` (after its last newline; whole or not) ends in one
    span written again and again with nothing between the copies: ``times`` copies of a unit
    that reads as a sentence (``LOOP_MIN_UNIT_CHARS`` non-blank characters, ``LOOP_MIN_WORDS``
    distinct words), ``LOOP_SHORT_FACTOR`` times as many of a short one; in ``code`` (the line
    is inside fenced code), ``LOOP_CODE_FACTOR`` times as many of a sentence and never a short
    unit. A loop that never ends a line, which ``repeats_itself`` cannot see. The unit's
    length is looked for among the distances back to earlier places of the line's last few
    characters, nearest first; the tail need not end where a copy ends (a window of a periodic
    text is periodic)."""
    if times < 2:
        return False
    line = text[text.rfind("\n") + 1 :]
    if len(line) < times * LOOP_MIN_SHORT_CHARS:
        return False
    probe = line[-_PROBE:]
    at = len(line) - _PROBE
    for _ in range(LOOP_MAX_CANDIDATES):
        at = line.rfind(probe, 0, at + _PROBE - 1)
        if at < 0:
            return False
        d = len(line) - _PROBE - at
        if d * times > len(line):
            return False
        unit = line[-d:]
        if line[-d * times :] != unit * times:
            continue
        # the shortest unit the span repeats: the least rotation of the unit that is the unit
        # (it divides d)
        q = (unit + unit).find(unit, 1)
        need = _copies_needed(unit[:q], times, code)
        if need and len(line) >= need * q and line[-need * q :] == line[-q:] * need:
            return True
        # a run of a short unit at the end ("====", "0, 0, ") may end a longer copy: go on
    return False


class _LoopCheck:
    """The loop stop of one generation: the answer's last ``LOOP_WINDOW`` characters (from
    ``Request.loop_prefix`` on, so a loop spanning a pause stops at the same copy) checked as
    each piece of text arrives: ``repeats_itself`` where a line ends, ``repeats_in_line`` on
    the line being written (and on the one a piece ended), held to its code rule inside fenced
    code: code legitimately writes rows of data that repeat within a line."""

    def __init__(self, times: int, prefix: str) -> None:
        self.times = times
        self.recent = _loop_window(prefix)
        self.fences = 0  # runs of three or more backticks so far; odd: inside fenced code
        self.ticks = 0  # the backticks ending the text so far
        self._count_fences(prefix)

    def _count_fences(self, text: str) -> None:
        if not text:
            return
        if "`" not in text:
            self.ticks = 0
            return
        for c in text:
            self.ticks = self.ticks + 1 if c == "`" else 0
            self.fences += self.ticks == 3

    def push(self, text: str) -> bool:
        """Take the next piece of the answer; whether it now ends in a loop."""
        if self.times < 2:
            return False
        nl = text.rfind("\n")
        self._count_fences(text[: nl + 1])
        ended_in_code = self.fences % 2 == 1  # where the line the piece ended was written
        self._count_fences(text[nl + 1 :])
        recent = self.recent = _loop_window(self.recent + text)
        if nl >= 0:
            done = recent[: recent.rfind("\n") + 1]
            if repeats_itself(done, self.times):
                return True
            if repeats_in_line(done[:-1], self.times, code=ended_in_code):
                return True  # a piece that finished a looping line and began the next
        return repeats_in_line(recent, self.times, code=self.fences % 2 == 1)


def _loop_window(text: str) -> str:
    """The last ``LOOP_WINDOW`` characters of ``text``, cut at a line's start where cut."""
    if len(text) <= LOOP_WINDOW:
        return text
    text = text[-LOOP_WINDOW:]
    return text[text.find("\n") + 1 :]


@dataclass(slots=True)
class Generation:
    """An answer being generated: iterate for pieces; ``stats``/``tokens``/``text`` as it goes."""

    _it: Iterator[Piece] | None
    stats: Stats
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    #: The end-of-generation token that ended the answer (not part of ``tokens``), if any.
    stop_token: int | None = None
    #: The text decoder's state when the generation ended, before its last piece flushed it:
    #: what a generation that continues this one takes as ``Request.text_state``.
    text_state: tuple[bytes, str] = (b"", "")

    def __iter__(self) -> Iterator[Piece]:
        assert self._it is not None
        for piece in self._it:
            self.text += piece.text
            yield piece

    def run(self) -> Generation:
        for _ in self:
            pass
        return self


class Speculator:
    """Holds the verifier's cache contents across requests (in-conversation prefix reuse)."""

    def __init__(
        self,
        verifier: Engine,
        *,
        model_drafter: ModelDrafter | None = None,
        prefix_cache: PrefixCache | None = None,
        tie_margin: float = TIE_MARGIN,
        read_ahead_s: float = READ_AHEAD_S,
    ) -> None:
        self.verifier = verifier
        self.model_drafter = model_drafter
        self.prefix_cache = prefix_cache
        self.tie_margin = tie_margin
        #: ``READ_AHEAD_S``: 0 has the drafter read a run a step wherever it lacks more than a
        #: run; ``math.inf`` has it read everything before the step, as before session 23
        #: (``scripts/bench_first_token.py``'s baseline).
        self.read_ahead_s = read_ahead_s
        self.acceptance = Acceptance()
        #: Tokens in the verifier's KV cache, in order.
        self.cached: list[int] = []

    # -- prefill --------------------------------------------------------------------------

    def _prefill(
        self,
        prompt: list[int],
        cache_prefix: int,
        stats: Stats,
        cancel: Callable[[], bool] = lambda: False,
        progress: Callable[[int, int], None] | None = None,
    ) -> bool:
        """Leave ``prompt[:-1]`` in the verifier cache, evaluating only what is not there, in
        runs of ``PREFILL_CHUNK`` tokens (the engine's own where it has them: ``run_of``) with
        ``cancel`` polled and ``progress`` told after each;
        False where ``cancel`` stopped it (what was evaluated stays cached for the next request).

        The stable head ``prompt[:cache_prefix]`` is always evaluated as a run of its own from
        position 0 (when not reused), whether or not a disk cache is attached: so its KV state is
        the same bytes whether computed here or loaded from a file saved by an earlier process,
        and the disk cache never changes an answer.
        """
        v = self.verifier
        target = prompt[:-1]
        head = cache_prefix if 0 < cache_prefix <= len(target) else 0
        common = common_prefix(self.cached, target)
        if common < head and self.prefix_cache is not None:
            if restore_head(self.prefix_cache, v, self.cached, target[:head]):
                stats.prefix_loaded = head
            common = common_prefix(self.cached, target)  # head; or less if the engine emptied
        v.rollback(common)
        del self.cached[common:]
        stats.reused_tokens = common - stats.prefix_loaded
        total, done = len(target) - common, 0
        if total and cancel():
            return False

        def tick(n: int) -> bool:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total)
            return not cancel()

        run = run_of(v, PREFILL_CHUNK)
        if common < head:
            if not eval_head(v, self.cached, target, common, head, self.prefix_cache, run=run,
                             tick=tick):
                return False  # (a head read to its end is saved all the same)
            common = head
        return eval_runs(v, self.cached, target, common, len(target), run, tick)

    def _prefill_drafter(self, prompt: list[int], cache_prefix: int, stats: Stats) -> None:
        """Give the model drafter the stable head too: loaded from disk now, or saved once computed."""
        md = self.model_drafter
        if md is None:
            return
        head = prompt[:cache_prefix] if 0 < cache_prefix < len(prompt) else []
        stats.drafter_prefix_loaded = md.use_head(head, self.prefix_cache)

    # -- planning -------------------------------------------------------------------------

    def _plan(
        self,
        mode: DrafterChoice,
        committed: list[int],
        k_cap: int,
        ngram: NgramDrafter | None,
        remaining: int,
        greedy_draft: bool = True,
        greedy_verify: bool = True,
        use_model: bool = True,
    ) -> tuple[Plan, Draft | None]:
        """The drafter and draft length for this step, priced by each engine's table for the
        calls it will make (greedy ones, or ones returning logits: ``_costs``); without the
        model drafter where ``use_model`` is False (it is still reading the context)."""
        if mode == "none" or k_cap <= 0:
            return Plan(None, 0, 0.0, 0.0), None
        options: list[Option] = []
        ngram_draft = ngram.propose(committed, k_cap) if ngram is not None else None
        if ngram_draft is not None:
            options.append(Option(ngram_draft.key, len(ngram_draft.tokens), fixed=NGRAM_COST_S))
        md = self.model_drafter
        if md is not None and use_model and mode in ("auto", "model"):
            d_cost = _costs(md.engine, greedy_draft)
            step = d_cost.step()
            # Catching the drafter up on text it has not seen, spread over the rest of the answer.
            lacks = md.missing(committed)
            catch_up = d_cost.verify(lacks) if lacks else 0.0
            rounds = max(1.0, remaining / 2.0)
            options.append(Option("model", k_cap, per_token=step, fixed=catch_up / rounds))
        if mode in ("model", "ngram"):
            options = [o for o in options if o.key.startswith(mode)]
        if not options:
            return Plan(None, 0, 0.0, 0.0), None
        table = self.acceptance.table([o.key for o in options])
        v_cost = _costs(self.verifier, greedy_verify)
        if mode == "auto":
            plan = choose(v_cost, options, table)
        else:
            plan = choose(v_cost, options, table, min_gain=-1.0)
            if plan.key is None:  # forced drafter: draft even where it does not pay
                plan = Plan(options[0].key, 1, 0.0, 0.0)
        return plan, ngram_draft

    # -- the loop -------------------------------------------------------------------------

    def generate(
        self,
        request: Request,
        *,
        cancel: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Generation:
        """The generation of ``request``, run as it is iterated. ``cancel`` is polled once per
        step and between runs of the prompt's prefill; ``progress(done, total)`` is called after
        each such run with the prompt tokens evaluated so far and all it has to evaluate (what
        the verifier's cache and the prefix cache did not already hold)."""
        stats = Stats(prompt_tokens=len(request.prompt))
        gen = Generation(None, stats)
        gen._it = self._run(request, gen, cancel or (lambda: False), progress)
        return gen

    def _run(
        self,
        req: Request,
        gen: Generation,
        cancel: Callable[[], bool],
        progress: Callable[[int, int], None] | None,
    ) -> Iterator[Piece]:
        v, stats = self.verifier, gen.stats
        prompt = list(req.prompt)
        if not prompt:
            raise EngineError("cannot generate from an empty prompt")
        if len(prompt) >= v.n_ctx:
            raise ContextOverflow(
                f"the prompt has {len(prompt)} tokens but the context holds {v.n_ctx};"
                " raise engine.context or shorten the prompt"
            )
        t_start = time.perf_counter()
        rng = np.random.default_rng(req.seed)
        try:
            if not self._prefill(prompt, req.cache_prefix, stats, cancel, progress):
                # Cancelled (or paused for more urgent work) while the prompt was read: no
                # answer yet. The text decoder's state passes on as it came, and what it held
                # back from the generation this one continues comes out as the loop's cancel
                # would let it (a pause keeps it back: ``Assistant._run``).
                stats.time_prefill = time.perf_counter() - t_start
                stats.finish_reason = "cancelled"
                held = _TextOut(v, req.stop, req.text_state)
                gen.text_state = held.state()
                tail = held.flush()
                if tail:
                    yield Piece(tail, ())
                return
            if req.drafter in ("auto", "model"):
                self._prefill_drafter(prompt, req.cache_prefix, stats)
            stats.time_prefill = time.perf_counter() - t_start
            ngram = NgramDrafter(req.corpus) if req.drafter in ("auto", "ngram") else None
            if ngram is not None:
                ngram.reset(prompt)
            committed = prompt
            out = _TextOut(v, req.stop, req.text_state)
            max_tokens = min(req.max_tokens, v.n_ctx - len(prompt))
            yield from self._loop(req, gen, cancel, committed, ngram, out, max_tokens, rng, t_start)
        finally:
            stats.tokens = len(gen.tokens)
            stats.time_total = time.perf_counter() - t_start
            if not stats.finish_reason:
                stats.finish_reason = "cancelled"  # interrupted (Ctrl-C, closed consumer)
            if len(self.cached) != v.n_past:  # interrupted mid-step: trust nothing cached
                v.rollback(0)
                self.cached.clear()

    def _loop(
        self,
        req: Request,
        gen: Generation,
        cancel: Callable[[], bool],
        committed: list[int],
        ngram: NgramDrafter | None,
        out: _TextOut,
        max_tokens: int,
        rng: np.random.Generator,
        t_start: float,
    ) -> Iterator[Piece]:
        v, stats = self.verifier, gen.stats
        finish = "length"
        loops = _LoopCheck(req.loop_repeats, req.loop_prefix)
        md = self.model_drafter
        md_run = PREFILL_CHUNK if md is None else run_of(md.engine, PREFILL_CHUNK)
        while True:
            if cancel():
                finish = "cancelled"
                break
            remaining = max_tokens - len(gen.tokens)
            if remaining <= 0:
                break
            room = v.n_ctx - len(self.cached) - 1
            k_cap = min(req.max_draft, remaining - 1, room)
            plan_step = functools.partial(self._plan, req.drafter, committed, k_cap, ngram,
                                          remaining, greedy_draft=req.sampling.greedy,
                                          greedy_verify=self._argmax_only(req))
            plan, ngram_draft = plan_step()

            t0 = time.perf_counter()
            draft: Draft | None = None
            if (plan.key == "model" and md is not None
                    and self._reads_while_answering(committed, md_run)):
                # The drafter lacks more of the context than it reads unnoticed (the first steps
                # after a long prompt): the first step reads none of it, each later one a run,
                # and a step goes without the drafter until it has caught up, so the answer
                # starts as soon as the verifier has read the prompt.
                if stats.steps:
                    md.catch_up(committed, md_run, lambda _n: False)
                    if cancel():
                        finish = "cancelled"
                        break
                if md.missing(committed) > md_run:  # (a run a step)
                    plan, ngram_draft = plan_step(use_model=False)
            if plan.key == "model" and md is not None:
                # what the drafter has not read of the context, in runs with cancel polled
                if not md.catch_up(committed, md_run, lambda _n: not cancel()):
                    finish = "cancelled"
                    break
                draft = md.propose(committed, plan.k, req.sampling, rng)
            elif plan.key is not None and ngram_draft is not None:
                draft = Draft(ngram_draft.tokens[: plan.k], None, ngram_draft.key, ngram_draft.match)
            t1 = time.perf_counter()
            drafted = draft.tokens if draft is not None else ()
            batch = [committed[-1], *drafted]
            base = len(self.cached)
            # A greedy step that needs no logits row (no logprobs, no tie re-check) asks only
            # for each row's argmax: the torch engine then never copies its logits to the host.
            picks: list[int] | None = None
            rows: np.ndarray | None = None
            if self._argmax_only(req):
                picks = greedy_eval(v, batch)
            else:
                rows = v.eval(batch)
            self.cached.extend(batch)

            decided, n_acc, keep = self._decide(req, rows, picks, batch, drafted, draft, base,
                                                rng, stats)
            v.rollback(keep)
            del self.cached[keep:]
            t3 = time.perf_counter()
            stats.time_draft += t1 - t0
            stats.time_verify += t3 - t1
            stats.steps += 1
            if draft is not None:
                n_decided = min(len(decided), len(drafted))
                self.acceptance.record(draft.key, n_decided, n_acc)
                stats.record(draft.key.split(":")[0], n_decided, n_acc)
            self.acceptance.decay()

            done = False
            for j, tok in enumerate(decided):
                if req.logprobs:
                    assert rows is not None  # logprobs always evaluate the rows
                    stats.add_logprob(_logprob(rows[j], tok))
                if tok in v.eos_token_ids:
                    finish, done = "stop", True
                    gen.stop_token = tok
                    break
                committed.append(tok)
                gen.tokens.append(tok)
                text, hit = out.push(tok)
                if text:
                    stats.mark_first_token(time.perf_counter() - t_start)
                    yield Piece(text, (tok,))
                if hit:
                    finish, done = "stop", True
                    break
                if text and loops.push(text):
                    finish, done = "repetition", True
                    break
                if len(gen.tokens) >= max_tokens:
                    finish, done = "length", True
                    break
            if done:
                break

        gen.text_state = out.state()
        tail = out.flush()
        if tail:
            stats.mark_first_token(time.perf_counter() - t_start)
            yield Piece(tail, ())
        stats.finish_reason = finish


    def _reads_while_answering(self, committed: list[int], run: int) -> bool:
        """Whether the model drafter lacks more than a ``run`` (its engine's) of ``committed``
        and would take longer than ``read_ahead_s`` to read it (its table for greedy calls: it
        reads by argmaxes)."""
        md = self.model_drafter
        if md is None:
            return False
        lacks = md.missing(committed)
        return lacks > run and _costs(md.engine, True).verify(lacks) > self.read_ahead_s

    def _argmax_only(self, req: Request) -> bool:
        """Whether this request's steps need each row's argmax alone: greedy, with no
        log-probabilities and no near-tie re-check, which read the rows."""
        return req.sampling.greedy and not req.logprobs and self.tie_margin <= 0

    def _decide(
        self,
        req: Request,
        rows: np.ndarray | None,
        picks: list[int] | None,
        batch: list[int],
        drafted: tuple[int, ...],
        draft: Draft | None,
        base: int,
        rng: np.random.Generator,
        stats: Stats,
    ) -> tuple[list[int], int, int]:
        """Walk the verified rows: (tokens decided, drafts accepted, cache length to keep).

        ``picks``: each row's greedy token where only those were evaluated (``greedy_eval``);
        else ``rows``, the logits. The last decided token is the new pending one: committed
        but not yet in the cache.
        """
        v = self.verifier
        decided: list[int] = []
        n_acc = 0
        if picks is not None:
            for i, tok in enumerate(picks):
                decided.append(tok)
                if i == len(drafted) or tok != drafted[i]:
                    break
                n_acc += 1
            return decided, n_acc, base + 1 + n_acc
        assert rows is not None
        for i in range(len(batch)):
            row = rows[i]
            if (
                req.sampling.greedy
                and len(batch) > 1
                and self.tie_margin > 0
                and top2_gap(row) < self.tie_margin
            ):
                # Near-tie in a batched row: decide with a single-token evaluation instead, and
                # end the step there (later rows were computed after the batched one).
                v.rollback(base + i)
                del self.cached[base + i :]
                row = v.eval([batch[i]])[-1]
                self.cached.append(batch[i])
                stats.tie_rechecks += 1
                tok = greedy(row)
                decided.append(tok)
                if i < len(drafted) and tok == drafted[i]:
                    n_acc += 1
                return decided, n_acc, base + i + 1
            if i == len(drafted):  # the verifier's own token after the accepted run
                decided.append(greedy(row) if req.sampling.greedy else _sample_row(row, req.sampling, rng))
                break
            d = drafted[i]
            if req.sampling.greedy:
                tok = greedy(row)
                ok = tok == d
            else:
                q = draft.probs[i] if draft is not None and draft.probs is not None else None
                ok, repl = accept_draft(distribution(row, req.sampling), q, d, rng)
                tok = d if ok else int(repl if repl is not None else d)
            decided.append(tok)
            if not ok:
                break
            n_acc += 1
        return decided, n_acc, base + 1 + n_acc


def _costs(engine: Engine, greedy: bool) -> CostModel:
    """What the planner prices ``engine``'s calls at: its greedy table, or for a sampled request
    the table of calls that return logits, where the engine keeps one."""
    sampled = None if greedy else getattr(engine, "sampled_cost_model", None)
    return sampled() if sampled is not None else engine.cost_model()


def _logprob(row: np.ndarray, tok: int) -> float:
    """Natural-log probability of ``tok`` under the verifier's raw logits (the router's confidence)."""
    m = float(row.max())
    return float(row[tok]) - (m + float(np.log(np.exp(row - m).sum())))


def _sample_row(row: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    from openjarvis.engine.sampling import sample

    return sample(distribution(row, params), rng)


class _TextOut:
    """Incremental detokenization with stop strings: emits text that can no longer change."""

    def __init__(self, engine: Engine, stop: tuple[str, ...],
                 state: tuple[bytes, str] = (b"", "")) -> None:
        self.engine = engine
        self.stop = tuple(s for s in stop if s)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.decoder.setstate((state[0], 0))
        self.held = state[1]
        self.stopped = False

    def state(self) -> tuple[bytes, str]:
        """(bytes of a character not yet complete, text held back as a stop string's start)."""
        return self.decoder.getstate()[0], "" if self.stopped else self.held

    def push(self, token: int) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string completed)."""
        self.held += self.decoder.decode(self.engine.detokenize([token]))
        for s in self.stop:
            at = self.held.find(s)
            if at >= 0:
                text, self.held, self.stopped = self.held[:at], "", True
                return text, True
        keep = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.held)), 0, -1):
                if self.held.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        text = self.held[: len(self.held) - keep]
        self.held = self.held[len(self.held) - keep :]
        return text, False

    def flush(self) -> str:
        if self.stopped:
            return ""
        tail = self.held + self.decoder.decode(b"", final=True)
        self.held = ""
        return tail
