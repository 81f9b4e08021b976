"""The index commands as a person types them: output lines, JSON shapes, error lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openjarvis.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_index_then_query(sample_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "-c", "index.workers=1", "index")
    assert code == 0
    first = out.splitlines()[0]
    assert first.startswith("indexed 15 files (") and ", 0 unchanged, 0 removed, " in first
    assert out.splitlines()[1].startswith("index: ")

    code, out, _ = run(capsys, "index", "--json")
    summary = json.loads(out)
    assert (summary["indexed"], summary["unchanged"], summary["workspace"]) == (0, 15, str(sample_repo))

    code, out, _ = run(capsys, "search", "formatName", "-k", "2", "--json")
    hits = [json.loads(line) for line in out.splitlines()]
    assert list(hits[0]) == ["path", "symbol", "kind", "start_line", "end_line", "score", "snippet"]
    assert (hits[0]["path"], hits[0]["symbol"]) == ("src/tsx/sample.tsx", "formatName")

    code, out, _ = run(capsys, "search", "formatName", "-k", "1")
    assert out.splitlines()[0].startswith("src/tsx/sample.tsx:12-14  formatName (function)  ")
    assert out.splitlines()[1] == "    function formatName(name: string): string {"

    code, out, _ = run(capsys, "def", "HttpClient.parse_http_response")
    assert "src/python/sample.py:14  HttpClient.parse_http_response (method)  " in out

    code, out, _ = run(capsys, "refs", "formatName")
    assert out == "src/tsx/sample.tsx:9  (call)  return <div>{formatName(props.name)}</div>;\n"

    code, out, _ = run(capsys, "map", "--tokens", "200")
    assert code == 0 and out.count(":\n") >= 1 and len(out) <= 200 * 4

    code, out, _ = run(capsys, "index", "status", "--json")
    status = json.loads(out)
    assert status["files"] == 15 and status["languages"]["python"] == 1
    assert status["skipped"] == {"vcs": 1}

    code, out, _ = run(capsys, "index", "status")
    assert "skipped    vcs 1" in out and "errors     0" in out


def test_index_status_reports_skips_and_errors(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workspace / "ok.py").write_text("def fine():\n    pass\n")
    (workspace / "bad.py").write_text("def broken(:\n")
    (workspace / ".env").write_text("KEY=1\n")
    (workspace / "node_modules").mkdir()
    assert main(["index"]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "index", "status")
    assert "skipped    dependencies 1, secret 1, vcs 1" in out
    assert "errors     1" in out
    assert "  bad.py: syntax error near line 1; chunked as plain text" in out


def test_errors_are_one_line(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "search", "anything")
    assert code == 1
    assert err == f"error: {workspace} has no index yet; run `jarvis index {workspace}` first\n"
    code, _, err = run(capsys, "index", str(workspace / "missing"))
    assert (code, err) == (2, f"error: {workspace / 'missing'} does not exist; pass a folder to index\n")
    (workspace / "file.txt").write_text("x")
    code, _, err = run(capsys, "index", str(workspace / "file.txt"))
    assert code == 2 and "is not a directory" in err
    main(["index"])
    capsys.readouterr()
    _, _, err = run(capsys, "def", "no_such_name")
    # The exit status (1 from ctx.exit) is lost by openjarvis.cli.main; reported to the lead.
    assert err == "no definition of 'no_such_name' in the index\n"
    (workspace / "m.py").write_text("def parse_http_date(value):\n    pass\n")
    main(["index"])
    capsys.readouterr()
    _, _, err = run(capsys, "def", "parse_htpp_date")
    assert err == "no definition of 'parse_htpp_date' in the index; did you mean parse_http_date?\n"


def test_index_another_path_and_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("def a():\n    pass\n")
    assert main(["index", str(project)]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "index", "--rebuild", "--json", str(project))
    assert json.loads(out)["indexed"] == 1
    code, out, _ = run(capsys, "def", "a", "-w", str(project))
    assert out.startswith("a.py:1  a (function)")


@pytest.mark.parametrize("argv", [["index"], ["index", "status"], ["search"], ["map"], ["def"], ["refs"]])
def test_help_ends_with_an_example(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    assert "jarvis " in out.split("Example")[-1]


def test_a_corrupt_index_is_rebuilt_with_a_warning(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from openjarvis.index.store import db_path_for

    (workspace / "a.py").write_text("def a():\n    pass\n")
    db = db_path_for(workspace)
    db.parent.mkdir(parents=True)
    db.write_bytes(b"garbage" * 1000)
    code, out, err = run(capsys, "index")
    assert code == 0 and out.startswith("indexed 1 files")
    assert err.startswith(f"warning: cannot open index {db}: file is not a database; ")
    assert err.endswith("; rebuilding it now\n")
