"""Prompts in the model's own format: its GGUF chat template, and Qwen2.5-Coder fill-in-the-middle.

The chat template is the Jinja text in the GGUF's ``tokenizer.chat_template``, rendered in a
sandbox (as Hugging Face and llama.cpp do), so a model brings its own format and nothing is
inferred from its name. FIM uses the Qwen2.5-Coder special tokens; a model whose vocabulary
lacks them is refused with a clear error rather than given a prompt it cannot read.

Example::

    text = render_chat(template, [Message("user", "Write a stack class.")])
    fim = fim_prompt("def add(a, b):\\n    ", "\\n\\nprint(add(1, 2))\\n")
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from openjarvis.errors import EngineError

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@dataclass(frozen=True, slots=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


def render_chat(
    template: str | None, messages: list[Message], *, add_generation_prompt: bool = True
) -> str:
    """Render ``messages`` with the model's chat template (Jinja, sandboxed)."""
    if not template:
        raise EngineError(
            "this model has no chat template in its GGUF metadata; use --raw or --fim"
        )
    import jinja2

    try:
        compiled = _compile(template)
        rendered: Any = compiled.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=None,
        )
    except jinja2.TemplateError as exc:
        raise EngineError(f"the model's chat template does not render: {exc}") from exc
    return str(rendered)


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    """The sandboxed, compiled template: a request renders its prompt two to four times (the
    whole prompt, its head, again after fitting the context), and compiling costs ~6 ms."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise EngineError(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def head_length(
    template: str | None,
    messages: Sequence[Message],
    n_messages: int,
    tokens: Sequence[int],
    tokenize: Callable[[str], list[int]],
) -> int:
    """Tokens of ``tokens`` (the rendered, tokenized ``messages``) that are its first
    ``n_messages`` turns, complete with their end-of-turn markup; 0 if that is not token-exact.

    The stable head of a prompt (system prompt + repository map) is cached by its tokens, so the
    head must tokenize the same alone as inside the whole prompt. Ending it on a turn boundary
    (Qwen's ``<|im_end|>\n`` before the next ``<|im_start|>``, both special tokens) makes that
    so for the templates we ship; it is checked here rather than assumed, because a template may
    render a conversation of only those turns differently (a default system turn, a BOS).
    """
    if n_messages <= 0 or n_messages >= len(messages):
        return 0
    head = tokenize(render_chat(template, list(messages[:n_messages]), add_generation_prompt=False))
    return len(head) if head and list(tokens[: len(head)]) == head else 0


def fim_prompt(prefix: str, suffix: str) -> str:
    """Qwen2.5-Coder fill-in-the-middle: the model writes what goes between prefix and suffix."""
    pre, suf, mid = FIM_TOKENS
    return f"{pre}{prefix}{suf}{suffix}{mid}"


def check_fim(special_token_ids: dict[str, int | None]) -> None:
    """Refuse FIM for a vocabulary without the FIM tokens (``special_token_ids`` by text)."""
    missing = [t for t in FIM_TOKENS if special_token_ids.get(t) is None]
    if missing:
        raise EngineError(
            f"this model has no fill-in-the-middle tokens ({', '.join(missing)});"
            " use a Qwen2.5-Coder model for --fim"
        )
