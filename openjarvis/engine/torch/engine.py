"""TorchEngine: the Engine Protocol over the torch backend, for the speculator to drive.

Weights come from the same GGUF file llama.cpp loads (dequantized once, see ``weights.py``);
tokenization is llama.cpp's own, loaded vocab-only (no weights), so token ids, the vocabulary
fingerprint and detokenized bytes match the llama.cpp engine exactly and the two can pair.

Extra capability beyond the Protocol: ``eval_argmax`` (greedy) returns the argmax of each row
from steps whose output projection keeps only each program's largest logit (``Runner.argmax``):
no ``[T, 151936]`` float32 logits are written, let alone copied to the host. The speculator and
the model drafter use it for greedy requests (``base.greedy_eval``), and the model drafter
``draft_greedy``, a whole greedy draft in one call.

Example::

    engine = TorchEngine.from_gguf(path)            # CUDA + bf16 if present, else CPU float32
    logits = engine.eval(engine.tokenize("def f():"), last_only=True)   # [1, n_vocab]
    engine.rollback(0)
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from openjarvis.config import EngineConfig
from openjarvis.engine.base import Logits
from openjarvis.engine.costs import MeasuredCosts
from openjarvis.engine.llama import GgufInfo, detokenize, tokenize, vocab_fingerprint
from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.generate import MAX_CHAIN, MAX_STEP, Kernels, Runner
from openjarvis.engine.torch.model import Transformer
from openjarvis.engine.torch.weights import load_gguf
from openjarvis.errors import ContextOverflow, EngineError

#: Token counts captured at load on the GPU: every T a request can run as one step. A verify
#: is at most 17 tokens (16 drafts); a prompt is read in steps of ``MAX_STEP`` and one of what
#: is left (1 to 31 tokens), by the verifier with logits and by the model drafter greedy (its
#: catch-up: ``prefix_cache.eval_runs``). Before session 24 only 1-17 and 32 were captured,
#: so a prompt that left 18-31 tokens, and a drafter reading any prompt longer than 17
#: tokens, captured steps (and on a first start compiled them) inside the first requests that
#: did (``scripts/bench_pair_gpu.py``: ~1 s of a first answer's drafting).
WARM_STEPS = tuple(range(1, MAX_STEP + 1))
#: The same for greedy steps (``eval_argmax``).
WARM_GREEDY = WARM_STEPS


class Vocab:
    """llama.cpp's tokenizer of a GGUF file, loaded without weights."""

    def __init__(self, path: Path) -> None:
        import llama_cpp
        from llama_cpp import _internals
        from llama_cpp._logger import set_verbose

        set_verbose(False)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        try:
            self._model = _internals.LlamaModel(path_model=str(path), params=params, verbose=False)
        except ValueError as exc:
            raise EngineError(f"llama.cpp cannot read the vocabulary of {path}") from exc
        self.n_vocab = int(self._model.n_vocab())
        vocab = self._model.vocab
        self.eos = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)
        )
        self._fingerprint: str | None = None

    def fingerprint(self) -> str:
        """sha256 over every token's text and attributes, as ``LlamaEngine`` computes it."""
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(self._model, self.n_vocab, self.eos)
        return self._fingerprint

    def tokenize(self, text: str, special: bool) -> list[int]:
        return tokenize(self._model, text, special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return detokenize(self._model, tokens)

    def close(self) -> None:
        self._model.close()  # type: ignore[no-untyped-call]


class TorchEngine(GgufInfo, MeasuredCosts):
    """An :class:`~openjarvis.engine.base.Engine` over one :class:`Runner` (one sequence); its
    name, chat template and special tokens come from the vocab-only llama.cpp model."""

    def _gguf_model(self) -> Any:
        return self.vocab._model

    def __init__(
        self,
        path: Path,
        args: ModelArgs,
        runner: Runner,
        vocab: Vocab,
    ) -> None:
        self.path = Path(path)
        self.args = args
        self.runner = runner
        self.vocab = vocab
        self._n_past = 0
        if vocab.n_vocab > args.n_vocab:
            raise EngineError(
                f"{self.path.name}: tokenizer has {vocab.n_vocab} tokens, the model {args.n_vocab}"
            )
        runner.greedy_cols = vocab.n_vocab  # a greedy step never picks a padding row

    @classmethod
    def from_gguf(
        cls,
        path: str | Path,
        *,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        context: int = 8192,
        kernels: Kernels | None = None,
        graphs: bool | None = None,
        warmup: bool | None = None,
        deterministic: bool = False,
    ) -> TorchEngine:
        """Load ``path``: CUDA and bfloat16 when a GPU is present, else the CPU in float32.

        ``warmup`` (default: on the GPU) captures every step a request runs (``WARM_STEPS``, 1 to
        ``MAX_STEP`` tokens, logits and greedy, and the wide steps of a prompt's runs) at load,
        so no request pays Triton compilation or graph capture. ``deterministic``
        (setting ``engine.deterministic``) trades speed for bit-identical GPU results run to run
        (``Runner.make_deterministic``)."""
        path = Path(path)
        if not path.is_file():
            raise EngineError(f"model file not found: {path}; run `jarvis models list`")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dt = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        args, weights, _ = load_gguf(path, dt, dev)
        n_ctx = min(context, args.n_ctx_train) if context > 0 else args.n_ctx_train
        from openjarvis.engine.torch.cache import SLACK

        model = Transformer(args, weights, n_pos=n_ctx + SLACK)
        runner = Runner(model, n_ctx, kernels=kernels, graphs=graphs)
        if deterministic:
            runner.make_deterministic()
        engine = cls(path, args, runner, Vocab(path))
        if warmup if warmup is not None else runner.graphs:
            try:
                runner.warmup(WARM_STEPS)
                runner.warmup(WARM_GREEDY, greedy=True)  # after greedy_cols is set: it sizes them
                runner.warm_wide()  # a prompt's runs (``Runner.wide``)
            except BaseException:
                engine.close()
                raise
        return engine

    @classmethod
    def from_config(cls, path: Path, config: EngineConfig) -> TorchEngine:
        return cls.from_gguf(path, context=config.context, deterministic=config.deterministic)

    def close(self) -> None:
        self.vocab.close()

    def __enter__(self) -> TorchEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Engine protocol ------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.runner.n_ctx

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def prefill_run(self) -> int:
        """Tokens a run of a prompt's reading (``prefix_cache.run_of``): on the GPU one widest
        wide step (``Runner.wide``, 1,024: 7-9 ms, so a cancel between runs still lands at
        once), elsewhere ``prefix_cache.RUN``."""
        from openjarvis.engine.prefix_cache import RUN

        r = self.runner
        return r.wide if r.kernels == "triton" and r.graphs and r.wide > 0 and r.wide % RUN == 0 else RUN

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.vocab.eos

    def vocab_fingerprint(self) -> str:
        return self.vocab.fingerprint()

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self.vocab.detokenize(tokens)

    def _check(self, tokens: Sequence[int]) -> None:
        if not tokens:
            raise EngineError("eval needs at least one token")
        if self._n_past + len(tokens) > self.n_ctx:
            raise ContextOverflow(
                f"{self._n_past + len(tokens)} tokens exceed the {self.n_ctx}-token context of"
                f" {self.path.name}; raise engine.context or shorten the prompt"
            )
        if min(tokens) < 0 or max(tokens) >= self.args.n_vocab:
            raise EngineError(f"token id out of range 0..{self.args.n_vocab - 1}")

    def _forward(self, tokens: Sequence[int], last_only: bool = False) -> torch.Tensor:
        self._check(tokens)
        out = self.runner.logits(tokens, self._n_past, last_only=last_only)  # [T, V] on device
        self._n_past += len(tokens)
        return out

    def eval(self, tokens: Sequence[int], *, last_only: bool = False) -> Logits:
        out = self._forward(tokens, last_only)
        arr: Logits = self.runner.host(out[:, : self.n_vocab].float()).numpy()
        return arr

    def eval_argmax(self, tokens: Sequence[int], *, last_only: bool = False) -> list[int]:
        """Greedy shortcut: ``eval(tokens).argmax(-1)`` (ties to the lowest id), from steps
        that never write the logits; only ``len(tokens)`` integers reach the host (one with
        ``last_only``, where on the CPU only the last row is projected, as in ``eval``)."""
        self._check(tokens)
        ids = self.runner.greedy_tokens(tokens, self._n_past, last_only=last_only)
        self._n_past += len(tokens)
        return ids

    def warm_drafts(self) -> None:
        """Capture ``draft_greedy``'s graphs of every length a draft can take now, not during
        the first requests (the model drafter calls it once; a no-op off the GPU's graphs)."""
        self.runner.warm_chains(range(1, MAX_CHAIN), self._n_past)

    def draft_greedy(self, token: int, n: int) -> list[int]:
        """Greedy drafting in one call: evaluate ``token``, then each step's greedy token, ``n``
        steps in all (the cache grows by ``n``); their ``n`` greedy tokens, the last one not
        evaluated. On the GPU one graph replay (``Runner.draft``): no host round trip between
        draft tokens. The model drafter uses it where the engine has it."""
        if n < 1:
            raise EngineError(f"draft_greedy needs n >= 1, got {n}")
        if not 0 <= token < self.args.n_vocab:
            raise EngineError(f"token id out of range 0..{self.args.n_vocab - 1}")
        self._check([token] * n)
        out = self.runner.draft(token, self._n_past, n)
        self._n_past += n
        return out

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self._n_past:
            raise EngineError(f"cannot roll back to {n}: the cache holds {self._n_past} tokens")
        self._n_past = n  # positions >= n are dead: masked by position, overwritten later

    def save_state(self) -> bytes:
        k, v = self.runner.cache.snapshot(self._n_past)
        buf = io.BytesIO()
        torch.save({"n_past": self._n_past, "k": k, "v": v, "model": self.path.name}, buf)
        return buf.getvalue()

    def load_state(self, state: bytes) -> None:
        try:
            data = torch.load(io.BytesIO(state), weights_only=True)
            self.runner.cache.restore(data["k"], data["v"])
            n = int(data["n_past"])
        except (RuntimeError, KeyError, ValueError, TypeError, EOFError,
                pickle.UnpicklingError) as exc:
            self._n_past = 0
            raise EngineError(f"a saved state does not fit {self.path.name}") from exc
        self._n_past = n

    def _identity(self) -> str:
        """(model file, device, backend): what both keys below start from."""
        st = self.path.stat()
        r = self.runner
        name = torch.cuda.get_device_name(r.device) if r.device.type == "cuda" else "cpu"
        return (
            f"{self.path.name}:{st.st_size}|{r.device.type}:{name}|torch-{r.kernels}"
            f"-{'graphs' if r.graphs else 'eager'}-{r.model.dtype}"
        )

    def cost_key(self) -> str:
        """(model, device, backend) identity the measured cost model is cached under: all that
        changes what a step costs. The shared-memory floors of verify steps (session 40) are
        named, so tables timed before them (verify ~2 % dearer) are measured again."""
        r = self.runner
        floors = ",".join(
            f"{name}{'@v' if verify else ''}={nbytes}"
            for (name, verify), nbytes in sorted(r.smem_floor.items()) if nbytes > 0
        )
        return (
            self._identity()
            + "-argmax"  # timed as greedy calls (``costs.measure``): not session 13's tables
            + ("-deterministic" if r.deterministic else "")  # its verify steps cost more
            + (f"-floors<={r.smem_floor_max_t}:{floors}" if floors else "")
        )

    def state_key(self) -> str:
        """The identity of the bits a saved state holds (``prefix_cache``'s model key): all
        that changes the K/V this engine computes for a head, and nothing that changes only
        its speed (the floors, the cost tables' "-argmax"), so a tuning of speed keeps users'
        saved heads. A head is read in runs of ``prefill_run``, on the Triton path in wide
        steps of ``Runner.wide_widths``, whose K/V differ from narrower steps' in the last bits
        of bf16 (the torch path has no wide steps)."""
        r = self.runner
        wide = r.wide_widths if r.kernels == "triton" else ()
        return (
            self._identity() + f"-run{self.prefill_run}"
            + (f"-wide{'/'.join(map(str, wide))}" if wide else "")
            + ("-deterministic" if r.deterministic else "")  # unsplit kernels: other bits
        )

    def describe(self) -> dict[str, Any]:
        r = self.runner
        return {
            "path": str(self.path), "device": str(r.device), "dtype": str(r.model.dtype),
            "kernels": r.kernels, "graphs": r.graphs, "n_ctx": self.n_ctx,
            "deterministic": r.deterministic,
        }


__all__ = ["TorchEngine", "Vocab"]
