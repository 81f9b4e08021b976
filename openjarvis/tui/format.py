"""Text the TUI shows, built from protocol results: status bar pieces, source and hit labels.

Pure functions of plain data, shared with the tests; the widgets only place the strings.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.markup import escape


def answer_stats(result: dict[str, Any]) -> str:
    """Route, model, speed, acceptance, first token and energy of one answer, like ``jarvis ask``'s footer."""
    s = result.get("stats") or {}
    parts = [f"{result.get('model') or '?'}"]
    if s.get("tokens_per_s") is not None:
        parts.append(f"{float(s['tokens_per_s']):.1f} tok/s")
    if s.get("acceptance") is not None:
        parts.append(f"acc {float(s['acceptance']):.0%}")
    if s.get("ttft_s") is not None:
        parts.append(f"ttft {float(s['ttft_s']):.2f}s")
    energy = s.get("energy_j")
    if energy is not None:
        parts.append(f"{float(energy):.1f} J")
    if s.get("finish_reason") == "repetition":  # cut where it began repeating itself
        parts.append("stopped: repeating itself")
    reason = result.get("route_reason", "local")
    if result.get("route", "local") == "local" and reason != "local":
        parts.append(str(reason))  # held back by router.cloud = ask: what would have gone, and how
    return " · ".join(escape(p) for p in parts)


def left_machine(result: dict[str, Any] | None) -> bool:
    """True when the answer was produced off this machine (any route but local)."""
    return result is not None and str(result.get("route", "local")) != "local"


def index_state(status: dict[str, Any] | None, now: float | None = None) -> str:
    """``index: 12 files · 3m ago``, ``indexing…`` or ``not indexed``."""
    if status is None:
        return "index: ?"
    if status.get("indexing"):
        return "indexing…"
    if not status.get("indexed"):
        return "not indexed"
    age = ""
    if status.get("last_run"):
        secs = max(0.0, (now or time.time()) - float(status["last_run"]))
        age = " · " + (f"{secs:.0f}s ago" if secs < 90 else f"{secs / 60:.0f}m ago" if secs < 5400 else
                       f"{secs / 3600:.0f}h ago")  # fmt: skip
    return f"index: {status.get('files', 0)} files{age}"


def source_label(src: dict[str, Any]) -> str:
    symbol = f" {src['symbol']}" if src.get("symbol") else ""
    return f"{src['path']}:{src['start_line']}-{src['end_line']}{symbol}"


def short_workspace(path: str, width: int = 24) -> str:
    name = Path(path).name or path
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def conversation_label(conv: dict[str, Any], now: float | None = None) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(conv.get("updated", now or time.time()))))
    return f"{when}  {conv.get('title') or '(untitled)'}  ({conv.get('messages', 0)} messages)"
