"""Prefix reuse within a conversation and the persistent prefix KV cache on disk."""

from __future__ import annotations

from pathlib import Path

from openjarvis.engine.drafters import ModelDrafter
from openjarvis.engine.llama import LlamaEngine
from openjarvis.engine.prefix_cache import PrefixCache
from openjarvis.engine.speculative import Request, Speculator

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.\n" + "import os\nimport sys\n" * 20


def turn(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def test_second_turn_evaluates_only_new_tokens(verifier: LlamaEngine, drafter: LlamaEngine) -> None:
    spec = Speculator(verifier, model_drafter=ModelDrafter(drafter))
    first = verifier.tokenize(SYSTEM + turn("Write a stack class."))
    gen1 = spec.generate(Request(first, max_tokens=30, drafter="model")).run()
    assert gen1.stats.reused_tokens == 0
    second = first + gen1.tokens + verifier.tokenize("<|im_end|>\n" + turn("Now add a peek method."))
    gen2 = spec.generate(Request(second, max_tokens=30, drafter="model")).run()
    # Everything up to the first answer's last token was in the cache already.
    assert gen2.stats.reused_tokens >= len(first) + len(gen1.tokens) - 1
    # ...and the answer equals a cold start's.
    with LlamaEngine(verifier.path, context=1024, threads=1) as cold:
        expected = Speculator(cold).generate(Request(second, max_tokens=30, drafter="none")).run()
    assert gen2.tokens == expected.tokens
    # The drafter's cache follows the conversation too: it holds the whole second prompt.
    assert spec.model_drafter is not None and spec.model_drafter.missing(second) == 0


def test_persistent_prefix_is_saved_then_loaded(tiny_verifier_path: Path, tmp_path: Path) -> None:
    cache = PrefixCache(tmp_path / "kv")
    with LlamaEngine(tiny_verifier_path, context=1024, threads=1) as engine:
        stable_tokens = engine.tokenize(SYSTEM)
        len_stable = len(stable_tokens)
        prompt = stable_tokens + engine.tokenize(turn("Explain this code."))
        first = Speculator(engine, prefix_cache=cache).generate(
            Request(prompt, max_tokens=20, cache_prefix=len_stable)
        ).run()
        assert first.stats.prefix_loaded == 0
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 1
    with LlamaEngine(tiny_verifier_path, context=1024, threads=1) as engine:
        second = Speculator(engine, prefix_cache=cache).generate(
            Request(prompt, max_tokens=20, cache_prefix=len_stable)
        ).run()
    assert second.stats.prefix_loaded == len_stable > 64
    assert second.tokens == first.tokens


def test_corrupt_or_foreign_cache_files_are_ignored(
    tiny_verifier_path: Path, tiny_drafter_path: Path, tmp_path: Path
) -> None:
    cache = PrefixCache(tmp_path / "kv")
    with LlamaEngine(tiny_verifier_path, context=1024, threads=1) as engine:
        tokens = engine.tokenize(SYSTEM)
        engine.eval(tokens)
        path = cache.save(engine, tokens)
        assert path is not None
        expected = engine.eval([1, 2])
        engine.rollback(0)

        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF  # one flipped byte in the KV payload
        path.write_bytes(bytes(data))
        assert not cache.load(engine, tokens)
        assert cache.last_miss == "corrupt: checksum"
        assert engine.n_past == 0 and not path.exists()

        cache.save(engine, tokens)  # the engine is empty: nothing to save
        assert not path.exists()
        engine.eval(tokens)
        cache.save(engine, tokens)
        path.write_bytes(path.read_bytes()[:-10])
        assert not cache.load(engine, tokens)
        assert cache.last_miss == "corrupt: truncated"

        engine.rollback(0)
        engine.eval(tokens)
        cache.save(engine, tokens)
        engine.rollback(0)
        assert cache.load(engine, tokens)
        assert (engine.eval([1, 2]) == expected).all()

    # Another model never finds (or trusts) this model's file.
    with LlamaEngine(tiny_drafter_path, context=1024, threads=1) as drafter:
        assert not cache.load(drafter, tokens)
        assert cache.last_miss == "absent"
        assert drafter.n_past == 0
        foreign = cache.path_for(drafter, tokens)
        foreign.write_bytes(path.read_bytes())
        assert not cache.load(drafter, tokens)
        assert cache.last_miss == "mismatch: other model"


def test_the_model_drafter_saves_and_loads_its_own_head(
    tiny_verifier_path: Path, tiny_drafter_path: Path, tmp_path: Path
) -> None:
    cache = PrefixCache(tmp_path / "kv")

    def run(prefix_cache: PrefixCache | None) -> tuple[list[int], int, int]:
        with (
            LlamaEngine(tiny_verifier_path, context=1024, threads=1) as v,
            LlamaEngine(tiny_drafter_path, context=1024, threads=1) as d,
        ):
            spec = Speculator(v, model_drafter=ModelDrafter(d, verifier=v), prefix_cache=prefix_cache)
            head = v.tokenize(SYSTEM)
            prompt = head + v.tokenize(turn("Explain this code."))
            gen = spec.generate(Request(prompt, max_tokens=20, drafter="model", cache_prefix=len(head))).run()
            assert gen.stats.drafted > 0
            return gen.tokens, gen.stats.prefix_loaded, gen.stats.drafter_prefix_loaded

    plain, _, _ = run(None)
    first, loaded, drafter_loaded = run(cache)
    assert (loaded, drafter_loaded) == (0, 0)
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 2  # one file per model
    second, loaded, drafter_loaded = run(cache)
    assert loaded == drafter_loaded > 64
    # The head is always evaluated as a run of its own, so loading it changes nothing.
    assert plain == first == second


def test_a_rejected_load_keeps_the_conversation_cache_consistent(verifier: LlamaEngine, tmp_path: Path) -> None:
    """A corrupt head file on a later turn: the in-memory prefix is still reused, never trusted wrongly."""
    cache = PrefixCache(tmp_path / "kv")
    spec = Speculator(verifier, prefix_cache=cache)
    stable = verifier.tokenize(SYSTEM)
    other = verifier.tokenize(SYSTEM.replace("helpful", "careful"))
    spec.generate(Request(stable + verifier.tokenize(turn("Hi.")), max_tokens=4, cache_prefix=len(stable))).run()
    path = cache.path_for(verifier, other)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"garbage")
    prompt = other + verifier.tokenize(turn("Hi."))
    gen = spec.generate(Request(prompt, max_tokens=8, cache_prefix=len(other))).run()
    assert gen.stats.prefix_loaded == 0 and cache.last_miss == "corrupt: bad magic"
    assert 0 < gen.stats.reused_tokens < len(other)  # the shared start of the system turn
    with LlamaEngine(verifier.path, context=1024, batch=64, threads=1) as cold:
        expected = Speculator(cold).generate(Request(prompt, max_tokens=8, cache_prefix=len(other))).run()
    assert gen.tokens == expected.tokens
    assert cache.load(verifier, other)  # the bad file was replaced by a sound one


