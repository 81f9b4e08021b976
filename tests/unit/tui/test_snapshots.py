"""Snapshots of the main screens at 80x24 with fixed content (no daemon): layout only, few, reviewed.

Update after a deliberate change with ``pytest tests/unit/tui --snapshot-update`` and look at the
SVGs in ``__snapshots__`` before committing them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from openjarvis.config import Config
from openjarvis.tui.app import JarvisApp, make_app
from openjarvis.tui.hunks import parse_unified_diff
from openjarvis.tui.screens.diff_review import DiffReviewScreen
from openjarvis.tui.widgets.context import ContextPanel
from openjarvis.tui.widgets.conversation import Conversation

CODE = '''def parse_http_response(raw: str) -> dict:
    """Split a raw HTTP response into status and headers."""
    status, _, rest = raw.partition("\\n")
    return {"status": status, "headers": rest}
'''
ANSWER = (
    "`parse_http_response` splits the raw text at the first newline:\n\n"
    '```python\nstatus, _, rest = raw.partition("\\n")\n```\n\n'
    "The **status line** comes first, then the headers."
)
RESULT: dict[str, Any] = {
    "answer": ANSWER,
    "conversation": "c1",
    "sources": [{"path": "app/http.py", "symbol": "parse_http_response", "start_line": 1, "end_line": 4, "score": 1}],
    "route": "local",
    "model": "qwen2.5-coder-1.5b",
    "stats": {"tokens": 42, "tokens_per_s": 38.5, "acceptance": 0.61, "ttft_s": 0.42},
    "dropped": [],
}
DIFF = (
    "--- a/app/http.py\n+++ b/app/http.py\n@@ -1,2 +1,2 @@\n-def parse_http_response(raw: str) -> dict:\n"
    "+def parse_http_response(raw: str) -> dict[str, str]:\n"
    '     """Split a raw HTTP response into status and headers."""\n'
    "@@ -3,2 +3,2 @@\n"
    '     status, _, rest = raw.partition("\\n")\n-    return {"status": status, "headers": rest}\n'
    '+    return {"status": status.strip(), "headers": rest}\n'
)


@pytest.fixture
def app(tmp_path: Path) -> JarvisApp:
    ws = tmp_path / "repo"
    (ws / "app").mkdir(parents=True)
    (ws / "app" / "http.py").write_text(CODE)
    return make_app(Config(), ws, connect=False)


async def _answered(pilot: Pilot[Any], result: dict[str, Any]) -> None:
    app = pilot.app
    assert isinstance(app, JarvisApp)
    conv = app.query_one(Conversation)
    await conv.add_user("How are HTTP responses parsed?")
    await conv.add_answer(result["answer"])
    app.connected = True
    app.index_status = {"indexed": True, "files": 2, "last_run": None}
    app.last_result = result
    app.query_one(ContextPanel).show_sources(result["sources"])
    await pilot.pause()


def test_conversation_dark(app: JarvisApp, snap_compare: Any) -> None:
    assert snap_compare(app, terminal_size=(80, 24), run_before=lambda pilot: _answered(pilot, RESULT))


def test_conversation_light_after_a_cloud_answer(app: JarvisApp, snap_compare: Any) -> None:
    cloud = {**RESULT, "route": "cloud", "model": "gpt-4o-mini"}

    async def run_before(pilot: Pilot[Any]) -> None:
        pilot.app.theme = "textual-light"
        await _answered(pilot, cloud)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_diff_review(app: JarvisApp, snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.app.push_screen(DiffReviewScreen(parse_unified_diff(DIFF)))
        await pilot.press("down", "space")  # reject the second hunk

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_offline_at_start(app: JarvisApp, snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        pilot.app.notify("cannot reach the daemon. Jarvis reconnects on its own; or run `jarvis daemon start`",
                         title="Daemon unreachable", severity="error")  # fmt: skip
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
