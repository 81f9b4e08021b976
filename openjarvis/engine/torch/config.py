"""The shape of a model, read from GGUF metadata; no torch here.

``ModelArgs`` holds what the GGUF header says (gpt-fast's ``ModelArgs``) and derives the rest
(head_dim, GQA group size, fused QKV width) in ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Architectures this backend runs: Qwen2 (QKV bias, NeoX RoPE). Llama-style models differ in
#: bias and in llama.cpp's Q/K row permutation; they would be a small addition here.
SUPPORTED_ARCHS = ("qwen2",)


@dataclass(frozen=True, slots=True)
class ModelArgs:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    n_ctx_train: int = 32768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tied_embeddings: bool = True
    qkv_bias: bool = True
    # derived
    head_dim: int = field(init=False)
    group: int = field(init=False)
    q_dim: int = field(init=False)
    kv_dim: int = field(init=False)
    qkv_dim: int = field(init=False)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"inconsistent heads: {self.n_embd=} {self.n_head=} {self.n_head_kv=}")
        hd = self.n_embd // self.n_head
        if hd % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {hd}")
        object.__setattr__(self, "head_dim", hd)
        object.__setattr__(self, "group", self.n_head // self.n_head_kv)
        object.__setattr__(self, "q_dim", self.n_head * hd)
        object.__setattr__(self, "kv_dim", self.n_head_kv * hd)
        object.__setattr__(self, "qkv_dim", (self.n_head + 2 * self.n_head_kv) * hd)

    @property
    def n_params(self) -> int:
        """Parameters read per token (embeddings counted once when tied: as the output matrix)."""
        d, f = self.n_embd, self.n_ff
        per_layer = d * self.qkv_dim + self.qkv_dim + self.q_dim * d + 3 * d * f + 2 * d
        return self.n_layer * per_layer + self.n_vocab * d + d

    def kv_bytes(self, n_tokens: int, bytes_per: int = 2) -> int:
        """Bytes of K and V held for ``n_tokens`` positions over all layers."""
        return 2 * self.n_layer * n_tokens * self.kv_dim * bytes_per

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> ModelArgs:
        """Build from GGUF key/values (``general.architecture``, ``<arch>.block_count``, ...)."""
        arch = str(meta["general.architecture"])
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"architecture {arch!r} is not supported (have {SUPPORTED_ARCHS})")
        n_head = int(meta[f"{arch}.attention.head_count"])
        return cls(
            arch=arch,
            n_layer=int(meta[f"{arch}.block_count"]),
            n_embd=int(meta[f"{arch}.embedding_length"]),
            n_ff=int(meta[f"{arch}.feed_forward_length"]),
            n_head=n_head,
            n_head_kv=int(meta.get(f"{arch}.attention.head_count_kv", n_head)),
            n_vocab=int(meta["n_vocab"]),
            n_ctx_train=int(meta.get(f"{arch}.context_length", 32768)),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            tied_embeddings=bool(meta["tied_embeddings"]),
            qkv_bias=arch == "qwen2",
        )


#: Shapes of the default pair (Qwen2.5-Coder-1.5B / 0.5B), for benchmarks with random weights.
QWEN25_1_5B = ModelArgs("qwen2", 28, 1536, 8960, 12, 2, 151936)
QWEN25_0_5B = ModelArgs("qwen2", 24, 896, 4864, 14, 2, 151936)
