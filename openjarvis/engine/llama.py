"""The llama-cpp-python Engine: one GGUF model, one context, one sequence.

Built on llama-cpp-python's thin wrappers of the C API (``llama_cpp._internals``, pinned at 0.3.36)
rather than on ``llama_cpp.Llama``: ``Llama`` keeps a ``[n_ctx or n_batch, n_vocab]`` float array
of scores (311 MB for Qwen's 151,936-token vocabulary at n_batch 512, 5 GB at n_ctx 8192 with
``logits_all``) and its own token bookkeeping. Here ``eval`` asks llama.cpp for exactly the logits
rows it needs, and rollback is one ``llama_memory_seq_rm`` call.

Example::

    engine = LlamaEngine(Path("model.gguf"), context=4096, threads=2)
    logits = engine.eval(engine.tokenize("def add(a, b):"), last_only=True)  # [1, n_vocab]
    engine.rollback(0)
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from openjarvis.config import EngineConfig
from openjarvis.engine.base import Logits
from openjarvis.engine.costs import MeasuredCosts
from openjarvis.errors import ContextOverflow, EngineError


def physical_cores() -> int:
    """Physical CPU cores (hyper-threads share the matmul units llama.cpp saturates)."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def device_name() -> str:
    """A short, stable description of the CPU, part of the cost-model cache key."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"cpu:{model}"


#: ggml.h's ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation (llama-cpp-python's
#: _logger.py still has an older order, in which 3 was error: that let warnings through and no errors).
_LOG_ERROR = 4
_log_state = {"last": 0}
#: Errors llama.cpp logs, and then repairs itself, for models we ship (Qwen's ``</s>`` token).
_HARMLESS = (b"control-looking token",)
_log_callback: Any = None


def _quiet_llama_logs() -> None:
    """Route llama.cpp's log to stderr for errors only (its loader warns about Qwen's vocabulary
    on every load). Replaces llama-cpp-python's callback, which lets continuation lines through
    and, with ``verbose=False``, redirects the process's stdout/stderr during loads."""
    global _log_callback
    if _log_callback is not None:
        return
    import sys

    import llama_cpp

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if level != 5:
            _log_state["last"] = level
        if _log_state["last"] == _LOG_ERROR and not any(h in text for h in _HARMLESS):
            sys.stderr.write(text.decode("utf-8", errors="replace"))

    _log_callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


def cost_key_for(path: Path, threads: int, flash_attn: bool = False) -> str:
    """The cost-model cache key of a model file run with these settings (no loading needed)."""
    import llama_cpp

    st = path.stat()
    fa = "fa" if flash_attn else "nofa"
    return (
        f"{path.name}:{st.st_size}:{int(st.st_mtime)}|{device_name()}|t{threads or physical_cores()}"
        f"|{fa}|llama-cpp-python {llama_cpp.__version__}"
    )


