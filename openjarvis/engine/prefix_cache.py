"""A persistent prefix KV cache: the state of a long stable prefix, saved to disk.

A system prompt plus a repository map can be thousands of tokens, re-evaluated on every request
(seconds on a laptop CPU). Its KV state is saved once, keyed by a hash of the model's identity
and the prefix tokens, and loaded instead of recomputed.

A file is trusted only if every check passes: magic and format, the model key, the token list
(stored in full, compared exactly), and a sha256 over the payload; and llama.cpp must accept the
state and report the expected token count. Anything else is a cache miss, the file is deleted,
and the prefix is recomputed: a broken cache costs time, never correctness.

File layout: ``MAGIC`` | u32 header length | JSON header | int32 tokens | state bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from openjarvis import paths
from openjarvis.engine.base import Engine, greedy_eval
from openjarvis.errors import EngineError

MAGIC = b"OJPFXKV\x01"
#: 2: heads read in runs of ``RUN`` tokens (1: in one run). On llama.cpp's CPU path the state is
#: the same bits either way; on the torch engine's eager CPU path it differs in the last bits,
#: and a file must hold the state this code computes. 3: the torch engine's GPU path reads each
#: run in one wide step (``generate.WIDE_STEP``), whose K/V differ from the 32-token steps' in
#: the last bits of bf16, so a file of 2 no longer holds what it computes. 4: a GPU engine reads
#: a head in runs of its own (``run_of``: 1,024 tokens, in wide steps of that width), not 128.
FORMAT = 4
#: Prompts, and the stable heads saved here, are read in runs of this many tokens (between
#: runs a request can be cancelled or paused, and its progress told): the speculator's
#: ``PREFILL_CHUNK`` and the model drafter's catching up; an engine may ask for longer runs
#: of its own (``run_of``). A multiple of the torch runner's narrowest wide step
#: (``generate.WIDE_STEP``, 128) and of its 32-token steps (``MAX_STEP``).
RUN = 128
#: Prefixes shorter than this are cheaper to evaluate than to load.
MIN_TOKENS = 64
#: Oldest files are removed once the directory exceeds this many bytes.
MAX_BYTES = 2 * 1024**3


def run_of(engine: Engine, default: int = RUN) -> int:
    """The runs ``engine`` reads a prompt in: its ``prefill_run`` where it has one (a multiple
    of ``RUN``: the torch engine on a GPU, whose run of 1,024 is one wide step and takes
    milliseconds), else ``default`` (the speculator's ``PREFILL_CHUNK``). Always the same for
    one engine, so a head it saves is read as it would read it again."""
    run = getattr(engine, "prefill_run", None)
    return run if isinstance(run, int) and run > 0 and run % RUN == 0 else default


def default_dir() -> Path:
    return paths.cache_dir() / "prefix-kv"


class PrefixCache:
    def __init__(self, directory: Path | None = None, *, max_bytes: int = MAX_BYTES) -> None:
        self.directory = directory or default_dir()
        self.max_bytes = max_bytes
        #: Why the last load missed ("absent", "corrupt", ...), for tests and diagnostics.
        self.last_miss: str = ""

    def _model_key(self, engine: Engine) -> str:
        """The engine's ``state_key`` where it has one (the torch engine: the identity of the
        bits its K/V hold, which a speed tuning does not change), else its ``cost_key`` (the
        llama.cpp engine: model file, threads, flash attention), else its type."""
        key = getattr(engine, "state_key", None) or getattr(engine, "cost_key", None)
        base = key() if callable(key) else type(engine).__name__
        return f"{base}|{engine.vocab_fingerprint()}"

    def path_for(self, engine: Engine, tokens: Sequence[int]) -> Path:
        return self._path(self._model_key(engine), tokens)

    def _path(self, model_key: str, tokens: Sequence[int]) -> Path:
        h = hashlib.sha256(model_key.encode())
        h.update(np.asarray(tokens, dtype=np.int32).tobytes())
        return self.directory / f"{h.hexdigest()[:40]}.kv"

    def save(self, engine: Engine, tokens: Sequence[int]) -> Path | None:
        """Save the engine's cache, which must hold exactly ``tokens``; None if skipped."""
        if len(tokens) < MIN_TOKENS or engine.n_past != len(tokens):
            return None
        key = self._model_key(engine)  # (once: it stats the model file)
        path = self._path(key, tokens)
        if path.exists():
            return path
        state = engine.save_state()
        toks = np.asarray(tokens, dtype=np.int32).tobytes()
        header = json.dumps(
            {
                "format": FORMAT,
                "model": key,
                "n_tokens": len(tokens),
                "sha256": hashlib.sha256(toks + state).hexdigest(),
                "state_bytes": len(state),
            }
        ).encode()
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            fh.write(MAGIC + struct.pack("<I", len(header)) + header + toks + state)
        os.replace(tmp, path)
        self._evict()
        return path

    def load(self, engine: Engine, tokens: Sequence[int]) -> bool:
        """Load the state for exactly ``tokens`` into the engine (replacing its cache); False on a miss.

        A file that is absent or fails a check leaves the engine's cache as it was, so the caller
        can still reuse what it holds; a state the engine itself rejects leaves the cache empty.
        """
        key = self._model_key(engine)
        path = self._path(key, tokens)
        try:
            data = path.read_bytes()
        except OSError:
            self.last_miss = "absent"
            return False
        reason = self._check(key, tokens, data)
        if reason is None:
            offset = len(MAGIC) + 4 + struct.unpack_from("<I", data, len(MAGIC))[0] + 4 * len(tokens)
            try:
                engine.load_state(data[offset:])
            except EngineError:
                reason = "rejected by the engine"
            else:
                if engine.n_past == len(tokens):
                    with contextlib.suppress(OSError):
                        os.utime(path)  # recently used: evicted last
                    self.last_miss = ""
                    return True
                reason = f"state holds {engine.n_past} tokens, expected {len(tokens)}"
            engine.rollback(0)
        self.last_miss = reason
        with contextlib.suppress(OSError):
            path.unlink()
        return False

    def _check(self, model_key: str, tokens: Sequence[int], data: bytes) -> str | None:
        """None if the file is sound and matches; otherwise why not."""
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
            return "corrupt: bad magic"
        (n,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        try:
            header = json.loads(data[start : start + n])
        except ValueError:
            return "corrupt: bad header"
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            return "corrupt: unknown format"
        if header.get("model") != model_key:
            return "mismatch: other model"
        body = data[start + n :]
        toks = np.asarray(tokens, dtype=np.int32).tobytes()
        if header.get("n_tokens") != len(tokens) or body[: len(toks)] != toks:
            return "mismatch: other tokens"
        if len(body) != len(toks) + header.get("state_bytes", -1):
            return "corrupt: truncated"
        if hashlib.sha256(body).hexdigest() != header.get("sha256"):
            return "corrupt: checksum"
        return None

    def _evict(self) -> None:
        files = sorted(self.directory.glob("*.kv"), key=lambda p: p.stat().st_mtime, reverse=True)
        total = 0
        for f in files:
            total += f.stat().st_size
            if total > self.max_bytes:
                with contextlib.suppress(OSError):
                    f.unlink()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (list comparisons run in C; bisect the mismatch)."""
    a, b = list(a), list(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def restore_head(cache: PrefixCache, engine: Engine, cached: list[int], head: Sequence[int]) -> bool:
    """Load ``head``'s saved state unless ``cached`` (the tokens in ``engine``, in order)
    already starts with it. True: loaded, and ``cached`` is now ``head``. False: nothing loaded;
    ``cached`` is cut to what the engine still holds (a state it rejected empties its cache).
    The verifier and the model drafter both keep their heads this way."""
    if common_prefix(cached, head) >= len(head):
        return False
    if cache.load(engine, head):
        cached[:] = head
        return True
    del cached[engine.n_past :]
    return False


def eval_runs(
    engine: Engine,
    cached: list[int],
    tokens: Sequence[int],
    start: int,
    end: int,
    run: int = 0,
    tick: Callable[[int], bool] = lambda _n: True,
    *,
    argmax: bool = False,
) -> bool:
    """Evaluate ``tokens[start:end]`` (``cached`` holding ``tokens[:start]``), in runs of ``run``
    tokens (0: one run), calling ``tick(n)`` after each run of ``n``. A False from ``tick`` stops
    there (after the last run too): what was evaluated stays in the engine and in ``cached``.
    Returns whether ``tick`` never said stop. ``argmax``: each run by ``greedy_eval`` (an engine
    with ``eval_argmax`` then hands over no logits row).

    Where runs and one run give the same state: llama.cpp on the CPU (the same bits, measured on
    the real 0.5B in runs of 128 and of 100 against one of 700), and the torch runner's GPU
    steps, which take a run in wide steps of 1,024 to 128 tokens, widest first, then 32
    (``MAX_STEP``) at a time from its start, as runs of a multiple of 1,024 keep. Elsewhere
    (the torch engine's eager CPU path, llama.cpp offloading to a GPU) the last bits may
    differ; every head saved here is read in the engine's runs (``run_of``; ``FORMAT`` 2 on),
    so a saved state is the one a process computes."""
    step = run if run > 0 else max(1, end - start)
    for lo in range(start, end, step):
        part = tokens[lo : min(end, lo + step)]
        if argmax:
            greedy_eval(engine, part, last_only=True)
        else:
            engine.eval(part, last_only=True)
        cached.extend(part)
        if not tick(len(part)):
            return False
    return True


def eval_head(
    engine: Engine,
    cached: list[int],
    tokens: Sequence[int],
    start: int,
    head: int,
    cache: PrefixCache | None,
    *,
    run: int = RUN,
    tick: Callable[[int], bool] = lambda _n: True,
    argmax: bool = False,
) -> bool:
    """Evaluate ``tokens[start:head]`` and save the head's state: the head is always computed as
    a run of its own (in runs of ``run`` from ``start``: ``eval_runs``), so its state is the same
    bytes whether computed here or loaded from a file an earlier process saved, and the disk
    cache never changes an answer. A head ``tick`` stopped before its end is not saved; one it
    stopped on its last run is. Returns whether ``tick`` never said stop."""
    go = eval_runs(engine, cached, tokens, start, head, run, tick, argmax=argmax)
    if cache is not None and len(cached) == head:
        cache.save(engine, tokens[:head])
    return go
