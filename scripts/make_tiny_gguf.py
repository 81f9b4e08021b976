"""Tiny Qwen2-architecture GGUF models: random weights, a small real byte-level BPE tokenizer.

Unit tests need models that llama.cpp loads in milliseconds, that tokenize text exactly the way the
real Qwen2.5 models do (byte-level BPE, ``tokenizer.ggml.pre = qwen2``, the Qwen special tokens and
chat template), and that pair for speculative decoding. This script builds them:

- the tokenizer: the 256 byte tokens, merges learned by a small BPE trainer from an embedded corpus
  of code, and the Qwen control tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` = EOS,
  the FIM tokens, ``<|repo_name|>``, ``<|file_sep|>``);
- the weights: random, F32. The drafter has 2 layers, the verifier 4: the same embedding, output
  head and first two layers (from a fixed seed; ``seed`` adds a little noise to a drafter's
  layers), then two small extra layers. Their predictions are correlated, so a speculative test
  sees acceptance well between 0 % and 100 %; attention makes the output depend on the whole
  context, so a KV-cache bug changes it;
- ``tokenizer="other"`` learns fewer merges, so its vocabulary differs (for pair-mismatch tests).

Everything is deterministic in ``seed``; building one takes well under a second.

Example::

    python scripts/make_tiny_gguf.py /tmp/drafter.gguf --role drafter --seed 1
    python scripts/make_tiny_gguf.py /tmp/other.gguf --tokenizer other
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Role = Literal["drafter", "verifier"]
TokenizerKind = Literal["qwen-tiny", "other"]

#: The Qwen2.5 special tokens, in Qwen's order; all of type CONTROL.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

#: Merges learned for each tokenizer kind; different counts give different vocabularies.
N_MERGES: dict[str, int] = {"qwen-tiny": 320, "other": 200}


@dataclass(frozen=True, slots=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int


#: The verifier is the drafter's two layers plus two more: twice the compute, correlated output.
SHAPES: dict[str, Shape] = {
    "drafter": Shape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=192),
    "verifier": Shape(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=192),
}
#: Layers both roles share (embedding, output head and these layers come from SHARED_SEED).
SHARED_LAYERS = 2
SHARED_SEED = 12345
#: Scale of the verifier's extra layers' output projections: it sets how often the drafter's
#: prediction differs from the verifier's (about a third of greedy steps at 0.2).
EXTRA_LAYER_SCALE = 0.2
#: Relative noise that ``seed`` adds to a drafter's shared layers.
DRAFTER_NOISE = 0.05
CONTEXT_LENGTH = 4096

# The Qwen2.5 chat template (as shipped in Qwen2.5-Coder-*-Instruct's tokenizer_config.json).
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:'
    '\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and'
    " arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful"
    " assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or'
    ' (message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>'"
    " + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

#: Training text for the BPE merges: ordinary Python and prose, the kind of text tests feed in.
CORPUS = '''\
def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


class Stack:
    def __init__(self) -> None:
        self.items: list[int] = []

    def push(self, item: int) -> None:
        self.items.append(item)

    def pop(self) -> int:
        return self.items.pop()

    def __len__(self) -> int:
        return len(self.items)


def read_config(path: str) -> dict[str, str]:
    result = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


for index in range(10):
    print(index, fibonacci(index))

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.exit(main())

The quick brown fox jumps over the lazy dog. Write a function that returns the sum of a list.
Explain what this code does, then return the file with the function changed.
You are a helpful assistant. Hello, world! The answer is 42.
'''

# The regex llama.cpp applies for pre = "qwen2", approximated with the stdlib ``re``
# (\\p{L} -> [^\\W\\d_], \\p{N} -> \\d). Training only needs it to be close.
_PRETOKENIZE = re.compile(
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\w]?[^\W\d_]+|\d| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def train_bpe(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Learn ``n_merges`` byte-level BPE merges from ``text`` (most frequent pair first)."""
    byte_map = bytes_to_unicode()
    words: Counter[tuple[str, ...]] = Counter(
        tuple(byte_map[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(text)
    )
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        # Most frequent; ties broken by the pair itself so training is deterministic.
        best = max(pairs.items(), key=lambda item: (item[1], item[0]))[0]
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


@dataclass(frozen=True, slots=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]

    def id(self, token: str) -> int:
        return self.tokens.index(token)


def build_vocab(kind: TokenizerKind) -> Vocab:
    """Byte tokens, then one token per merge, then the special tokens (CONTROL)."""
    from gguf import TokenType

    byte_map = bytes_to_unicode()
    tokens = [byte_map[b] for b in range(256)]
    merges = train_bpe(CORPUS, N_MERGES[kind])
    seen = set(tokens)
    for left, right in merges:
        if left + right not in seen:
            tokens.append(left + right)
            seen.add(left + right)
    types = [int(TokenType.NORMAL)] * len(tokens)
    tokens.extend(SPECIAL_TOKENS)
    types.extend([int(TokenType.CONTROL)] * len(SPECIAL_TOKENS))
    return Vocab(tokens=tokens, types=types, merges=[f"{a} {b}" for a, b in merges])


def _layer(rng: np.random.Generator, shape: Shape, out_scale: float) -> dict[str, np.ndarray]:
    """One transformer block's tensors (without the ``blk.N.`` prefix), numpy shape = [out, in]."""
    d, ff = shape.n_embd, shape.n_ff
    kv = d // shape.n_head * shape.n_head_kv
    std = 1.0 / np.sqrt(d)

    def rand(*dims: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    return {
        "attn_norm.weight": np.ones(d, dtype=np.float32),
        "attn_q.weight": rand(d, d, scale=std * 2.0),
        "attn_q.bias": rand(d, scale=0.1),
        "attn_k.weight": rand(kv, d, scale=std * 2.0),
        "attn_k.bias": rand(kv, scale=0.1),
        "attn_v.weight": rand(kv, d, scale=std),
        "attn_v.bias": rand(kv, scale=0.1),
        "attn_output.weight": rand(d, d, scale=std * out_scale),
        "ffn_norm.weight": np.ones(d, dtype=np.float32),
        "ffn_gate.weight": rand(ff, d, scale=std),
        "ffn_up.weight": rand(ff, d, scale=std),
        "ffn_down.weight": rand(d, ff, scale=out_scale / np.sqrt(ff)),
    }


def _weights(role: Role, n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Random F32 tensors named as llama.cpp's qwen2 loader expects."""
    shape = SHAPES[role]
    shared = np.random.default_rng(SHARED_SEED)
    rng = np.random.default_rng(seed)
    d = shape.n_embd
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": shared.standard_normal((n_vocab, d)).astype(np.float32),
        "output_norm.weight": np.ones(d, dtype=np.float32),
        "output.weight": (shared.standard_normal((n_vocab, d)) * 0.5).astype(np.float32),
    }
    for i in range(SHARED_LAYERS):
        for name, tensor in _layer(shared, shape, out_scale=1.0).items():
            if role == "drafter" and name.endswith("weight") and "norm" not in name:
                noise = rng.standard_normal(tensor.shape) * tensor.std() * DRAFTER_NOISE
                tensor = (tensor + noise).astype(np.float32)
            tensors[f"blk.{i}.{name}"] = tensor
    for i in range(SHARED_LAYERS, shape.n_layer):
        for name, tensor in _layer(rng, shape, out_scale=EXTRA_LAYER_SCALE).items():
            tensors[f"blk.{i}.{name}"] = tensor
    return tensors


def make_tiny_gguf(
    path: Path,
    *,
    role: Role = "verifier",
    seed: int = 0,
    tokenizer: TokenizerKind = "qwen-tiny",
) -> Path:
    """Write a tiny random-weight Qwen2 GGUF to ``path`` and return the path.

    Models of either role built with the same ``tokenizer`` share an identical vocabulary (and can
    pair for speculative decoding); ``seed`` changes the layers, not the shared bigram part.
    """
    import gguf

    if role not in SHAPES:
        raise ValueError(f"role must be 'drafter' or 'verifier', got {role!r}")
    if tokenizer not in N_MERGES:
        raise ValueError(f"tokenizer must be 'qwen-tiny' or 'other', got {tokenizer!r}")
    shape = SHAPES[role]
    vocab = build_vocab(tokenizer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")

    writer = gguf.GGUFWriter(tmp, "qwen2")
    writer.add_name(f"tiny-qwen2-{role}-{tokenizer}-s{seed}")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_eos_token_id(vocab.id("<|im_end|>"))
    writer.add_bos_token_id(vocab.id("<|endoftext|>"))
    writer.add_pad_token_id(vocab.id("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(QWEN25_CHAT_TEMPLATE)

    for name, tensor in _weights(role, len(vocab.tokens), seed).items():
        writer.add_tensor(name, tensor)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="where to write the .gguf")
    parser.add_argument("--role", choices=sorted(SHAPES), default="verifier")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", choices=sorted(N_MERGES), default="qwen-tiny")
    args = parser.parse_args(argv)
    out = make_tiny_gguf(args.out, role=args.role, seed=args.seed, tokenizer=args.tokenizer)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
