"""Chat through the router: the policy decides, secrets are redacted, every departure is audited."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_fake_cloud import FakeCloud, stream  # noqa: E402

from openjarvis import paths  # noqa: E402
from openjarvis.cli import main  # noqa: E402
from openjarvis.daemon.client import Client  # noqa: E402
from openjarvis.daemon.lifecycle import ensure_running, stop  # noqa: E402
from openjarvis.daemon.protocol import ErrorCode  # noqa: E402
from openjarvis.errors import DaemonError  # noqa: E402

SECRET = "sk-proj-" + "Q7fT2xLmN9pR4vW8yZ1bC6dE3gH5jK0a"


@pytest.fixture
def cloud() -> Iterator[FakeCloud]:
    c = FakeCloud()
    c.start()
    try:
        yield c
    finally:
        c.stop()


def configure(tiny_setup: Path, url: str, mode: str) -> None:
    cfg = paths.user_config_file()
    cfg.write_text(
        cfg.read_text() + f'[router]\ncloud = "{mode}"\n\n[[router.targets]]\nname = "fake"\n'
        f'base_url = "{url}"\nmodel = "fake-model-v1"\ninput_usd_per_1k = 0.01\noutput_usd_per_1k = 0.02\n'
    )
    (tiny_setup / "app" / "settings.py").write_text(f'# settings for the http parser\nOPENAI_KEY = "{SECRET}"\n')


def test_asked_cloud_answers_redacted_and_audited(
    tiny_setup: Path, cloud: FakeCloud, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(tiny_setup, cloud.url, "ask")
    cloud.script(stream("The parser ", "lives in app/http.py."))
    ensure_running(paths.socket_path())
    try:
        tokens: list[str] = []
        with Client(autostart=False) as c:
            result = c.call(
                "chat",
                {"workspace": str(tiny_setup), "message": "where are http settings parsed?", "route": "cloud"},
                on_notification=lambda m, p: tokens.append(p["text"]) if m == "chat/token" else None,
            )
        assert result["answer"] == "The parser lives in app/http.py." == "".join(tokens)
        assert result["route"] == "fake" and result["left_machine"] is False  # 127.0.0.1 is this machine
        assert result["route_reason"].startswith("you asked")
        sent = cloud.received[0].body.decode()
        assert "parse_http_response" in sent  # the repository's code went as context
        assert SECRET not in sent  # but not the key planted in it
        assert main(["audit", "--json"]) == 0
        audit = json.loads(capsys.readouterr().out)
        rows = audit["requests"]
        assert len(rows) == 1 and rows[0]["target"] == "fake" and rows[0]["model"] == "fake-model-v1"
        assert sum(rows[0]["redactions"].values()) >= 1 and audit["spent_today_usd"] > 0
    finally:
        stop(paths.socket_path())


def test_policy_never_refuses_to_send(tiny_setup: Path, cloud: FakeCloud) -> None:
    # A target off this machine (a name that can never resolve: the policy refuses before any lookup).
    configure(tiny_setup, "https://api.example.invalid/v1", "never")
    ensure_running(paths.socket_path())
    try:
        with Client(autostart=False) as c:
            with pytest.raises(DaemonError) as err:
                c.call("chat", {"workspace": str(tiny_setup), "message": "hi", "route": "cloud"})
            assert err.value.code == ErrorCode.POLICY_REFUSED
            assert "staying local" in str(err.value)
            # Without asking, the local pair answers and nothing leaves.
            local = c.call("chat", {"workspace": str(tiny_setup), "message": "hi"})
        assert local["route"] == "local" and local["left_machine"] is False
    finally:
        stop(paths.socket_path())


def big_prompt_setup(tiny_setup: Path) -> None:
    """A question whose best context is larger than the tiny models' 1024-token context."""
    (tiny_setup / "README.md").write_text("# Tiny app\n" + "The parser handles every header.\n" * 400)
    cfg = paths.user_config_file()
    cfg.write_text(cfg.read_text().replace("[generation]\n", "[generation]\nprompt_budget = 4000\n"))