class GgufInfo:
    """What the assistant asks of a model besides its logits: its name, GGUF metadata, chat
    template and special tokens, as llama.cpp reads them. Shared by every engine that tokenizes
    with llama.cpp (``LlamaEngine``, and ``TorchEngine`` through its vocab-only model)."""

    path: Path
    _metadata: dict[str, str] | None = None

    def _gguf_model(self) -> Any:
        """The llama.cpp model (full or vocab-only) the metadata is read from."""
        raise NotImplementedError

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return self.metadata.get("general.name", self.path.stem)

    @property
    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata as llama.cpp renders it (arrays are summarised)."""
        if self._metadata is None:
            self._metadata = dict(self._gguf_model().metadata())
        return self._metadata

    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    def special_token(self, text: str) -> int | None:
        """The id of a special token such as ``<|fim_prefix|>``, or None if the vocabulary lacks it."""
        ids = self.tokenize(text, special=True)
        return ids[0] if len(ids) == 1 else None


class LlamaEngine(GgufInfo, MeasuredCosts):
    """An :class:`~openjarvis.engine.base.Engine` over one llama.cpp context (sequence 0)."""

    def __init__(
        self,
        path: Path,
        *,
        context: int = 8192,
        batch: int = 512,
        threads: int = 0,
        gpu_layers: int = 0,
        flash_attn: bool = False,
    ) -> None:
        import llama_cpp
        from llama_cpp import _internals

        _quiet_llama_logs()
        self.path = Path(path)
        self.threads = threads or physical_cores()
        self.batch = batch
        self.flash_attn = flash_attn
        if not self.path.is_file():
            raise EngineError(f"model file not found: {self.path}; run `jarvis models list`")

        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0x7FFFFFFF if gpu_layers == -1 else gpu_layers
        model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
        try:
            self._model = _internals.LlamaModel(
                path_model=str(self.path), params=model_params, verbose=True
            )
        except ValueError as exc:
            raise EngineError(
                f"llama.cpp cannot load {self.path} (corrupt, truncated or unsupported GGUF);"
                " run `jarvis models verify`"
            ) from exc
        n_ctx = min(context, self._model.n_ctx_train()) if context > 0 else self._model.n_ctx_train()
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = min(batch, n_ctx)
        ctx_params.n_ubatch = min(batch, n_ctx)
        ctx_params.n_threads = self.threads
        ctx_params.n_threads_batch = self.threads
        ctx_params.n_seq_max = 1
        ctx_params.no_perf = True
        ctx_params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        try:
            self._ctx = _internals.LlamaContext(model=self._model, params=ctx_params, verbose=False)
        except ValueError as exc:
            self._model.close()  # type: ignore[no-untyped-call]
            raise EngineError(
                f"llama.cpp cannot create a {n_ctx}-token context for {self.path.name};"
                " lower engine.context"
            ) from exc
        self._n_batch = int(ctx_params.n_batch)
        self._batch = _internals.LlamaBatch(n_tokens=self._n_batch, embd=0, n_seq_max=1, verbose=False)
        self._n_vocab = int(self._model.n_vocab())
        self._n_ctx = int(self._ctx.n_ctx())
        self._n_past = 0
        self._fingerprint: str | None = None
        #: (tokens, last_only) -> number of ``eval`` calls: what a benchmark prices with the
        #: measured cost model, independent of the load on a shared machine.
        self.eval_counts: Counter[tuple[int, bool]] = Counter()
        vocab = self._model.vocab
        self._eos = frozenset(
            t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)
        )

    @classmethod
    def from_config(cls, path: Path, config: EngineConfig) -> LlamaEngine:
        return cls(
            path,
            context=config.context,
            batch=config.batch,
            threads=config.threads,
            gpu_layers=config.gpu_layers,
            flash_attn=config.flash_attn,
        )

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        self._batch.close()  # type: ignore[no-untyped-call]
        self._ctx.close()  # type: ignore[no-untyped-call]
        self._model.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> LlamaEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Engine protocol ------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    def _gguf_model(self) -> Any:
        return self._model

    def vocab_fingerprint(self) -> str:
        """sha256 over every token's text and attributes: equal means the ids mean the same text."""
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(self._model, self._n_vocab, self._eos)
        return self._fingerprint

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return tokenize(self._model, text, special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return detokenize(self._model, tokens)

    def eval(self, tokens: Sequence[int], *, last_only: bool = False) -> Logits:
        """Append ``tokens`` and return logits ``[len(tokens), n_vocab]`` (``[1, n_vocab]`` if
        ``last_only``: prefill needs only the last row, and each row costs an output projection)."""
        import llama_cpp

        if not tokens:
            raise EngineError("eval needs at least one token")
        if self._n_past + len(tokens) > self._n_ctx:
            raise ContextOverflow(
                f"{self._n_past + len(tokens)} tokens exceed the {self._n_ctx}-token context of"
                f" {self.path.name}; raise engine.context or shorten the prompt"
            )
        self.eval_counts[(len(tokens), last_only)] += 1
        rows: list[Logits] = []
        for start in range(0, len(tokens), self._n_batch):
            chunk = tokens[start : start + self._n_batch]
            final = start + len(chunk) == len(tokens)
            b = self._batch.batch
            b.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                b.token[i] = int(t)
                b.pos[i] = self._n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = not last_only
            b.logits[len(chunk) - 1] = (not last_only) or final
            rc = llama_cpp.llama_decode(self._ctx.ctx, b)
            if rc != 0:
                # The failed batch may have left part of itself in the cache; drop it.
                self._remove_from(self._n_past)
                raise EngineError(f"llama_decode failed with code {rc} at position {self._n_past}")
            self._n_past += len(chunk)
            if last_only and not final:
                continue
            n_out = 1 if last_only else len(chunk)
            ptr = llama_cpp.llama_get_logits(self._ctx.ctx)
            rows.append(np.ctypeslib.as_array(ptr, shape=(n_out * self._n_vocab,)).reshape(n_out, -1).copy())
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self._n_past:
            raise EngineError(f"cannot roll back to {n}: the cache holds {self._n_past} tokens")
        if n < self._n_past:
            self._remove_from(n)
            self._n_past = n

    def _remove_from(self, n: int) -> None:
        import llama_cpp

        if not llama_cpp.llama_memory_seq_rm(self._ctx.memory, 0, n, -1):
            raise EngineError(f"llama.cpp could not remove cache entries from position {n}")

    def save_state(self) -> bytes:
        import llama_cpp

        size = llama_cpp.llama_state_seq_get_size(self._ctx.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buf, size, 0)
        return bytes(buf[:written])

    def load_state(self, state: bytes) -> None:
        """Replace the cache with a saved one; a state llama.cpp rejects leaves the cache empty."""
        import llama_cpp

        self._remove_from(0)
        self._n_past = 0
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if llama_cpp.llama_state_seq_set_data(self._ctx.ctx, buf, len(state), 0) == 0:
            self._remove_from(0)
            raise EngineError(f"llama.cpp rejected a saved state for {self.path.name}")
        self._n_past = int(llama_cpp.llama_memory_seq_pos_max(self._ctx.memory, 0)) + 1

    def cost_key(self) -> str:
        """(model, device, threads, backend) identity the measured cost model is cached under."""
        return cost_key_for(self.path, self.threads, self.flash_attn)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "threads": self.threads, "n_ctx": self._n_ctx}


