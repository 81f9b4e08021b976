"""Keyboard behaviour that needs no daemon: input history, multi-line input, completion, palette, help."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual import events
from textual.widgets import OptionList

from openjarvis.config import Config
from openjarvis.tui.app import ACTIONS, JarvisApp, make_app
from openjarvis.tui.widgets.prompt import PromptInput


def offline_app(tmp_path: Path) -> JarvisApp:
    return make_app(Config(), tmp_path, connect=False, autostart=False)


def test_history_multiline_and_completion(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = offline_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            prompt = app.query_one(PromptInput)
            for text in ("/local", "/auto"):
                prompt.load_text(text)
                await pilot.press("enter")
            assert app.route_mode == "auto" and prompt.text == ""
            await pilot.press("d", "r", "a", "f", "t", "up")
            assert prompt.text == "/auto"
            await pilot.press("up")
            assert prompt.text == "/local"
            await pilot.press("down", "down")
            assert prompt.text == "draft"  # back to what was being typed
            prompt.clear()
            await pilot.press("a", "ctrl+j", "b")
            assert prompt.text == "a\nb"  # Ctrl+J breaks the line, Enter would send
            prompt.clear()
            app.post_message(events.Paste("def f():\n    return 1\n"))  # a terminal's bracketed paste
            await pilot.pause()
            assert prompt.text == "def f():\n    return 1\n"  # newlines kept, nothing sent
            prompt.clear()
            await pilot.press("/", "s", "e")
            box = app.query_one("#completions", OptionList)
            assert box.display and box.option_count == 1
            await pilot.press("tab")
            assert prompt.text == "/search " and not box.display
            await pilot.press("escape")  # nothing streams: Esc is harmless

    asyncio.run(scenario())


def test_palette_lists_every_action_and_help_lists_every_command(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = offline_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            titles = {c.title for c in app.get_system_commands(app.screen)}
            assert {title for _, title, _ in ACTIONS} <= titles
            await pilot.press("f1")
            await pilot.pause()
            note = app.query(".note").last()
            source = getattr(note, "source", "")
            assert "/search QUERY" in source and "/history" in source and "`escape`" in source
            notes = len(app.query(".note"))
            app.query_one(PromptInput).load_text("/hel")
            await pilot.press("enter")  # a unique prefix runs its command
            await pilot.pause()
            assert len(app.query(".note")) == notes + 1
            app.query_one(PromptInput).load_text("/clear")
            await pilot.press("enter")
            await pilot.pause()
            assert not app.query(".note")  # the screen is cleared

    asyncio.run(scenario())


def test_a_daemon_message_after_the_status_bar_is_gone_is_taken_without_a_crash(
        tmp_path: Path) -> None:
    """While the app shuts down its widgets go first, and an index state or progress message
    from the daemon can still be processed (CI saw one crash the app at exit): the app's state
    takes it, and there is no status bar left to show it in."""
    from openjarvis.tui.messages import IndexProgress, IndexState
    from openjarvis.tui.widgets.status import StatusBar

    async def scenario() -> None:
        app = offline_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            bar = app.query_one(StatusBar)
            app.post_message(IndexState({"files": 3}))
            await pilot.pause()
            assert bar.index_status == {"files": 3}  # shown while the bar is there
            await bar.remove()
            app.post_message(IndexProgress(1, 2))
            app.post_message(IndexState({"files": 4}))
            await pilot.pause()
            assert app.index_status == {"files": 4} and app.is_running

    asyncio.run(scenario())


def test_the_status_bar_shows_the_prompt_being_read_until_the_answer_ends(tmp_path: Path) -> None:
    """``chat/progress`` reaches the status bar as a bar beside "answering…"; a stale request's
    progress is ignored, and the bar goes when the app is no longer busy."""
    from openjarvis.tui.messages import PromptProgress
    from openjarvis.tui.widgets.status import StatusBar

    async def scenario() -> None:
        app = offline_app(tmp_path)
        async with app.run_test(size=(160, 24)) as pilot:
            bar = app.query_one(StatusBar)
            app.busy = True
            app.post_message(PromptProgress(app._seq - 1, 5, 300))  # an earlier request's
            await pilot.pause()
            assert "reading the prompt" not in str(bar.render())
            app.post_message(PromptProgress(app._seq, 128, 300))
            await pilot.pause()
            assert "reading the prompt" in str(bar.render()) and "128/300" in str(bar.render())
            app.busy = False
            await pilot.pause()
            assert app.prompt_progress is None and "reading the prompt" not in str(bar.render())

    asyncio.run(scenario())
