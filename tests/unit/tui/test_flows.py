"""The TUI's main flows, driven by Pilot against a real daemon running the tiny test models."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from textual.message import Message
from textual.widgets import Label, Markdown, OptionList, Static
from tui_helpers import send, wait_for

from openjarvis.config import load_config
from openjarvis.tui.app import JarvisApp, make_app
from openjarvis.tui.messages import AnswerGrew, IndexProgress
from openjarvis.tui.screens.diff_review import DiffReviewScreen
from openjarvis.tui.screens.history import HistoryScreen
from openjarvis.tui.widgets.context import ContextPanel
from openjarvis.tui.widgets.status import StatusBar


def app_for(ws: Path) -> JarvisApp:
    return make_app(load_config(cwd=ws), ws, autostart=False)


def test_ask_streams_the_answer_with_sources_and_stats(tiny_daemon: Path) -> None:
    seen: list[Message] = []

    async def scenario() -> None:
        app = app_for(tiny_daemon)
        async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
            await wait_for(pilot, lambda: app.connected and app.index_status is not None)
            await send(pilot, "How is parse_http_response used?")
            await wait_for(pilot, lambda: app.last_result is not None and not app.busy)
            result = app.last_result
            assert result is not None
            answer = app.query(Markdown).filter(".answer").last()
            assert answer.source == result["answer"]
            assert any(isinstance(m, IndexProgress) for m in seen)  # the first start indexed, with progress
            grew = [m.text for m in seen if isinstance(m, AnswerGrew)]
            assert grew and all(result["answer"].startswith(g) for g in grew)  # painted as it grew
            status = str(app.query_one(StatusBar).render())
            assert "tiny-v" in status and "tok/s" in status and "local" in status
            panel = app.query_one(ContextPanel)
            assert "app/http.py" in {item.path for item in panel.items}

    asyncio.run(scenario())


def test_esc_cancels_the_answer_at_once_and_the_daemon_stops(tiny_setup: Path) -> None:
    """Esc ends the answer in the UI without waiting on the daemon, and sends it `cancel`.

    The tiny models answer in a tenth of a second, so the daemon is paused (SIGSTOP) while the
    question and the Esc go out: the UI must react with the daemon frozen, and once the daemon
    runs again it must find the request cancelled (a cancelled turn is not kept in the history).
    """
    from openjarvis import paths
    from openjarvis.daemon.client import Client
    from openjarvis.daemon.lifecycle import stop

    pid = 0

    async def scenario() -> None:
        nonlocal pid
        app = make_app(load_config(cwd=tiny_setup), tiny_setup)  # autostart: the TUI starts the daemon
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.connected and app.index_status is not None)
            await wait_for(pilot, lambda: app.index_progress is None and bool((app.index_status or {}).get("indexed")))
            client = await app.conn.get()
            pid = int(client.server_info["pid"])
            os.kill(pid, signal.SIGSTOP)
            try:
                await send(pilot, "Router")
                await pilot.pause(0.2)
                assert app.busy
                await pilot.press("escape")
                assert not app.busy  # at once, with the daemon frozen
                answer = app.query(Markdown).filter(".answer").last()
                await pilot.pause(0.1)
                assert answer.source.endswith("*(cancelled)*")
            finally:
                os.kill(pid, signal.SIGCONT)
            frozen = answer.source

            await wait_for(pilot, lambda: not any(w.group == "chat" and w.is_running for w in app.workers))
            assert answer.source == frozen  # nothing more was painted
            await send(pilot, "/search Router")  # and the app goes on
            await wait_for(pilot, lambda: app.query_one(ContextPanel).items != [])

    try:
        asyncio.run(scenario())
        with Client(autostart=False) as c:
            assert c.call("stats")["in_flight"] == 1  # only this call: the generation was stopped
            assert c.call("conversations/list", {"workspace": str(tiny_setup)})["conversations"] == []
    finally:
        stop(paths.socket_path())


def test_search_shows_hits_and_previews_the_code(tiny_daemon: Path) -> None:
    async def scenario() -> None:
        app = app_for(tiny_daemon)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.connected)
            await send(pilot, "/search http response")
            panel = app.query_one(ContextPanel)
            await wait_for(pilot, lambda: panel.items != [])
            assert panel.items[0].path == "app/http.py"
            assert "Search: http response" in str(panel.query_one("#context-title", Label).render())
            def preview() -> str:
                return str(panel.query_one("#context-preview", Static).render())

            await wait_for(pilot, lambda: "def parse_http_response(raw: str) -> dict:" in preview())
            assert len(panel.items) > 1
            panel.query_one("#context-list", OptionList).focus()
            await pilot.press("down")  # the next hit: its own lines in the preview
            second = panel.items[1]
            await wait_for(pilot, lambda: f"{second.start_line} ▌" in preview())
            await send(pilot, "/model")  # models/list, as a note in the conversation
            await wait_for(pilot, lambda: "tiny-v" in getattr(app.query(".note").last(), "source", ""))
            assert "Pair in use: **tiny**" in app.query(".note").last().source

    asyncio.run(scenario())


TWO_EDITS = (
    'app/http.py\n<<<<<<< SEARCH\n"""A tiny app."""\n=======\n"""A tiny HTTP app."""\n>>>>>>> REPLACE\n\n'
    'app/http.py\n<<<<<<< SEARCH\n        return parse_http_response(path)["status"]\n=======\n'
    '        return parse_http_response(path)["status"].strip()\n>>>>>>> REPLACE\n'
)


def test_review_accept_one_hunk_apply_then_undo(tiny_daemon: Path) -> None:
    target = tiny_daemon / "app" / "http.py"
    original = target.read_text()

    async def scenario() -> None:
        app = app_for(tiny_daemon)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.connected)
            app.last_answer = TWO_EDITS  # the tiny random models do not write edits
            await send(pilot, "/apply")
            await wait_for(pilot, lambda: isinstance(app.screen, DiffReviewScreen))
            review = app.screen
            assert isinstance(review, DiffReviewScreen) and len(review.keys) == 2
            await pilot.press("space")  # reject the first hunk (the docstring)
            await wait_for(pilot, lambda: review.accepted == {(0, 1)})
            await pilot.press("y")
            await wait_for(pilot, lambda: target.read_text() != original)
            assert target.read_text() == original.replace(
                'parse_http_response(path)["status"]', 'parse_http_response(path)["status"].strip()'
            )
            await send(pilot, "/undo")
            await wait_for(pilot, lambda: target.read_text() == original)

    asyncio.run(scenario())


def test_resume_a_conversation_from_history(tiny_daemon: Path) -> None:
    async def scenario() -> None:
        app = app_for(tiny_daemon)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.connected)
            await send(pilot, "What does Router do?")
            await wait_for(pilot, lambda: app.last_result is not None and not app.busy)
            first_id = app.conversation_id
            await pilot.press("ctrl+n")
            await pilot.pause(0.1)
            assert app.conversation_id is None and not app.query(".user")
            await send(pilot, "/history")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.conversation_id == first_id)
            users = [str(w.render()) for w in app.query(".user")]
            assert users == ["What does Router do?"]

    asyncio.run(scenario())


def test_errors_are_notifications_and_the_app_recovers(tiny_daemon: Path) -> None:
    from openjarvis import paths
    from openjarvis.daemon.lifecycle import ensure_running, stop

    async def scenario() -> None:
        app = app_for(tiny_daemon)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.connected)
            await asyncio.to_thread(stop, paths.socket_path())
            await send(pilot, "anyone there?")
            await wait_for(pilot, lambda: not app.connected and not app.busy)
            notes = [n.message for n in app._notifications]
            assert any("jarvis daemon start" in n for n in notes)
            await asyncio.to_thread(ensure_running, paths.socket_path())
            await wait_for(pilot, lambda: app.connected, timeout=30)  # reconnects by itself
            await send(pilot, "/search Router")
            await wait_for(pilot, lambda: app.query_one(ContextPanel).items != [])

    asyncio.run(scenario())


def test_missing_model_is_a_notification_that_says_what_to_do(tiny_setup: Path) -> None:
    from openjarvis import paths
    from openjarvis.daemon.lifecycle import stop

    paths.user_config_file().write_text('[models]\npair = "qwen2.5-coder"\n')

    async def scenario() -> None:
        app = make_app(load_config(cwd=tiny_setup), tiny_setup, index_on_start=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.connected)
            await send(pilot, "hi")
            # (not "until not busy": that can hold before the request has even begun)
            await wait_for(pilot, lambda: any("jarvis models install" in n.message for n in app._notifications))
            await wait_for(pilot, lambda: not app.busy)
            assert app.query(".note.error")

    try:
        asyncio.run(scenario())
    finally:
        stop(paths.socket_path())


def test_cloud_refused_by_policy_says_what_to_do(tiny_daemon: Path) -> None:
    async def scenario() -> None:
        app = app_for(tiny_daemon)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.connected)
            await send(pilot, "/cloud")
            await wait_for(pilot, lambda: app.route_mode == "cloud")
            await send(pilot, "What does Router do?")
            await wait_for(pilot, lambda: not app.busy and len(app._notifications) >= 3)
            notes = [n.message for n in app._notifications]
            assert any("router.cloud" in n for n in notes), notes  # the warning on /cloud
            assert any("/local" in n for n in notes), notes  # the refusal, with what to do
            assert "no targets configured" in app.query(".note.error").last().source
            assert app.last_result is None  # nothing was answered, nothing left the machine

    asyncio.run(scenario())