def test_a_head_cut_short_by_a_cancel_is_not_saved(tiny_verifier_path: Path, tmp_path: Path) -> None:
    """A cancel between the runs of the head leaves no file (the head is not complete); the
    next request reads on and saves it, and a later process loads the same state."""
    from openjarvis.engine.speculative import PREFILL_CHUNK

    cache = PrefixCache(tmp_path / "kv")
    with LlamaEngine(tiny_verifier_path, context=1024, threads=1) as engine:
        head = engine.tokenize(SYSTEM * 2)
        assert len(head) > PREFILL_CHUNK
        prompt = head + engine.tokenize(turn("Explain this code."))
        spec = Speculator(engine, prefix_cache=cache)
        nothing = spec.generate(Request(prompt, max_tokens=20, cache_prefix=len(head)),
                                cancel=lambda: True).run()  # cancelled before it began
        assert nothing.tokens == [] and engine.n_past == 0
        read: list[int] = []
        stopped = spec.generate(Request(prompt, max_tokens=20, cache_prefix=len(head)),
                                cancel=lambda: bool(read), progress=lambda d, _t: read.append(d)).run()
        assert stopped.tokens == [] and engine.n_past == PREFILL_CHUNK == read[-1]
        assert not list((tmp_path / "kv").glob("*.kv"))
        first = spec.generate(Request(prompt, max_tokens=20, cache_prefix=len(head))).run()
        assert first.stats.reused_tokens == PREFILL_CHUNK
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 1
    with LlamaEngine(tiny_verifier_path, context=1024, threads=1) as engine:
        second = Speculator(engine, prefix_cache=cache).generate(
            Request(prompt, max_tokens=20, cache_prefix=len(head))
        ).run()
    assert second.stats.prefix_loaded == len(head) and second.tokens == first.tokens


def test_a_head_read_to_its_end_is_saved_even_when_told_to_stop(tiny_verifier_path: Path,
                                                              tmp_path: Path) -> None:
    """``eval_head`` in runs: a stop after a run short of the head's end leaves no file and says
    stop; a stop after the run that completes it saves the head and still says stop."""
    from openjarvis.engine.prefix_cache import eval_head

    cache = PrefixCache(tmp_path / "kv")
    with LlamaEngine(tiny_verifier_path, context=1024, threads=1) as engine:
        head = engine.tokenize(SYSTEM * 2)[:200]
        cached: list[int] = []
        ticks: list[int] = []

        def stop(n: int) -> bool:
            ticks.append(n)
            return False

        assert eval_head(engine, cached, head, 0, 200, cache, run=128, tick=stop) is False
        assert ticks == [128] and cached == head[:128] and not list((tmp_path / "kv").glob("*.kv"))
        assert eval_head(engine, cached, head, 128, 200, cache, run=128, tick=stop) is False
        assert ticks == [128, 72] and cached == head
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 1
