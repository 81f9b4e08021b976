"""Configuration layering and its errors, as a person sees them through `jarvis config`."""

from __future__ import annotations

from pathlib import Path

import pytest

from openjarvis import paths
from openjarvis.cli import main
from openjarvis.config import load_config, set_user_value
from openjarvis.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_when_nothing_is_configured(workspace: Path) -> None:
    cfg = load_config()
    assert cfg.engine.threads == 0
    assert cfg.router.cloud == "never"
    assert cfg.source_of("engine.threads") == "default"
    assert cfg.files == ()


def test_precedence_user_repo_env_flag(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = write(
        paths.user_config_file(), "[engine]\nthreads = 1\ncontext = 2048\nbatch = 64\n[router]\ncloud = 'ask'\n"
    )
    repo = write(workspace / ".jarvis.toml", "[engine]\nthreads = 2\ncontext = 4096\n")
    monkeypatch.setenv("JARVIS_ENGINE_THREADS", "3")
    cfg = load_config(overrides={"generation.temperature": "0.7"})
    assert cfg.engine.batch == 64 and cfg.source_of("engine.batch") == f"user file {user}"
    assert cfg.engine.context == 4096 and cfg.source_of("engine.context") == f"repo file {repo}"
    assert cfg.engine.threads == 3 and cfg.source_of("engine.threads") == "env JARVIS_ENGINE_THREADS"
    assert cfg.generation.temperature == 0.7 and cfg.source_of("generation.temperature").startswith("flag")
    assert cfg.router.cloud == "ask"
    assert cfg.files == (user, repo)
    # A flag beats the environment.
    assert load_config(overrides={"engine.threads": "4"}).engine.threads == 4


def test_repo_file_found_from_a_subdirectory(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(workspace / ".jarvis.toml", "[generation]\nmax_tokens = 99\n")
    sub = workspace / "src" / "pkg"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert load_config().generation.max_tokens == 99


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[engine]\nthreds = 2\n", "unknown key 'engine.threds'; allowed keys in [engine]: backend, threads"),
        ("[engin]\nthreads = 2\n", "unknown section 'engin'; allowed sections: models, engine"),
        ("[engine]\nthreads = 'two'\n", "engine.threads must be int, got str 'two'"),
        ("[engine]\nflash_attn = 1\n", "engine.flash_attn must be bool, got int 1"),
        (
            "[router]\ncloud = 'sometimes'\n",
            "router.cloud = 'sometimes' is not allowed; use one of 'never', 'ask', 'auto'",
        ),
        ("[engine\nthreads = 2\n", "invalid TOML"),
        ("threads = 2\n", "top-level key 'threads' must be a [section] table"),
    ],
)
def test_bad_repo_file_names_file_key_and_allowed(workspace: Path, text: str, message: str) -> None:
    bad = write(workspace / ".jarvis.toml", text)
    with pytest.raises(ConfigError) as err:
        load_config()
    assert str(err.value).startswith(str(bad))
    assert message in str(err.value)


def test_bad_environment_value_names_the_variable(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JARVIS_ENGINE_THREADS", "lots")
    with pytest.raises(ConfigError, match="environment variable JARVIS_ENGINE_THREADS: engine.threads must be int"):
        load_config()
    monkeypatch.setenv("JARVIS_ENGINE_THREADS", "2")
    monkeypatch.setenv("JARVIS_ENGINE_THREDS", "2")
    with pytest.raises(ConfigError, match="JARVIS_ENGINE_THREDS: unknown key 'engine.threds'"):
        load_config()


def test_set_writes_user_file_and_keeps_comments(workspace: Path) -> None:
    user = write(paths.user_config_file(), "# my settings\n[engine]\n# two is plenty\nthreads = 2\n")
    set_user_value("engine.threads", "4")
    set_user_value("router.offline", "true")
    text = user.read_text()
    assert "# my settings" in text and "# two is plenty" in text
    cfg = load_config()
    assert cfg.engine.threads == 4 and cfg.router.offline is True
    with pytest.raises(ConfigError, match="must be int"):
        set_user_value("engine.threads", "four")
    assert load_config().engine.threads == 4  # the failed set changed nothing


def test_cli_show_path_set(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["config", "set", "engine.context", "2048"]) == 0
    assert f"written to {paths.user_config_file()}" in capsys.readouterr().out
    monkeypatch.setenv("JARVIS_ENGINE_BATCH", "32")
    assert main(["-c", "engine.threads=3", "config", "show"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["engine.context"].endswith(f"# user file {paths.user_config_file()}")
    assert "2048" in lines["engine.context"]
    assert lines["engine.batch"].endswith("# env JARVIS_ENGINE_BATCH")
    assert lines["engine.threads"].endswith("# flag -c engine.threads")
    assert lines["router.cloud"].endswith("# default")
    assert main(["config", "path"]) == 0
    out = capsys.readouterr().out
    assert f"user file: {paths.user_config_file()}" in out
    assert f"repo file: {workspace / '.jarvis.toml'}  (absent)" in out


def test_cli_errors_are_one_line(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "set", "engine.nope", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: jarvis config set: unknown key 'engine.nope'")
    assert main(["-c", "engine.threads", "config", "show"]) != 0
    assert "expected SECTION.KEY=VALUE" in capsys.readouterr().err