def test_a_prompt_too_big_for_here_goes_to_the_target_with_room(
    tiny_setup: Path, cloud: FakeCloud, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(tiny_setup, cloud.url, "auto")
    big_prompt_setup(tiny_setup)
    cloud.script(stream("Answered ", "by the big one."))
    ensure_running(paths.socket_path())
    try:
        assert main(["ask", "-C", str(tiny_setup), "summarise", "the", "README", "parser", "header"]) == 0
        out, err = capsys.readouterr()
        assert out.startswith("Answered by the big one.")
        footer = err.strip().splitlines()[-1]
        # The fake target listens on 127.0.0.1: another engine on this machine, not a departure.
        assert footer.startswith("another engine on this machine: fake · fake-model-v1")
        assert "does not fit the local context" in footer
        assert len(cloud.received) == 1 and len(cloud.received[0].body) > 4000
    finally:
        stop(paths.socket_path())


def test_ask_mode_holds_a_departure_until_confirmed(tiny_setup: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A target off this machine; the name can never resolve, and nothing is sent without --yes.
    configure(tiny_setup, "https://api.example.invalid/v1", "ask")
    big_prompt_setup(tiny_setup)
    ensure_running(paths.socket_path())
    try:
        assert main(["ask", "-C", str(tiny_setup), "summarise", "the", "README", "parser", "header"]) == 1
        err = capsys.readouterr().err
        assert "does not fit the local context" in err and "confirm to send (estimated $" in err
        assert err.strip().endswith("not sent (pass --yes to confirm)")
        with Client(autostart=False) as c:
            with pytest.raises(DaemonError) as exc:
                c.call("chat", {"workspace": str(tiny_setup), "message": "summarise the README parser header"})
        assert exc.value.code == ErrorCode.POLICY_REFUSED
        assert exc.value.data == {"needs_confirmation": True, "target": "fake"}
    finally:
        stop(paths.socket_path())


def test_an_unsure_local_answer_is_replaced_by_the_target_in_auto_mode(tiny_setup: Path, cloud: FakeCloud) -> None:
    configure(tiny_setup, cloud.url, "auto")
    cfg = paths.user_config_file()
    # Every answer of the random tiny verifier is "unsure" against this threshold.
    cfg.write_text(cfg.read_text().replace('cloud = "auto"\n', 'cloud = "auto"\nlow_confidence_logprob = -0.001\n'))
    cloud.script(stream("A surer ", "answer."))
    ensure_running(paths.socket_path())
    try:
        events: list[tuple[str, dict[str, object]]] = []
        with Client(autostart=False) as c:
            result = c.call(
                "chat",
                {"workspace": str(tiny_setup), "message": "explain Router", "max_tokens": 20, "drafter": "none"},
                on_notification=lambda m, p: events.append((m, p)),
            )
        methods = [m for m, _ in events]
        restart = methods.index("chat/restart")
        assert "chat/token" in methods[:restart] and "chat/token" in methods[restart + 1 :]  # local, then target
        assert "local answer unsure (mean log-prob" in str(events[restart][1]["reason"])
        after = "".join(str(p["text"]) for m, p in events[restart + 1 :] if m == "chat/token")
        assert result["answer"] == after == "A surer answer." and result["route"] == "fake"
    finally:
        stop(paths.socket_path())


def test_an_unsure_local_answer_stands_in_ask_mode_and_says_what_was_held_back(
    tiny_setup: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A target off this machine (a name that can never resolve: nothing is sent without --yes).
    configure(tiny_setup, "https://api.example.invalid/v1", "ask")
    cfg = paths.user_config_file()
    cfg.write_text(cfg.read_text().replace('cloud = "ask"\n', 'cloud = "ask"\nlow_confidence_logprob = -0.001\n'))
    ensure_running(paths.socket_path())
    try:
        assert main(["ask", "-C", str(tiny_setup), "--max-tokens", "20", "explain", "Router"]) == 0
        out, err = capsys.readouterr()
        footer = err.strip().splitlines()[-1]
        assert footer.startswith("local · tiny-v · ")
        assert "local answer unsure (mean log-prob" in footer and "sending to fake (fake-model-v1)" in footer
        assert footer.endswith("not sent (router.cloud = ask); ask again with --cloud or /cloud to send it")
        assert main(["audit", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["requests"] == []  # nothing left
    finally:
        stop(paths.socket_path())
