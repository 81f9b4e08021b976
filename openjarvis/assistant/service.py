"""The assistant's one job per request: find context, build the prompt, generate, remember.

``Assistant`` owns the warm model pair (loaded lazily, unloaded when idle) and answers ``chat``
and ``complete`` for any workspace. It is synchronous on purpose: the daemon runs it in a worker
thread, one generation at a time per model (``gate``), and passes ``on_text`` to stream and
``cancel`` to stop within one decoding step.

Retrieval goes through the small ``Retriever`` interface so the prompt logic can be tested with
any index; ``IndexRetriever`` is the real one over ``openjarvis.index``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from openjarvis.assistant.gate import BACKGROUND, CHAT, COMPLETE, PriorityGate, Slot
from openjarvis.assistant.prompt import MAP_SHARE, EditorContext, Prompt, Source, assemble
from openjarvis.config import Config
from openjarvis.engine.templates import Message

#: Retrieved chunks offered to the prompt (the budget decides how many fit).
RETRIEVE_K = 8
#: Tokens kept free at the end of the context besides the answer itself.
SAFETY_TOKENS = 32
#: Characters per token assumed when no tokenizer is at hand (sizing a prompt for a cloud target).
CHARS_PER_TOKEN = 4


def fim_stops(suffix: str, multiline: bool) -> tuple[str, ...]:
    """Where an inline completion ends: special tokens, a blank-line pair, the suffix's next line."""
    stops = ["<|endoftext|>", "<|file_sep|>", "<|fim_pad|>", "<|im_end|>", "\n\n\n"]
    if not multiline:
        stops.append("\n")
    following = next((line.strip() for line in suffix.splitlines() if line.strip()), "")
    if len(following) >= 4:
        stops.append(following)
    return tuple(stops)


class Retriever(Protocol):
    def sources(self, query: str, k: int, focus: Sequence[str]) -> list[Source]: ...

    def repo_map(self, budget_tokens: int, focus: Sequence[str]) -> str: ...


class IndexRetriever:
    """Sources and the repository map from a workspace's index (``openjarvis.index``)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _store(self) -> Any:
        from openjarvis.index.store import open_readonly

        return open_readonly(self.root)

    def sources(self, query: str, k: int, focus: Sequence[str]) -> list[Source]:
        from openjarvis.index.search import search
        from openjarvis.index.tags import split_lines

        store = self._store()
        try:
            hits = search(store, query, k=k, focus=focus)
        finally:
            store.close()
        out: list[Source] = []
        cache: dict[str, list[str]] = {}
        for h in hits:
            if h.path not in cache:
                try:
                    text = (self.root / h.path).read_text(encoding="utf-8", errors="replace")
                    cache[h.path] = split_lines(text)  # the index's own line numbering
                except OSError:
                    cache[h.path] = []
            lines = cache[h.path][h.start_line - 1 : h.end_line]
            if lines:
                out.append(Source(h.path, h.start_line, h.end_line, "\n".join(lines), h.symbol, h.score))
        return out

    def repo_map(self, budget_tokens: int, focus: Sequence[str]) -> str:
        from openjarvis.index.search import repo_map

        store = self._store()
        try:
            return str(repo_map(store, budget_tokens, focus=focus))
        finally:
            store.close()


@dataclass(frozen=True, slots=True)
class ChatRequest:
    question: str
    history: tuple[Message, ...] = ()
    editor: EditorContext | None = None
    max_tokens: int = 1024
    temperature: float = 0.0
    drafter: str = "auto"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prompt ready to answer: its messages and sources, and its tokens for the local pair."""

    prompt: Prompt
    #: None when the local models are unavailable (``local_error`` says why).
    tokens: list[int] | None
    local_context: int
    local_error: str = ""
    #: What the prompt was assembled from, to re-assemble it smaller without searching again.
    sources: tuple[Source, ...] = ()
    repo_map: str = ""
    #: Leading ``tokens`` that are the stable head (system prompt + repository map), token-exact;
    #: passed as ``cache_prefix`` so its KV state is reused across questions and restarts.
    head: int = 0


