"""``jarvis generate`` on the tiny models: streamed text on stdout, stats on stderr, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from openjarvis.cli import cli, main
from openjarvis.engine.llama import LlamaEngine
from openjarvis.engine.speculative import Request, Speculator
from openjarvis.engine.templates import Message, fim_prompt, render_chat


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def expected_answer(path: Path, text: str, max_tokens: int) -> str:
    with LlamaEngine(path, context=1024, threads=1) as engine:
        gen = Speculator(engine).generate(
            Request(engine.tokenize(text), max_tokens=max_tokens, drafter="none")
        )
        return gen.run().text


def test_chat_templated_answer_streams_to_stdout(
    tiny_verifier_path: Path, tiny_drafter_path: Path
) -> None:
    code, out, err = run(
        "generate", "Write a stack class.", "--max-tokens", "24", "--stats",
        "--verifier", str(tiny_verifier_path), "--drafter-model", str(tiny_drafter_path),
    )
    assert code == 0, err
    with LlamaEngine(tiny_verifier_path, threads=1) as engine:
        template = engine.chat_template()
    prompt = render_chat(template, [Message("user", "Write a stack class.")])
    assert prompt.startswith("<|im_start|>system\nYou are Qwen")
    assert prompt.endswith("<|im_start|>user\nWrite a stack class.<|im_end|>\n<|im_start|>assistant\n")
    assert out == expected_answer(tiny_verifier_path, prompt, 24)
    assert err.startswith("tokens ") and "tok/s" in err and err.count("\n") == 1


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_raw_prompt_identical_for_every_drafter(
    drafter: str, tiny_verifier_path: Path, tiny_drafter_path: Path
) -> None:
    code, out, err = run(
        "generate", "--raw", "def fibonacci(n):\n", "--max-tokens", "40", "--drafter", drafter,
        "--verifier", str(tiny_verifier_path), "--drafter-model", str(tiny_drafter_path),
    )
    assert code == 0, err
    assert out == expected_answer(tiny_verifier_path, "def fibonacci(n):\n", 40)


def test_fim_prompt(tiny_verifier_path: Path) -> None:
    code, out, _ = run(
        "generate", "--fim", "def add(a, b):\n    ", "--suffix", "\n\nprint(add(1, 2))\n",
        "--max-tokens", "12", "--drafter", "none", "--verifier", str(tiny_verifier_path),
    )
    assert code == 0
    text = fim_prompt("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    assert text == "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"
    assert out == expected_answer(tiny_verifier_path, text, 12)


def test_help_ends_with_an_example() -> None:
    code, out, _ = run("generate", "--help")
    assert code == 0
    lines = [line.strip() for line in out.splitlines()]
    example = lines.index("Example:")
    assert lines[example + 1].startswith('jarvis generate "')
    assert "--drafter [auto|model|ngram|none]" in out


def test_missing_models_are_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hello"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: model qwen2.5-coder-1.5b is not installed; run `jarvis models install")
    assert err.count("\n") == 1


def test_no_prompt_is_a_usage_error() -> None:
    code, _, err = run("generate")
    assert code == 2 and "give a PROMPT" in err
