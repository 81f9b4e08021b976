"""``jarvis serve --http``: the OpenAI-compatible endpoint for tools that speak that API."""

from __future__ import annotations

import asyncio

import click

from openjarvis.cli import CONTEXT_SETTINGS


@click.command(context_settings=CONTEXT_SETTINGS, short_help="Serve an OpenAI-compatible API on 127.0.0.1.")
@click.option("--http", "http", is_flag=True, required=True, help="Serve /v1/chat/completions and /v1/models.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback address to bind.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="Port (0 picks one).")
def serve(http: bool, host: str, port: int) -> None:
    """Expose the local model pair as an OpenAI-compatible API on this machine only.

    Point any OpenAI client at it: base URL http://127.0.0.1:8765/v1, any API key, model
    `openjarvis` (or the verifier's id from /v1/models). Requests go through the daemon, with
    speculative decoding; nothing leaves the machine.

    \b
    Example:
      jarvis serve --http --port 8765
    """
    from openjarvis.daemon.openai_http import serve_http

    try:
        asyncio.run(serve_http(host, port))
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