@dataclass(slots=True)
class ChatAnswer:
    text: str
    sources: tuple[Source, ...]
    prompt_tokens: int
    stats: dict[str, Any] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    cancelled: bool = False


def stats_dict(stats: Any) -> dict[str, Any]:
    """The per-request statistics clients show (tokens/s, acceptance, time to first token)."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "reused_tokens": stats.reused_tokens,
        "prefix_loaded": stats.prefix_loaded,
        "drafter_prefix_loaded": stats.drafter_prefix_loaded,
        "tokens": stats.tokens,
        "tokens_per_s": round(stats.tokens_per_second, 2),
        "acceptance": round(stats.acceptance, 3),
        "mean_accepted": round(stats.mean_accepted, 2),
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "ttft_s": round(stats.ttft, 4) if stats.ttft is not None else None,
        "total_s": round(stats.time_total, 4),
        "finish_reason": stats.finish_reason,
        "mean_logprob": round(stats.mean_logprob, 4) if stats.mean_logprob is not None else None,
        "per_drafter": {k: {"drafted": v.drafted, "accepted": v.accepted} for k, v in stats.per_drafter.items()},
    }


def _first_token_s(parts: Sequence[Any]) -> float | None:
    """Generating time to the answer's first token: a generation paused while it read the
    prompt emitted none, so the first that did counts from the first's start (the time paused
    for more urgent work is not counted)."""
    before = 0.0
    for p in parts:
        if p.ttft is not None:
            return round(before + float(p.ttft), 4)
        before += p.time_total
    return None


def merged_stats(parts: Sequence[Any], *, pauses: int = 0) -> dict[str, Any]:
    """One answer's statistics from the generations it took (more than one if it was paused)."""
    first, last = parts[0], parts[-1]
    out = stats_dict(first) if len(parts) == 1 else stats_dict(last)
    if len(parts) > 1:
        tokens = sum(p.tokens for p in parts)
        decode = sum(p.decode_seconds for p in parts)
        drafted = sum(p.drafted for p in parts)
        accepted = sum(p.accepted for p in parts)
        out.update(
            prompt_tokens=first.prompt_tokens,
            # what this request found in memory or on disk, not what it read before a pause
            reused_tokens=first.reused_tokens,
            prefix_loaded=first.prefix_loaded,
            tokens=tokens,
            tokens_per_s=round(tokens / decode, 2) if decode > 0 else 0.0,
            drafted=drafted,
            accepted=accepted,
            acceptance=round(accepted / drafted, 3) if drafted else 0.0,
            ttft_s=_first_token_s(parts),
            total_s=round(sum(p.time_total for p in parts), 4),
        )
        count = sum(p.logprob_count for p in parts)
        out["mean_logprob"] = round(sum(p.logprob_sum for p in parts) / count, 4) if count else None
    out["pauses"] = pauses
    return out


