"""``jarvis generate``: one answer from the local model pair, streamed to stdout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from openjarvis.cli import CONTEXT_SETTINGS, flag_overrides

if TYPE_CHECKING:
    from openjarvis.models import Catalog


def _resolve(value: str, default_id: str, catalog: Catalog) -> Path:
    """A model given as a file path or a catalog id (``value`` empty: the pair's model)."""
    if value and Path(value).expanduser().is_file():
        return Path(value).expanduser()
    return catalog.installed_path(value or default_id)


@click.command(context_settings=CONTEXT_SETTINGS, short_help="Generate an answer with the local models.")
@click.argument("prompt", required=False)
@click.option("--raw", is_flag=True, help="Send PROMPT as-is, without the chat template.")
@click.option("--system", default="", help="System message for the chat template.")
@click.option("--fim", "fim_prefix", metavar="PREFIX", help="Fill in the middle: code before the gap.")
@click.option("--suffix", default="", metavar="SUFFIX", help="With --fim: code after the gap.")
@click.option("--temperature", type=float, help="0 is greedy (the default from config).")
@click.option("--top-k", type=int, help="Sample among the k likeliest tokens (0 = all).")
@click.option("--top-p", type=float, help="Nucleus sampling mass (1.0 = all).")
@click.option("--seed", type=int, help="Random seed for sampling.")
@click.option("--max-tokens", type=int, help="Upper bound on generated tokens.")
@click.option("--stop", multiple=True, help="Stop before this text (repeatable).")
@click.option(
    "--drafter",
    type=click.Choice(["auto", "model", "ngram", "none"]),
    help="Speculative drafter; auto picks per step from measured costs.",
)
@click.option(
    "--context-file",
    "context_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A file the answer may copy from (the n-gram drafter drafts from it). Repeatable.",
)
@click.option("--verifier", "verifier_opt", default="", help="Verifier model: catalog id or GGUF path.")
@click.option("--drafter-model", default="", help="Drafter model: catalog id or GGUF path.")
@click.option("--stats", is_flag=True, help="Print a statistics line on stderr at the end.")
@click.pass_context
def generate(
    ctx: click.Context,
    prompt: str | None,
    raw: bool,
    system: str,
    fim_prefix: str | None,
    suffix: str,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    max_tokens: int | None,
    stop: tuple[str, ...],
    drafter: str | None,
    context_files: tuple[Path, ...],
    verifier_opt: str,
    drafter_model: str,
    stats: bool,
) -> None:
    """Generate an answer to PROMPT (or stdin with "-") with speculative decoding.

    The prompt goes through the model's chat template unless --raw; --fim asks for the code
    between --fim PREFIX and --suffix SUFFIX. The answer streams to stdout as it is generated.

    \b
    Example:
      jarvis generate "Write a Python function that reverses a string" --stats
    """
    from openjarvis.config import load_config
    from openjarvis.engine.llama import GgufInfo
    from openjarvis.engine.pair import close_speculator, open_speculator
    from openjarvis.engine.sampling import SamplingParams
    from openjarvis.engine.speculative import Request
    from openjarvis.engine.templates import (
        FIM_TOKENS,
        Message,
        check_fim,
        fim_prompt,
        render_chat,
    )
    from openjarvis.models import Catalog

    if fim_prefix is None and prompt is None:
        raise click.UsageError("give a PROMPT (or - for stdin), or --fim PREFIX --suffix SUFFIX")
    if fim_prefix is not None and (prompt is not None or raw):
        raise click.UsageError("--fim replaces PROMPT and --raw; give only --fim and --suffix")
    if prompt == "-":
        prompt = sys.stdin.read()

    config = load_config(overrides=flag_overrides(ctx))
    gc = config.generation
    mode = drafter or gc.drafter
    catalog = Catalog.load(config)
    pair = catalog.pair(config.models.pair)
    verifier_path = _resolve(verifier_opt or config.models.verifier, pair.verifier, catalog)
    drafter_path = None
    if mode in ("auto", "model"):
        drafter_path = _resolve(drafter_model or config.models.drafter, pair.drafter, catalog)
    spec = open_speculator(
        config,
        verifier_path=verifier_path,
        drafter_path=drafter_path,
        drafter=mode,  # type: ignore[arg-type]
    )
    try:
        v = spec.verifier
        # Both engines read the GGUF's template and special tokens (GgufInfo); a test's fake
        # engine may not, and gets no FIM check and no template.
        info = v if isinstance(v, GgufInfo) else None
        if fim_prefix is not None:
            if info is not None:
                check_fim({t: info.special_token(t) for t in FIM_TOKENS})
            text = fim_prompt(fim_prefix, suffix)
        elif raw:
            text = prompt or ""
        else:
            messages = [Message("system", system)] if system else []
            messages.append(Message("user", prompt or ""))
            text = render_chat(info.chat_template() if info is not None else None, messages)
        corpus = tuple(
            v.tokenize(f.read_text(encoding="utf-8", errors="replace"), special=False) for f in context_files
        )
        request = Request(
            prompt=v.tokenize(text, special=True),
            max_tokens=max_tokens if max_tokens is not None else gc.max_tokens,
            sampling=SamplingParams(
                temperature=gc.temperature if temperature is None else temperature,
                top_k=gc.top_k if top_k is None else top_k,
                top_p=gc.top_p if top_p is None else top_p,
            ),
            stop=stop,
            drafter=mode,  # type: ignore[arg-type]
            seed=seed,
            corpus=corpus,
            loop_repeats=gc.loop_repeats,
        )
        gen = spec.generate(request)
        try:
            for piece in gen:
                click.echo(piece.text, nl=False)  # flushes: each piece shows as it arrives
        finally:
            if gen.text and not gen.text.endswith("\n") and sys.stdout.isatty():
                click.echo("")
            if stats:
                click.echo(gen.stats.line(), err=True)
    finally:
        close_speculator(spec)