# -- vocabulary operations on a llama.cpp model, shared with the torch backend's tokenizer ----------


def vocab_fingerprint(model: Any, n_vocab: int, eos: Iterable[int]) -> str:
    """sha256 over every token's text and attributes and the end tokens of a loaded model."""
    import llama_cpp

    vocab = model.vocab
    h = hashlib.sha256()
    for t in range(n_vocab):
        h.update(llama_cpp.llama_vocab_get_text(vocab, t) or b"")
        h.update(b"\0%d\0" % llama_cpp.llama_vocab_get_attr(vocab, t))
    h.update(repr(sorted(eos)).encode())
    return h.hexdigest()


def tokenize(model: Any, text: str, special: bool) -> list[int]:
    data = text.encode("utf-8")
    add_bos = bool(model.add_bos_token())
    return [int(t) for t in model.tokenize(data, add_bos, special)] if data else []


def detokenize(model: Any, tokens: Sequence[int]) -> bytes:
    """Bytes, not str: a token can end inside a UTF-8 character."""
    import llama_cpp

    vocab = model.vocab
    out = bytearray()
    buf = ctypes.create_string_buffer(256)
    for t in tokens:
        n = llama_cpp.llama_token_to_piece(vocab, llama_cpp.llama_token(int(t)), buf, 256, 0, True)
        if n < 0:
            raise EngineError(f"token {t} has a piece longer than 256 bytes")
        out += buf.raw[:n]
    return bytes(out)
