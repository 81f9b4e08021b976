"""The assistant through the daemon, as an editor or the CLI uses it, on the tiny model pair."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from openjarvis import paths
from openjarvis.cli import main
from openjarvis.daemon.client import AsyncClient, Client
from openjarvis.daemon.lifecycle import ensure_running, stop
from openjarvis.daemon.protocol import ErrorCode
from openjarvis.errors import DaemonError
from openjarvis.history import open_history


def test_chat_streams_tokens_and_remembers_the_conversation(tiny_daemon: Path) -> None:
    ws = str(tiny_daemon)
    events: list[tuple[str, dict[str, object]]] = []
    with Client(autostart=False) as c:
        result = c.call(
            "chat", {"workspace": ws, "message": "How is parse_http_response used?"},
            on_notification=lambda m, p: events.append((m, p)),
        )  # fmt: skip
        tokens = [p["text"] for m, p in events if m == "chat/token"]
        assert tokens and "".join(tokens) == result["answer"]  # the stream is the answer
        assert any(m == "index/progress" for m, _ in events)  # first use indexed the workspace
        # the prompt is read with progress (runs of 128 tokens), all of it before the answer
        names = [m for m, _ in events]
        reads = [(p["done"], p["total"]) for m, p in events if m == "chat/progress"]
        assert len(reads) >= 2 and reads[-1][0] == reads[-1][1] > 128
        assert [d for d, _ in reads] == sorted(d for d, _ in reads)
        assert names.index("chat/token") > len(names) - 1 - names[::-1].index("chat/progress")
        assert result["route"] == "local" and result["model"] == "tiny-v"
        assert "app/http.py" in {s["path"] for s in result["sources"]}
        assert result["stats"]["tokens"] >= 1 and result["stats"]["ttft_s"] is not None
        assert result["stats"]["mean_logprob"] < 0  # the router's confidence signal
        # A second turn in the same conversation sees the first and reuses the cached prefix.
        again = c.call("chat", {"workspace": ws, "message": "And Router?", "conversation": result["conversation"]})
        assert again["conversation"] == result["conversation"]
        got = c.call("conversations/get", {"id": result["conversation"]})
        assert [m["role"] for m in got["messages"]] == ["user", "assistant", "user", "assistant"]
        assert got["messages"][1]["content"] == result["answer"]
        listed = c.call("conversations/list", {"workspace": ws})["conversations"]
        assert listed[0]["id"] == result["conversation"] and listed[0]["messages"] == 4
    with open_history() as db:
        rows = db.conn.execute("SELECT method, route, model, outcome FROM requests").fetchall()
    assert rows == [("chat", "local", "tiny-v", "ok")] * 2


def test_search_and_index_status(tiny_daemon: Path) -> None:
    ws = str(tiny_daemon)
    with Client(autostart=False) as c:
        status = c.call("index/status", {"workspace": ws})
        assert status["indexed"] is False
        added = c.call("index/add", {"workspace": ws})
        assert added["indexed"] == 2 and added["errors"] == 0
        hits = c.call("search", {"workspace": ws, "query": "http response", "k": 3})["hits"]
        assert hits[0]["path"] == "app/http.py" and hits[0]["symbol"] == "parse_http_response"
        status = c.call("index/status", {"workspace": ws})
        assert status["indexed"] and status["watching"] and status["files"] == 2
        with pytest.raises(DaemonError) as err:
            c.call("search", {"workspace": "relative/path", "query": "x"})
        assert err.value.code == ErrorCode.WORKSPACE_ERROR


def test_complete_fills_the_middle(tiny_daemon: Path) -> None:
    with Client(autostart=False) as c:
        out = c.call("complete", {"prefix": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 8})
        assert isinstance(out["text"], str) and out["stats"]["tokens"] <= 8


def test_cancel_mid_stream_stops_within_a_step(tiny_daemon: Path) -> None:
    ws = str(tiny_daemon)

    async def scenario() -> tuple[list[str], DaemonError | None, bool]:
        async with AsyncClient(autostart=False) as c:
            await c.call("index/add", {"workspace": ws})
            seen: list[str] = []
            error: DaemonError | None = None
            # 174 tokens from the tiny pair (a 12-token answer ended before a loaded machine's
            # cancel arrived): the cancel must land mid-stream to test stopping within a step
            message = "explain everything in detail"
            stream = c.stream("chat", {"workspace": ws, "message": message, "max_tokens": 400})
            rid = None
            try:
                async for method, params in stream:
                    if method == "chat/token":
                        seen.append(params["text"])
                        rid = params["request_id"]
                        if len(seen) == 2:
                            # The daemon frozen while the cancel is sent: the tiny pair's whole
                            # answer takes ~0.15 s, which a loaded machine's scheduling of this
                            # process could outlast. Thawed, it reads the cancel mid-answer.
                            pid = int(c.server_info["pid"])
                            os.kill(pid, signal.SIGSTOP)
                            try:
                                cancelled = asyncio.create_task(c.cancel(rid))
                                await asyncio.sleep(0.2)  # the request written to its socket
                            finally:
                                os.kill(pid, signal.SIGCONT)
                            assert await cancelled is True
            except DaemonError as exc:
                error = exc
            alive = (await c.call("stats"))["in_flight"] == 1  # only this stats call is in flight
            return seen, error, alive

    seen, error, alive = asyncio.run(scenario())
    assert error is not None and error.code == ErrorCode.CANCELLED
    assert 2 <= len(seen) < 400
    assert alive
    with open_history() as db:  # a cancelled answer leaves no half conversation behind
        assert db.conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_two_clients_stream_at_once_and_a_disconnect_is_survived(tiny_daemon: Path) -> None:
    ws = str(tiny_daemon)
    with Client(autostart=False) as c:
        c.call("index/add", {"workspace": ws})
    # A client that sends a chat and vanishes mid-stream.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(paths.socket_path()))
    s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocol_version":1,"client_name":"x"}}\n')
    s.sendall(
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "chat", "params": {"workspace": ws, "message": "hi"}}).encode()
        + b"\n"
    )
    s.makefile("rb").readline()
    s.close()
    results: dict[int, str] = {}

    def ask(n: int) -> None:
        with Client(autostart=False) as c:
            results[n] = c.call("chat", {"workspace": ws, "message": f"question {n} about Router"})["answer"]

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1] and all(isinstance(a, str) for a in results.values())
    with Client(autostart=False) as c:
        assert c.call("stats")["in_flight"] == 1


def test_edits_preview_apply_undo_through_the_daemon(tiny_daemon: Path) -> None:
    ws = tiny_daemon
    original = (ws / "app" / "http.py").read_text()
    answer = "app/http.py\n<<<<<<< SEARCH\nclass Router:\n=======\nclass Router:  # routes paths\n>>>>>>> REPLACE\n"
    with Client(autostart=False) as c:
        preview = c.call("edits/preview", {"workspace": str(ws), "text": answer})
        assert preview["files"] == ["app/http.py"]
        assert "+class Router:  # routes paths" in preview["diff"]
        assert (ws / "app" / "http.py").read_text() == original  # nothing before apply
        c.call("edits/apply", {"edit_id": preview["edit_id"]})
        assert "class Router:  # routes paths" in (ws / "app" / "http.py").read_text()
        undone = c.call("edits/undo", {"workspace": str(ws)})
        assert undone["edit_id"] == preview["edit_id"]
        assert (ws / "app" / "http.py").read_text() == original
        with pytest.raises(DaemonError) as err:
            c.call(
                "edits/preview", {"workspace": str(ws), "text": "../x\n<<<<<<< SEARCH\n=======\ny\n>>>>>>> REPLACE\n"}
            )
        assert err.value.code == ErrorCode.EDIT_FAILED and "outside the workspace" in str(err.value)
        with pytest.raises(DaemonError) as err:
            c.call("edits/undo", {"workspace": str(ws)})
        assert err.value.code == ErrorCode.NOT_FOUND


def test_missing_model_is_a_clear_error(tiny_setup: Path) -> None:
    paths.user_config_file().write_text('[models]\npair = "qwen2.5-coder"\n')
    ensure_running(paths.socket_path())
    try:
        with Client(autostart=False) as c:
            with pytest.raises(DaemonError) as err:
                c.call("chat", {"workspace": str(tiny_setup), "message": "hi"})
        assert err.value.code == ErrorCode.MODEL_UNAVAILABLE
        assert "is not installed; run `jarvis models install" in str(err.value)
    finally:
        stop(paths.socket_path())


def test_the_footer_says_when_an_answer_was_cut_for_repeating_itself() -> None:
    from openjarvis.cli.ask_cmd import footer

    stats = {"tokens": 60, "tokens_per_s": 25.0, "acceptance": 0.9, "ttft_s": 1.0}
    plain = footer({"route": "local", "model": "m", "stats": {**stats, "finish_reason": "stop"}})
    cut = footer({"route": "local", "model": "m", "stats": {**stats, "finish_reason": "repetition"}})
    assert "repeating" not in plain
    assert cut == plain + " · stopped: it began repeating itself (generation.loop_repeats)"
    # a local answer router.cloud = ask held back from a target says so, and how to send it
    why = ("local answer began repeating itself; sending to big (m2): not sent (router.cloud = ask); "
           "ask again with --cloud")
    held = footer({"route": "local", "model": "m", "route_reason": why,
                   "stats": {**stats, "finish_reason": "repetition"}})
    assert held == cut + " · " + why
    unheld = {"route": "local", "model": "m", "route_reason": "local", "stats": {**stats, "finish_reason": "stop"}}
    assert footer(unheld) == plain


def test_jarvis_ask_streams_plain_text_sources_and_footer(
    tiny_daemon: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tiny_daemon)
    (tiny_daemon / ".git").mkdir()
    assert main(["ask", "what", "parses", "http", "responses?"]) == 0
    out, err = capsys.readouterr()
    assert "\nsources: app/http.py:" in out
    footer = err.strip().splitlines()[-1]
    assert footer.startswith("local · tiny-v · ") and "tok/s" in footer and "first token" in footer
    assert main(["ask", "--continue", "--json", "and", "Router?"]) == 0
    result = json.loads(capsys.readouterr().out)
    with Client(autostart=False) as c:
        convs = c.call("conversations/list", {"workspace": str(tiny_daemon)})["conversations"]
    assert len(convs) == 1 and convs[0]["messages"] == 4  # --continue joined the first conversation
    assert result["conversation"] == convs[0]["id"]
    # `-c generation.max_tokens` reaches the running daemon (it answers with its own config)
    assert main(["-c", "generation.max_tokens=3", "ask", "--json", "explain", "everything"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["tokens"] == 3
    assert main(["-c", "generation.max_tokens=many", "ask", "x"]) != 0
    assert "generation.max_tokens" in capsys.readouterr().err
    # so does `-c generation.drafter`, and `--drafter` wins over it: the drafters that drafted
    for argv, used in (
        (["-c", "generation.drafter=none", "ask"], set()),
        (["-c", "generation.drafter=none", "ask", "--drafter", "model"], {"model"}),
    ):
        assert main([*argv, "--json", "--max-tokens", "12", "explain", "Router"]) == 0
        per_drafter = json.loads(capsys.readouterr().out)["stats"]["per_drafter"]
        assert {k for k, v in per_drafter.items() if v["drafted"]} == used
    assert main(["-c", "generation.drafter=sometimes", "ask", "x"]) != 0
    assert "generation.drafter" in capsys.readouterr().err
    with open_history() as db:  # the streamed text printed is exactly the stored answer
        first = db.messages(convs[0]["id"])[1].content
    assert out.startswith(first)


def test_a_request_for_the_model_drafter_loads_it_where_the_configuration_left_it_out(
    tiny_setup: Path,
) -> None:
    """The daemon's ``generation.drafter = "none"`` opens the verifier alone; a request that asks
    for ``drafter: model`` (``jarvis ask --drafter model``) loads the drafter then and drafts
    with it, instead of answering without drafts and saying nothing."""
    paths.user_config_file().write_text(
        paths.user_config_file().read_text() + 'drafter = "none"\n'  # (in [generation], last)
    )
    ensure_running(paths.socket_path())
    try:
        with Client(autostart=False) as c:
            plain = c.call("chat", {"workspace": str(tiny_setup), "message": "what is Router?"})
            assert not plain["stats"]["per_drafter"]
            asked = c.call("chat", {"workspace": str(tiny_setup), "message": "what is Router?",
                                    "drafter": "model"})
            assert asked["stats"]["per_drafter"]["model"]["drafted"] > 0
            assert asked["answer"] == plain["answer"]  # greedy: the verifier's answer either way
    finally:
        stop(paths.socket_path())


def test_models_unload_after_the_idle_time(tiny_setup: Path) -> None:
    paths.user_config_file().write_text(
        paths.user_config_file().read_text() + "[daemon]\nidle_unload_minutes = 0.1\n"
    )
    ensure_running(paths.socket_path())
    try:
        with Client(autostart=False) as c:
            c.call("chat", {"workspace": str(tiny_setup), "message": "hi", "max_tokens": 2})
            # loaded still: 6 s of idle time leaves a loaded machine room to ask
            assert c.call("stats")["models_loaded"] == ["tiny-d", "tiny-v"]
            deadline = time.monotonic() + 40
            while c.call("stats")["models_loaded"] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert c.call("stats")["models_loaded"] == []
            # and they come back on the next request
            c.call("chat", {"workspace": str(tiny_setup), "message": "again", "max_tokens": 2})
            assert c.call("stats")["models_loaded"] == ["tiny-d", "tiny-v"]
    finally:
        stop(paths.socket_path())


def test_jarvis_history_lists_and_shows(tiny_daemon: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "-C", str(tiny_daemon)]) == 0
    assert "no conversations yet" in capsys.readouterr().out
    with Client(autostart=False) as c:
        result = c.call("chat", {"workspace": str(tiny_daemon), "message": "what is Router?"})
    assert main(["history", "-C", str(tiny_daemon)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(result["conversation"]) and line.endswith("2 messages  what is Router?")
    assert main(["history", result["conversation"]]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("# what is Router?") and result["answer"] in shown
    assert main(["history", "nope"]) == 1
    assert "no conversation 'nope'" in capsys.readouterr().err


def test_repository_settings_apply_to_its_own_requests_only(tiny_daemon: Path, tmp_path: Path) -> None:
    (tiny_daemon / ".jarvis.toml").write_text("[generation]\nmax_tokens = 3\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "main.py").write_text("print('hi')\n")
    with Client(autostart=False) as c:
        here = c.call("chat", {"workspace": str(tiny_daemon), "message": "explain Router", "drafter": "none"})
        there = c.call("chat", {"workspace": str(other), "message": "explain main", "drafter": "none"})
        assert here["stats"]["tokens"] <= 3  # this repository's .jarvis.toml
        assert there["stats"]["tokens"] > 3 or there["stats"]["finish_reason"] == "stop"  # the user's 24
        (tiny_daemon / ".jarvis.toml").write_text("[generation]\nmax_tokens = 'many'\n")
        with pytest.raises(DaemonError) as err:
            c.call("chat", {"workspace": str(tiny_daemon), "message": "again"})
        assert err.value.code == ErrorCode.WORKSPACE_ERROR and "generation.max_tokens must be int" in str(err.value)


def test_a_request_cancelled_before_it_starts_is_still_answered(tiny_daemon: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(paths.socket_path()))
    rfile = s.makefile("rb")
    try:
        s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocol_version":1,"client_name":"x"}}\n')
        rfile.readline()
        chat = {"jsonrpc": "2.0", "id": 1, "method": "chat", "params": {"workspace": str(tiny_daemon), "message": "hi"}}
        cancel = {"jsonrpc": "2.0", "id": 2, "method": "cancel", "params": {"id": 1}}
        s.sendall(json.dumps(chat).encode() + b"\n" + json.dumps(cancel).encode() + b"\n")  # one write: no gap
        replies = {}
        while len(replies) < 2:
            msg = json.loads(rfile.readline())
            if "id" in msg:
                replies[msg["id"]] = msg
        assert replies[2]["result"] == {"cancelled": True}
        assert replies[1]["error"]["code"] == ErrorCode.CANCELLED
    finally:
        s.close()


def test_a_restarted_daemon_loads_the_prompt_head_from_disk(tiny_daemon: Path) -> None:
    """After a restart only the disk can help: the head's KV state is loaded, the answer unchanged."""
    import shutil

    from openjarvis.engine.prefix_cache import default_dir

    ws = tiny_daemon
    (ws / "app" / "main.py").write_text(  # a caller, so the repository map is not empty
        "from app.http import Router\n\n\ndef serve(raw: str) -> str:\n    return Router().route(raw)\n"
    )
    sock = paths.socket_path()

    def ask(question: str) -> dict[str, object]:
        with Client(autostart=False) as c:
            result: dict[str, object] = c.call("chat", {"workspace": str(ws), "message": question, "max_tokens": 12})
        return result

    def restart() -> None:
        stop(sock)
        assert ensure_running(sock) is True

    first = ask("How is parse_http_response used?")
    assert first["stats"]["prefix_loaded"] == 0  # type: ignore[index]
    assert list(default_dir().glob("*.kv"))
    restart()
    loaded = ask("What does Router.route return?")
    assert loaded["stats"]["prefix_loaded"] > 64  # type: ignore[index]
    restart()
    shutil.rmtree(default_dir())
    computed = ask("What does Router.route return?")
    assert computed["stats"]["prefix_loaded"] == 0  # type: ignore[index]
    assert loaded["answer"] == computed["answer"]
