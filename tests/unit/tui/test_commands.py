"""Slash command parsing and completion, and the status texts built from protocol results."""

from __future__ import annotations

from openjarvis.tui import commands, format


def test_parse_tells_commands_from_questions() -> None:
    assert commands.parse("/search http response") == commands.Parsed("search", "http response")
    assert commands.parse("  /HELP ") == commands.Parsed("help", "")
    assert commands.parse("what does /usr/lib hold?") is None
    assert commands.parse("/usr/lib/x is missing") is None  # a path is a question
    assert commands.parse("//search is a word") is None  # escaped


def test_completion_offers_matching_commands_and_completes_a_unique_one() -> None:
    assert [c.name for c in commands.completions("/h")] == ["history", "help"]
    assert commands.complete("/se") == "/search "
    assert commands.complete("/c") == "/cl"  # cloud, clear: their common part
    assert commands.complete("/h") == "/history "  # history, help: nothing more in common, the first
    assert commands.complete("/search x") is None and commands.completions("hello") == []


def test_every_command_is_in_help() -> None:
    text = commands.help_markdown([("esc", "cancel")])
    assert all(f"/{c.name}" in text for c in commands.SLASH_COMMANDS) and "| `esc` | cancel |" in text


def test_status_texts() -> None:
    result = {
        "route": "local",
        "model": "tiny-v",
        "stats": {"tokens_per_s": 12.34, "acceptance": 0.5, "ttft_s": 0.25, "energy_j": 3.2},
    }
    assert format.answer_stats(result) == "tiny-v · 12.3 tok/s · acc 50% · ttft 0.25s · 3.2 J"
    looped = {**result, "stats": {**result["stats"], "finish_reason": "repetition"}}
    assert format.answer_stats(looped) == format.answer_stats(result) + " · stopped: repeating itself"
    held = {**looped, "route_reason": "local answer began repeating itself; sending to big (m2): not sent"}
    assert format.answer_stats(held) == format.answer_stats(looped) + " · " + held["route_reason"]
    assert not format.left_machine(result) and format.left_machine({**result, "route": "cloud"})
    assert format.index_state({"indexed": True, "files": 3, "last_run": 100.0}, now=130.0) == "index: 3 files · 30s ago"
    assert format.index_state({"indexing": True}) == "indexing…"
    assert format.index_state({"indexed": False}) == "not indexed"
    assert format.source_label({"path": "a.py", "start_line": 1, "end_line": 4, "symbol": "f"}) == "a.py:1-4 f"