class Assistant:
    """The warm model pair and the request logic above it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        #: One generation at a time on these models (CPU engines are not reentrant), urgent first.
        self.gate = PriorityGate()
        self._spec: Any = None
        self._load_lock = threading.Lock()
        self.model_ids: tuple[str, str] = ("", "")
        self._drafter_path: Path | None = None
        self.last_used = time.monotonic()

    # -- models ------------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._spec is not None

    def speculator(self, *, model_drafter: bool = False) -> Any:
        """The loaded pair (loading it on first use). ``model_drafter``: a request asks for the
        drafter model by name (``--drafter model``), so load it now where the configuration's
        ``generation.drafter`` (or, under "auto", its cost check) left it out: without it the
        request would be answered without drafts and say nothing."""
        with self._load_lock:
            if self._spec is None:
                from openjarvis.engine.pair import open_speculator
                from openjarvis.models import Catalog

                catalog = Catalog.load(self.config)
                pair = catalog.pair(self.config.models.pair or None)
                drafter_id = self.config.models.drafter or pair.drafter
                verifier_id = self.config.models.verifier or pair.verifier
                d, v = catalog.pair_paths(pair.id, drafter=drafter_id, verifier=verifier_id)
                self._spec = open_speculator(
                    self.config, verifier_path=v, drafter_path=d, drafter=self.config.generation.drafter
                )
                self.model_ids = (drafter_id, verifier_id)
                self._drafter_path = d
            if model_drafter and self._spec.model_drafter is None and self._drafter_path is not None:
                from openjarvis.engine.pair import open_model_drafter

                self._spec.model_drafter = open_model_drafter(
                    self._drafter_path, self.config, self._spec.verifier)
            self.last_used = time.monotonic()
            return self._spec

    def unload(self) -> None:
        with self.gate.hold(BACKGROUND), self._load_lock:
            if self._spec is not None:
                from openjarvis.engine.pair import close_speculator

                close_speculator(self._spec)
                self._spec = None

    # -- requests -----------------------------------------------------------------------------------

    def _context(self, req: ChatRequest, retriever: Retriever | None, budget: int) -> tuple[list[Source], str]:
        focus = [req.editor.path] if req.editor is not None else []
        if retriever is None:
            return [], ""
        return retriever.sources(req.question, RETRIEVE_K, focus), retriever.repo_map(
            int(budget * MAP_SHARE), focus
        )

    def prepare(self, req: ChatRequest, retriever: Retriever | None) -> Prepared:
        """Context and prompt for ``req`` at the full ``generation.prompt_budget``.

        The prompt may be larger than the local context allows; the router then decides whether a
        target with room takes it, or ``answer`` trims it to fit here (``fit_local``). When the local
        models cannot be loaded, the prompt is still built (sized by an estimate of
        ``CHARS_PER_TOKEN``) and ``local_error`` says why.
        """
        from openjarvis.errors import ModelError

        budget = self.config.generation.prompt_budget
        sources, repo_map = self._context(req, retriever, budget)
        try:
            spec = self.speculator()
        except ModelError as exc:
            prompt = self._build(req, sources, repo_map, budget, lambda t: max(1, len(t) // CHARS_PER_TOKEN))
            return Prepared(prompt, None, 0, str(exc), tuple(sources), repo_map)
        v = spec.verifier
        prompt = self._build(req, sources, repo_map, budget, lambda t: len(v.tokenize(t, special=False)))
        tokens, head = self._tokens(v, prompt)
        return Prepared(prompt, tokens, v.n_ctx, "", tuple(sources), repo_map, head)

    def _build(
        self, req: ChatRequest, sources: Sequence[Source], repo_map: str, budget: int, count: Callable[[str], int]
    ) -> Prompt:
        return assemble(
            req.question,
            budget=budget,
            count=count,
            history=req.history,
            sources=sources,
            editor=req.editor,
            repo_map=repo_map,
            # One map size for every request of this configuration, also when ``fit_local``
            # re-assembles at a smaller budget: the head must not depend on the question.
            map_budget=int(self.config.generation.prompt_budget * MAP_SHARE),
        )

    @staticmethod
    def _tokens(v: Any, prompt: Prompt) -> tuple[list[int], int]:
        """The prompt's tokens for the local pair, and how many of them are its stable head."""
        from openjarvis.engine.templates import head_length, render_chat

        template = v.chat_template()
        tokens = list(v.tokenize(render_chat(template, list(prompt.messages)), special=True))
        head = head_length(template, prompt.messages, prompt.stable, tokens, lambda t: v.tokenize(t, special=True))
        return tokens, head

    def fit_local(self, req: ChatRequest, prepared: Prepared) -> Prepared:
        """The same request re-assembled to leave room for the answer in the local context."""
        if prepared.tokens is None or len(prepared.tokens) + req.max_tokens + SAFETY_TOKENS <= prepared.local_context:
            return prepared
        v = self.speculator().verifier
        budget = prepared.local_context - req.max_tokens - SAFETY_TOKENS
        prompt = self._build(
            req, prepared.sources, prepared.repo_map, budget, lambda t: len(v.tokenize(t, special=False))
        )
        tokens, head = self._tokens(v, prompt)
        return Prepared(prompt, tokens, prepared.local_context, "", prepared.sources, prepared.repo_map, head)

    def answer(
        self,
        req: ChatRequest,
        prepared: Prepared,
        *,
        on_text: Callable[[str], None] = lambda _t: None,
        cancel: Callable[[], bool] = lambda: False,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> ChatAnswer:
        """Generate the answer to a prepared prompt on the local pair; ``on_progress(done,
        total)`` follows the prompt's prefill (``Speculator.generate``'s ``progress``)."""
        from openjarvis.engine.sampling import SamplingParams
        from openjarvis.engine.speculative import Request
        from openjarvis.errors import ModelNotInstalled

        if prepared.tokens is None:
            raise ModelNotInstalled(prepared.local_error)
        prepared = self.fit_local(req, prepared)
        assert prepared.tokens is not None
        with self.gate.hold(CHAT) as slot:
            spec = self.speculator(model_drafter=req.drafter == "model")
            corpus = tuple(spec.verifier.tokenize(s.text, special=False) for s in prepared.prompt.sources)
            if req.editor is not None and req.editor.text:
                corpus += (spec.verifier.tokenize(req.editor.text, special=False),)
            request = Request(
                prompt=prepared.tokens,
                max_tokens=req.max_tokens,
                sampling=SamplingParams(temperature=req.temperature),
                drafter=req.drafter,  # type: ignore[arg-type]
                corpus=corpus,
                cache_prefix=prepared.head,
                logprobs=True,  # the router judges the answer's confidence by it
                loop_repeats=self.config.generation.loop_repeats,
            )
            text, stats = self._run(slot, spec, request, on_text, cancel, on_progress)
        return ChatAnswer(
            text=text,
            sources=prepared.prompt.sources,
            prompt_tokens=len(prepared.tokens),
            stats=stats,
            dropped=prepared.prompt.dropped,
            cancelled=stats["finish_reason"] == "cancelled",
        )

    def chat(
        self,
        req: ChatRequest,
        retriever: Retriever | None,
        *,
        on_text: Callable[[str], None] = lambda _t: None,
        cancel: Callable[[], bool] = lambda: False,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> ChatAnswer:
        """``prepare`` then ``answer`` locally (the daemon routes between the two)."""
        return self.answer(req, self.prepare(req, retriever), on_text=on_text, cancel=cancel,
                           on_progress=on_progress)

    def _run(
        self,
        slot: Slot,
        spec: Any,
        request: Any,
        on_text: Callable[[str], None],
        cancel: Callable[[], bool],
        on_progress: Callable[[int, int], None] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Generate, pausing at a step boundary (or between runs of the prompt's prefill)
        whenever more urgent work waits for the gate.

        A pause ends this generation; after the urgent work the answer continues as a new
        generation whose prompt is the old one plus the tokens already emitted, so the text the
        person sees is one answer (the speculator reuses whatever of its cache still matches). It
        is handed the answer so far (``loop_prefix``) and the text decoder's state
        (``text_state``), so a loop, a character or a stop string that spans the pause is seen
        whole.
        """
        from dataclasses import replace

        texts: list[str] = []
        emitted: list[int] = []
        parts: list[Any] = []
        text_state: tuple[bytes, str] = (b"", "")
        while True:
            preempted = False

            def stop_now() -> bool:
                nonlocal preempted
                if cancel():
                    return True
                if slot.priority > COMPLETE and slot.should_yield():
                    preempted = True
                    return True
                return False

            remaining = request.max_tokens - len(emitted)
            gen = spec.generate(
                replace(
                    request,
                    prompt=[*request.prompt, *emitted],
                    max_tokens=remaining,
                    loop_prefix=request.loop_prefix + "".join(texts),
                    text_state=text_state,
                ),
                cancel=stop_now,
                # the prompt's reading is told only before the answer's first token (a resumed
                # generation may read its prompt and answer so far again)
                progress=on_progress if not emitted else None,
            )
            tail = ""
            for piece in gen:
                if preempted and not piece.tokens:
                    # the decoder's flush as the pause ended it: part of a character, or the
                    # start of a stop string; shown only if the answer does not resume
                    tail = piece.text
                elif piece.text:
                    on_text(piece.text)
            emitted.extend(gen.tokens)
            parts.append(gen.stats)
            self.last_used = time.monotonic()
            if (
                preempted
                and not cancel()
                and len(emitted) < request.max_tokens
                and gen.stats.finish_reason == "cancelled"
            ):
                texts.append(gen.text[: len(gen.text) - len(tail)])
                text_state = gen.text_state  # the resumed generation decodes on from here
                slot.pause()
                continue
            if tail:
                on_text(tail)
            texts.append(gen.text)
            return "".join(texts), merged_stats(parts, pauses=slot.pauses)

    def generate(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: tuple[str, ...] = (),
        drafter: str = "auto",
        seed: int | None = None,
        on_text: Callable[[str], None] = lambda _t: None,
        cancel: Callable[[], bool] = lambda: False,
    ) -> tuple[str, int, dict[str, Any]]:
        """Answer the caller's own messages as they are (the OpenAI-compatible endpoint's path)."""
        from openjarvis.engine.sampling import SamplingParams
        from openjarvis.engine.speculative import Request
        from openjarvis.engine.templates import render_chat

        with self.gate.hold(CHAT) as slot:
            spec = self.speculator(model_drafter=drafter == "model")
            v = spec.verifier
            text = render_chat(v.chat_template(), list(messages))
            tokens = v.tokenize(text, special=True)
            corpus = tuple(v.tokenize(m.content, special=False) for m in messages if m.content)
            request = Request(
                prompt=tokens,
                max_tokens=max_tokens,
                sampling=SamplingParams(temperature=temperature, top_p=top_p),
                stop=stop,
                drafter=drafter,  # type: ignore[arg-type]
                corpus=corpus,
                seed=seed,
                loop_repeats=self.config.generation.loop_repeats,
            )
            answer, stats = self._run(slot, spec, request, on_text, cancel)
        return answer, len(tokens), stats

    def complete(
        self,
        prefix: str,
        suffix: str,
        *,
        max_tokens: int = 64,
        multiline: bool = True,
        on_text: Callable[[str], None] = lambda _t: None,
        cancel: Callable[[], bool] = lambda: False,
    ) -> tuple[str, dict[str, Any]]:
        """Fill-in-the-middle for editors: a short completion between ``prefix`` and ``suffix``.

        The model would happily keep writing past the gap; it is stopped at the end of the line
        (``multiline=False``), at a blank line pair, or where it starts repeating the suffix.
        """
        from openjarvis.engine.speculative import Request
        from openjarvis.engine.templates import fim_prompt

        with self.gate.hold(COMPLETE):
            spec = self.speculator()
            v = spec.verifier
            # Keep the text nearest the cursor when the file is larger than the context allows.
            room = v.n_ctx - max_tokens - SAFETY_TOKENS
            tokens = v.tokenize(fim_prompt(prefix, suffix), special=True)
            while len(tokens) > room and (len(prefix) > 64 or len(suffix) > 64):
                prefix = prefix[len(prefix) // 4 :] if len(prefix) > 64 else prefix
                suffix = suffix[: len(suffix) * 3 // 4] if len(suffix) > 64 else suffix
                tokens = v.tokenize(fim_prompt(prefix, suffix), special=True)
            corpus = (v.tokenize(prefix + suffix, special=False),)
            gen = spec.generate(
                Request(
                    prompt=tokens,
                    max_tokens=max_tokens,
                    stop=fim_stops(suffix, multiline),
                    corpus=corpus,
                    loop_repeats=self.config.generation.loop_repeats,
                ),
                cancel=cancel,
            )
            for piece in gen:
                if piece.text:
                    on_text(piece.text)
            self.last_used = time.monotonic()
        return gen.text, stats_dict(gen.stats)
