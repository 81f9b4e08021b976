"""The Jarvis TUI: a Textual app that is one more client of the daemon.

Shape (STYLE.md): ``compose`` only builds the tree; state lives in reactives whose ``watch_*``
methods push it into widgets; everything that waits on the daemon runs in ``@work`` workers,
which post the dataclass messages of ``messages.py``; results of a request that was cancelled or
superseded are dropped by its sequence number. Errors become notifications that say what to do;
a worker that fails unexpectedly is reported the same way, never as a traceback.

Example::

    from openjarvis.config import load_config
    from openjarvis.tui.app import make_app

    make_app(load_config()).run()
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Markdown, OptionList
from textual.widgets.markdown import MarkdownStream
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from openjarvis import paths
from openjarvis.config import Config
from openjarvis.daemon.protocol import ErrorCode
from openjarvis.errors import DaemonError
from openjarvis.tui import commands
from openjarvis.tui.connection import Connection, describe
from openjarvis.tui.hunks import HunkError, parse_unified_diff, subset_edit_text
from openjarvis.tui.messages import (
    AnswerDone,
    AnswerFailed,
    AnswerGrew,
    Connected,
    Disconnected,
    IndexProgress,
    IndexState,
    PromptProgress,
    PromptSubmitted,
    SearchDone,
)
from openjarvis.tui.screens.diff_review import DiffReviewScreen
from openjarvis.tui.screens.history import HistoryScreen
from openjarvis.tui.throttle import Throttle
from openjarvis.tui.widgets.context import ContextPanel
from openjarvis.tui.widgets.conversation import Conversation
from openjarvis.tui.widgets.prompt import PromptInput
from openjarvis.tui.widgets.status import StatusBar

EDIT_BLOCK = re.compile(r"^<{5,9} SEARCH\s*$", re.MULTILINE)
RECONNECT_S = 3.0
#: How long a cancelled chat may take to be answered before the app stops waiting for it.
CANCEL_GRACE_S = 2.0
#: Reconnect ticks between two index/status refreshes (the "updated … ago" in the status bar).
INDEX_REFRESH_TICKS = 10
#: Shortest time between two paints of a streaming answer (30 a second is smooth to the eye).
PAINT_INTERVAL_S = 1 / 30
#: What the palette and /help list, besides the slash commands: (action, title, help).
ACTIONS: tuple[tuple[str, str, str], ...] = (
    ("cancel", "Cancel the answer", "Stop the answer being generated (Esc)"),
    ("new", "New conversation", "Start a new conversation (Ctrl+N)"),
    ("history", "Resume a conversation", "Pick an earlier conversation of this workspace (Ctrl+R)"),
    ("clear", "Clear the screen", "Clear the conversation view; the conversation goes on (Ctrl+L)"),
    ("toggle_context", "Toggle the context panel", "Show or hide sources and search results (Ctrl+O)"),
    ("apply", "Review and apply edits", "Review the last answer's SEARCH/REPLACE edits hunk by hunk"),
    ("undo", "Undo the last edit", "Restore the files of the last applied edit"),
    ("route('local')", "Answer locally", "Answer on this machine only"),
    ("route('cloud')", "Answer with the cloud", "Use the configured cloud target, policy allowing"),
    ("route('auto')", "Automatic routing", "Let the routing policy decide, local first"),
    ("models", "List models", "Show the installed models"),
    ("index", "Reindex the workspace", "Index changed files now"),
    ("help", "Help", "List slash commands and keys (F1)"),
)


class JarvisApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "Jarvis"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+n", "new", "New"),
        Binding("ctrl+r", "history", "History"),
        Binding("ctrl+o", "toggle_context", "Context"),
        Binding("ctrl+l", "clear", "Clear", show=False),
        Binding("f1", "help", "Help"),
    ]

    route_mode: reactive[str] = reactive("auto")
    busy: reactive[bool] = reactive(False)
    connected: reactive[bool] = reactive(False)
    connecting: reactive[bool] = reactive(False)
    last_result: reactive[dict[str, Any] | None] = reactive(None)
    index_status: reactive[dict[str, Any] | None] = reactive(None)
    index_progress: reactive[tuple[int, int] | None] = reactive(None)
    prompt_progress: reactive[tuple[int, int] | None] = reactive(None)

    def __init__(
        self,
        config: Config,
        workspace: Path,
        *,
        socket_path: Path | None = None,
        autostart: bool = True,
        index_on_start: bool = True,
        connect: bool = True,
    ) -> None:
        super().__init__()
        self.connect_on_start = connect
        self.config = config
        self.workspace = workspace.resolve()
        self.conn = Connection(socket_path, autostart=autostart)
        self.index_on_start = index_on_start
        self.conversation_id: str | None = None
        self.last_answer = ""
        self._seq = 0  # the current chat request; older ones are stale
        self._search_seq = 0
        self._stream: MarkdownStream | None = None
        self._shown = 0
        self._chat_rid: tuple[int, Any, Any] | None = None  # (seq, client, the request id reserved for it)
        self._cancel_pending: int | None = None
        self._told_offline = False
        self._ticks = 0
        self._chat_worker: Worker[None] | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield Conversation(id="conversation")
            yield ContextPanel(id="context")
        yield OptionList(id="completions")
        yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    # -- lifecycle ----------------------------------------------------------------------------

    async def on_mount(self) -> None:
        await self.query_one(Conversation).add_note(
            f"Ask about **{self.workspace.name}**. Enter sends, Ctrl+J breaks the line, Esc cancels; "
            "`/help` lists commands, Ctrl+P every action."
        )
        self.query_one(ContextPanel).workspace = self.workspace
        self.query_one(StatusBar).workspace = str(self.workspace)
        self.query_one(PromptInput).focus()
        if self.connect_on_start:
            self.connecting = True
            self.connect()
            self.set_interval(RECONNECT_S, self._reconnect)

    async def on_unmount(self) -> None:
        await self.conn.close()

    def _reconnect(self) -> None:
        """Every few seconds: notice a lost daemon, dial again, keep the index state current."""
        self._ticks += 1
        if self.connected and not self.conn.alive:
            self.post_message(Disconnected(describe(DaemonError("the daemon closed the connection"))))
        elif not self.connected:
            self.connect()
        elif (self.index_status or {}).get("indexing") or self._ticks % INDEX_REFRESH_TICKS == 0:
            self.refresh_index_status()

    @work(exclusive=True, group="connect", exit_on_error=False)
    async def connect(self) -> None:
        try:
            client = await self.conn.get()
            self.post_message(Connected(client.server_info))
            status = await self.conn.call("index/status", {"workspace": str(self.workspace)})
        except DaemonError as exc:
            self.post_message(Disconnected(describe(exc)))
            return
        self.post_message(IndexState(status))
        if self.index_on_start and not status.get("indexed") and not status.get("indexing"):
            self.index_workspace()

    @work(exclusive=True, group="index", exit_on_error=False)
    async def index_workspace(self) -> None:
        """``index/add`` on a connection of its own, so its progress never mixes with a chat's."""
        conn = Connection(self.conn.socket_path, autostart=False, name="jarvis-tui-index")
        try:
            client = await conn.get()
            async for method, params in client.stream("index/add", {"workspace": str(self.workspace)}):
                if method == "index/progress":
                    self.post_message(IndexProgress(int(params["done"]), int(params["total"])))
            status = await client.call("index/status", {"workspace": str(self.workspace)})
            self.post_message(IndexState(status))
        except DaemonError as exc:
            self.index_progress = None
            self.notify(describe(exc), title="Indexing failed", severity="error", timeout=10)
        finally:
            await conn.close()

    @work(exclusive=True, group="index-status", exit_on_error=False)
    async def refresh_index_status(self) -> None:
        try:
            self.post_message(IndexState(await self.conn.call("index/status", {"workspace": str(self.workspace)})))
        except DaemonError:
            pass  # the status bar keeps the last state; a lost daemon is reported by the request that hit it

    def on_connected(self, message: Connected) -> None:
        self.connecting = False
        self.connected = True
        self._told_offline = False

    def on_disconnected(self, message: Disconnected) -> None:
        self.connecting = False
        if not self._told_offline:
            self.notify(message.error, title="Daemon unreachable", severity="error", timeout=10)
            self._told_offline = True
        self.connected = False

    def on_index_progress(self, message: IndexProgress) -> None:
        self.index_progress = (message.done, message.total)

    def on_prompt_progress(self, message: PromptProgress) -> None:
        if message.seq == self._seq and self.busy:
            self.prompt_progress = (message.done, message.total)

    def on_index_state(self, message: IndexState) -> None:
        self.index_progress = None
        self.index_status = message.status

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The top-level catch-all: a worker that failed is reported, the app goes on."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            err = event.worker.error
            self.log.error(f"worker {event.worker.name} failed: {err!r}")
            self.notify(f"{type(err).__name__}: {err}", title="Something went wrong", severity="error", timeout=10)
            if event.worker.group == "chat":
                self.post_message(AnswerFailed(self._seq, None, f"{type(err).__name__}: {err}"))

    # -- reactives to widgets -----------------------------------------------------------------

    def _set_status(self, field: str, value: object) -> None:
        """Show a reactive's new value in the status bar. A daemon message can still arrive
        while the app shuts down, after its widgets are gone (seen in CI: an index state
        processed during exit); there is nothing left to show it in then."""
        bars = self.query(StatusBar)
        if bars:
            setattr(bars.first(), field, value)

    def watch_route_mode(self, value: str) -> None:
        self._set_status("route_mode", value)

    def watch_connected(self, value: bool) -> None:
        self._set_status("connected", value)

    def watch_connecting(self, value: bool) -> None:
        self._set_status("connecting", value)

    def watch_last_result(self, value: dict[str, Any] | None) -> None:
        self._set_status("last_result", value)

    def watch_index_status(self, value: dict[str, Any] | None) -> None:
        self._set_status("index_status", value)

    def watch_index_progress(self, value: tuple[int, int] | None) -> None:
        self._set_status("index_progress", value)

    def watch_prompt_progress(self, value: tuple[int, int] | None) -> None:
        self._set_status("prompt_progress", value)

    def watch_busy(self, value: bool) -> None:
        self._set_status("busy", value)
        if not value:
            self.prompt_progress = None

    # -- input --------------------------------------------------------------------------------

    @on(PromptInput.Changed, "#prompt")
    def _update_completions(self, event: PromptInput.Changed) -> None:
        matches = commands.completions(event.text_area.text)
        box = self.query_one("#completions", OptionList)
        box.set_options(Option(f"/{c.name} {c.args}".rstrip() + f"  {c.help}") for c in matches)
        box.display = bool(matches)

    @on(OptionList.OptionSelected, "#completions")
    def _complete_from_list(self, event: OptionList.OptionSelected) -> None:
        prompt = self.query_one(PromptInput)
        name = commands.completions(prompt.text)[event.option_index].name
        prompt.load_text(f"/{name} ")
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    async def on_prompt_submitted(self, message: PromptSubmitted) -> None:
        parsed = commands.parse(message.text)
        if parsed is None:
            await self.ask(message.text[1:] if message.text.startswith("//") else message.text)
            return
        name = parsed.name
        if name not in commands.NAMES and (matches := commands.completions(message.text.strip())):
            name = matches[0].name  # "/hel" + Enter runs /help, as the completion list showed
        await self.run_slash(name, parsed.arg)

    async def run_slash(self, name: str, arg: str) -> None:
        if name == "search":
            if not arg:
                self.notify("type what to search for: /search QUERY", severity="warning")
            else:
                self.search(arg)
        elif name in ("cloud", "local", "auto"):
            self.action_route(name)
        elif name == "model":
            self.action_models()
        elif name in ("clear", "new", "history", "apply", "undo", "help"):
            await self.run_action(name)
        else:
            self.notify(f"unknown command /{name}; /help lists them", severity="warning")

    # -- chat ---------------------------------------------------------------------------------

    async def ask(self, question: str) -> None:
        if self.busy:
            self.notify("an answer is still coming; Esc cancels it", severity="warning")
            return
        self._seq += 1
        conv = self.query_one(Conversation)
        await conv.add_user(question)
        block = await conv.add_answer()
        self._stream = Markdown.get_stream(block)
        self._shown = 0
        self.busy = True
        params: dict[str, Any] = {"workspace": str(self.workspace), "message": question}
        if self.conversation_id:
            params["conversation"] = self.conversation_id
        if self.route_mode != "auto":
            params["route"] = self.route_mode
        self._chat_worker = self.chat(self._seq, params)

    @work(group="chat", exit_on_error=False)
    async def chat(self, seq: int, params: dict[str, Any]) -> None:
        painter = Throttle(lambda text: self.post_message(AnswerGrew(seq, text)), PAINT_INTERVAL_S)
        try:
            client = await self.conn.get()
            self.post_message(Connected(client.server_info))
            rid = client.reserve_id()
            self._chat_rid = (seq, client, rid)
            async for method, p in client.stream("chat", params, request_id=rid):
                if self._cancel_pending == seq:
                    self._cancel_pending = None
                    self.send_cancel(client, rid, self._chat_worker)
                if method == "chat/token":
                    painter.add(str(p.get("text", "")))
                elif method == "index/progress":
                    self.post_message(IndexProgress(int(p["done"]), int(p["total"])))
                elif method == "chat/progress":
                    self.post_message(PromptProgress(seq, int(p["done"]), int(p["total"])))
                elif method == "result":
                    painter.close()
                    self.post_message(AnswerDone(seq, p))
        except DaemonError as exc:
            if exc.code is None:
                await self.conn.drop()
                self.post_message(Disconnected(describe(exc)))
            self.post_message(AnswerFailed(seq, exc.code, describe(exc)))
        except (OSError, ConnectionError) as exc:
            await self.conn.drop()
            self.post_message(AnswerFailed(seq, None, describe(DaemonError(str(exc)))))
        finally:
            painter.close()
            if self._chat_rid is not None and self._chat_rid[0] == seq:
                self._chat_rid = None

    async def on_answer_grew(self, message: AnswerGrew) -> None:
        if message.seq != self._seq or self._stream is None:
            return
        self.index_progress = None
        self.prompt_progress = None
        delta, self._shown = message.text[self._shown :], len(message.text)
        await self._stream.write(delta)

    async def _end_stream(self, tail: str = "") -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            if tail:
                await stream.write(tail)
            await stream.stop()

    async def on_answer_done(self, message: AnswerDone) -> None:
        if message.seq != self._seq:
            return
        result = message.result
        answer = str(result.get("answer", ""))
        await self._end_stream(answer[self._shown :])
        self.busy = False
        self.last_answer = answer
        self.last_result = result
        if result.get("conversation"):
            self.conversation_id = str(result["conversation"])
        self.query_one(ContextPanel).show_sources(list(result.get("sources") or []))
        if EDIT_BLOCK.search(answer):
            self.notify("This answer proposes edits: /apply reviews them", title="Edits")
        self.refresh_index_status()

    async def on_answer_failed(self, message: AnswerFailed) -> None:
        if message.seq != self._seq:
            return
        await self._end_stream()
        self.busy = False
        self.index_progress = None
        if message.code == ErrorCode.CANCELLED:
            return
        await self.query_one(Conversation).add_note(f"**Not answered:** {message.error}", error=True)
        self.notify(message.error, title="Request failed", severity="error", timeout=10)

    async def action_cancel(self) -> None:
        """Esc: stop the answer at once; the text so far stays, marked as cancelled."""
        box = self.query_one("#completions", OptionList)
        if box.display:
            box.display = False
            return
        if not self.busy:
            return
        seq = self._seq
        self._seq += 1  # whatever still arrives for it is stale
        self.busy = False
        self.index_progress = None
        await self._end_stream("\n\n*(cancelled)*")
        if self._chat_rid is not None and self._chat_rid[0] == seq:
            _, client, rid = self._chat_rid
            self.send_cancel(client, rid, self._chat_worker)
            # If the request had not reached the daemon yet, that cancel found nothing: the
            # worker sends it again as soon as the stream shows the request is in flight.
            self._cancel_pending = seq
        elif self._chat_worker is not None:
            self._chat_worker.cancel()  # still connecting: nothing reached the daemon
        self.notify("Answer cancelled", timeout=2)

    @work(group="cancel", exit_on_error=False)
    async def send_cancel(self, client: Any, rid: int, chat: Worker[None] | None) -> None:
        try:
            await client.cancel(rid)
        except DaemonError:
            pass  # the request ended or the daemon is gone: either way nothing runs any more
        # A request cancelled before its task started is never answered by the daemon (its task is
        # cancelled before it can send the CANCELLED error), so stop waiting for it after a grace period.
        await asyncio.sleep(CANCEL_GRACE_S)
        if chat is not None and chat.is_running:
            chat.cancel()

    # -- search -------------------------------------------------------------------------------

    @work(exclusive=True, group="search", exit_on_error=False)
    async def search(self, query: str) -> None:
        self._search_seq += 1
        seq = self._search_seq
        try:
            result = await self.conn.call("search", {"workspace": str(self.workspace), "query": query, "k": 20})
        except DaemonError as exc:
            self.notify(describe(exc), title="Search failed", severity="error", timeout=10)
            return
        self.post_message(SearchDone(seq, query, list(result.get("hits") or [])))

    def on_search_done(self, message: SearchDone) -> None:
        if message.seq != self._search_seq:
            return
        panel = self.query_one(ContextPanel)
        panel.display = True
        panel.show_hits(message.query, message.hits)
        if not message.hits:
            self.notify(f"no results for {message.query!r}", timeout=3)

    # -- actions ------------------------------------------------------------------------------

    def action_route(self, mode: str) -> None:
        self.route_mode = mode
        what = {"local": "on this machine only", "cloud": "with the cloud target", "auto": "as the policy decides"}
        self.notify(f"Next answers: {what.get(mode, mode)}", timeout=3)
        if mode == "cloud" and (self.config.router.cloud == "never" or self.config.router.offline):
            self.notify(
                "your policy keeps requests on this machine (router.cloud = never, or offline), so the daemon will "
                "refuse; allow it with `jarvis config set router.cloud auto`",
                title="Cloud not allowed",
                severity="warning",
                timeout=10,
            )

    async def action_new(self) -> None:
        await self.action_clear()
        self.conversation_id = None
        self.last_answer = ""
        self.query_one(ContextPanel).show("Sources", [])
        self.notify("New conversation", timeout=2)

    async def action_clear(self) -> None:
        if self.busy:
            await self.action_cancel()
        await self.query_one(Conversation).clear()

    def action_toggle_context(self) -> None:
        panel = self.query_one(ContextPanel)
        panel.display = not panel.display

    async def action_help(self) -> None:
        keys = [(b.key, b.description) for b in self.BINDINGS if isinstance(b, Binding)]
        keys += [("enter", "send"), ("ctrl+j", "new line"), ("up/down", "history"), ("tab", "complete a /command")]
        keys += [("ctrl+p", "command palette"), ("ctrl+q", "quit")]
        await self.query_one(Conversation).add_note(commands.help_markdown(keys))

    @work(exclusive=True, group="models", exit_on_error=False)
    async def action_models(self) -> None:
        try:
            models = (await self.conn.call("models/list"))["models"]
        except DaemonError as exc:
            self.notify(describe(exc), title="Models", severity="error", timeout=10)
            return
        rows = "\n".join(
            f"| {m['id']} | {m['role'] or '-'} | {m['quantization']} | {'yes' if m['installed'] else 'no'} |"
            for m in models
        )
        pair = self.config.models.pair
        await self.query_one(Conversation).add_note(
            f"Pair in use: **{pair}** (change it with `jarvis config set models.pair ID`)\n\n"
            f"| model | role | quant | installed |\n|---|---|---|---|\n{rows}\n"
        )

    def action_index(self) -> None:
        self.index_workspace()

    @work(exclusive=True, group="history", exit_on_error=False)
    async def action_history(self) -> None:
        try:
            convs = (await self.conn.call("conversations/list", {"workspace": str(self.workspace)}))["conversations"]
        except DaemonError as exc:
            self.notify(describe(exc), title="History", severity="error", timeout=10)
            return
        if not convs:
            self.notify("No earlier conversation in this workspace", timeout=3)
            return
        chosen = await self.push_screen_wait(HistoryScreen(convs))
        if chosen:
            await self.resume(chosen)

    async def resume(self, conversation_id: str) -> None:
        try:
            got = await self.conn.call("conversations/get", {"id": conversation_id})
        except DaemonError as exc:
            self.notify(describe(exc), title="History", severity="error", timeout=10)
            return
        if self.busy:
            await self.action_cancel()
        conv = self.query_one(Conversation)
        await conv.clear()
        for m in got["messages"]:
            if m["role"] == "user":
                await conv.add_user(m["content"])
            else:
                await conv.add_answer(m["content"])
                self.last_answer = m["content"]
        self.conversation_id = got["id"]
        self.notify(f"Resumed: {got['title']}", timeout=3)

    @work(exclusive=True, group="edit", exit_on_error=False)
    async def action_apply(self, text: str | None = None) -> None:
        """Preview the last answer's edits, review them hunk by hunk, apply the accepted ones."""
        text = self.last_answer if text is None else text
        if not EDIT_BLOCK.search(text):
            self.notify("The last answer has no SEARCH/REPLACE edit to apply", severity="warning")
            return
        ws = str(self.workspace)
        try:
            preview = await self.conn.call("edits/preview", {"workspace": ws, "text": text})
            files = parse_unified_diff(preview["diff"])
            accepted = await self.push_screen_wait(DiffReviewScreen(files))
            every = {(fi, hi) for fi, fd in enumerate(files) for hi in range(len(fd.hunks))}
            if accepted is None or not accepted:
                self.notify("Nothing applied", timeout=3)
                return
            edit_id = preview["edit_id"]
            if accepted != every:
                subset = await asyncio.to_thread(subset_edit_text, files, accepted, self.read_file)
                edit_id = (await self.conn.call("edits/preview", {"workspace": ws, "text": subset}))["edit_id"]
            done = await self.conn.call("edits/apply", {"edit_id": edit_id})
        except (DaemonError, HunkError) as exc:
            msg = describe(exc) if isinstance(exc, DaemonError) else str(exc)
            self.notify(msg, title="Edit not applied", severity="error", timeout=10)
            return
        n = len(accepted)
        self.notify(f"Applied {n} hunk(s) to {', '.join(done['files'])}; /undo reverts", title="Edit applied")

    @work(exclusive=True, group="edit", exit_on_error=False)
    async def action_undo(self) -> None:
        try:
            done = await self.conn.call("edits/undo", {"workspace": str(self.workspace)})
        except DaemonError as exc:
            self.notify(describe(exc), title="Undo", severity="error", timeout=10)
            return
        self.notify(f"Restored {', '.join(done['files'])}", title="Undone")

    def read_file(self, rel: str) -> str | None:
        """A workspace file's text as the edit sees it, or None when it does not exist."""
        target = (self.workspace / rel).resolve()
        if self.workspace not in target.parents:
            raise HunkError(f"{rel}: outside the workspace")
        return target.read_text(encoding="utf-8") if target.is_file() else None

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for action, title, help_text in ACTIONS:
            yield SystemCommand(title, help_text, lambda action=action: self.run_action(action))


def make_app(
    config: Config,
    workspace: Path | None = None,
    *,
    socket_path: Path | None = None,
    autostart: bool = True,
    index_on_start: bool = True,
    connect: bool = True,
) -> JarvisApp:
    """The TUI for ``workspace`` (default: the repository around the current directory).

    ``connect=False`` leaves the daemon alone (snapshot tests fill the screen themselves).
    """
    root = workspace or paths.find_workspace_root() or Path.cwd()
    return JarvisApp(
        config, root, socket_path=socket_path, autostart=autostart, index_on_start=index_on_start, connect=connect
    )
