"""Targets from the user file, their validation errors, key sources, and repo files that only narrow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from openjarvis import paths
from openjarvis.config import load_config
from openjarvis.errors import CloudAuthError, ConfigError
from openjarvis.router.policy import Policy
from openjarvis.router.targets import Target, load_router

OPENAI = """
[[router.targets]]
name = "openai"
base_url = "https://api.openai.com/v1"
model = "gpt-4o-mini"
api_key_env = "OPENAI_API_KEY"
input_usd_per_1k = 0.00015
output_usd_per_1k = 0.0006

[[router.targets]]
name = "workstation"
base_url = "http://10.0.0.5:8000/v1"
model = "qwen-32b"
local = true
context = 32768
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def policy(workspace: Path) -> Policy:
    return load_router(load_config(workspace), workspace)


def test_targets_and_policy_from_the_user_file(workspace: Path) -> None:
    write(paths.user_config_file(), '[router]\ncloud = "auto"\ntarget = "workstation"\n' + OPENAI)
    p = policy(workspace)
    assert p.cloud == "auto" and p.preferred == "workstation"
    assert p.targets == (
        Target("openai", "https://api.openai.com/v1", "gpt-4o-mini", "OPENAI_API_KEY", "", 0.00015, 0.0006),
        Target("workstation", "http://10.0.0.5:8000/v1", "qwen-32b", local=True, context=32768),
    )
    # The flat config loader skips the list of tables instead of rejecting it.
    assert load_config(workspace).router.cloud == "auto"


def test_no_user_file_means_no_targets_and_cloud_never(workspace: Path) -> None:
    assert policy(workspace) == Policy()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[router]\ntargets = 'openai'\n", "router.targets must be a list of tables ([[router.targets]])"),
        ("[[router.targets]]\nname = 'x'\nmodel = 'm'\n", "router.targets[0]: base_url is required"),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'https://a.example/v1'\nmodel = 'm'\nkey = 'k'\n",
            "router.targets[0]: unknown key 'key'; allowed: name, base_url, model, api_key_env, api_key_file",
        ),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'https://a.example/v1'\nmodel = 'm'\ncontext = '8k'\n",
            "router.targets[0].context must be int, got str '8k'",
        ),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'ftp://a.example/v1'\nmodel = 'm'\n",
            "router.targets[0] (x): base_url must be an http(s) URL",
        ),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'http://api.example.com/v1'\nmodel = 'm'\n",
            "router.targets[0] (x): a cloud target needs https (plain http is allowed for local = true only)",
        ),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'https://u:pw@a.example/v1'\nmodel = 'm'\n",
            "router.targets[0] (x): base_url must not carry credentials; use api_key_env or api_key_file",
        ),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'https://a.example/v1'\nmodel = 'm'\n"
            "api_key_env = 'A'\napi_key_file = '/k'\n",
            "router.targets[0] (x): give api_key_env or api_key_file, not both",
        ),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'https://a.example/v1'\nmodel = 'm'\ninput_usd_per_1k = -1\n",
            "router.targets[0] (x): input_usd_per_1k must be >= 0",
        ),
        (
            "[[router.targets]]\nname = 'x'\nbase_url = 'https://a.example/v1'\nmodel = 'm'\n"
            "[[router.targets]]\nname = 'x'\nbase_url = 'https://b.example/v1'\nmodel = 'm'\n",
            "router.targets[1] (x): a target named 'x' is already declared; names must be unique",
        ),
    ],
)
def test_invalid_targets_fail_with_one_line_naming_file_and_key(workspace: Path, toml: str, message: str) -> None:
    user = write(paths.user_config_file(), toml)
    with pytest.raises(ConfigError) as exc:
        policy(workspace)
    text = str(exc.value)
    assert text.startswith(f"{user}: ") and message in text and "\n" not in text


def test_a_repository_cannot_add_targets(workspace: Path) -> None:
    repo = write(workspace / ".jarvis.toml", OPENAI)
    with pytest.raises(ConfigError) as exc:
        policy(workspace)
    assert str(exc.value) == (
        f"{repo}: router.targets is read only from your user file {paths.user_config_file()}: "
        "a repository may not choose where your code and keys go; move the targets there"
    )


@pytest.mark.parametrize(
    ("user", "repo", "expected"),
    [
        ('cloud = "auto"', 'cloud = "ask"', {"cloud": "ask"}),
        ('cloud = "never"', 'cloud = "auto"', {"cloud": "never"}),
        ("", 'cloud = "auto"', {"cloud": "never"}),
        ("daily_spend_cap_usd = 1.0", "daily_spend_cap_usd = 50.0", {"daily_spend_cap_usd": 1.0}),
        ("daily_spend_cap_usd = 1.0", "daily_spend_cap_usd = 0.25", {"daily_spend_cap_usd": 0.25}),
        ("", "low_confidence_logprob = -0.01", {"low_confidence_logprob": -1.2}),
        ("low_confidence_logprob = -1.0", "low_confidence_logprob = -3.0", {"low_confidence_logprob": -3.0}),
        ("min_acceptance = 0.2", "min_acceptance = 0.9", {"min_acceptance": 0.2}),
        ("offline = true", "offline = false", {"offline": True}),
        ("", "never_leave = true", {"never_leave": True}),
        ("never_leave = true", "never_leave = false", {"never_leave": True}),
    ],
)
def test_a_repository_file_can_only_narrow_the_policy(
    workspace: Path, user: str, repo: str, expected: dict[str, object]
) -> None:
    write(paths.user_config_file(), f"[router]\n{user}\n")
    write(workspace / ".jarvis.toml", f"[router]\n{repo}\n")
    p = policy(workspace)
    for key, value in expected.items():
        assert getattr(p, key) == value, key


def test_the_persons_own_environment_and_flags_apply_as_given(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(workspace / ".jarvis.toml", '[router]\ncloud = "never"\n')
    monkeypatch.setenv("JARVIS_ROUTER_CLOUD", "auto")
    assert policy(workspace).cloud == "auto"
    assert load_router(load_config(workspace, overrides={"router.cloud": "ask"}), workspace).cloud == "ask"


def test_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    t = Target("openai", "https://api.openai.com/v1", "m", api_key_env="OPENAI_API_KEY")
    with pytest.raises(CloudAuthError, match=r"^target 'openai': environment variable OPENAI_API_KEY is not set"):
        t.api_key()
    monkeypatch.setenv("OPENAI_API_KEY", " sk-from-env \n")
    assert t.api_key() == "sk-from-env"
    assert Target("ollama", "http://127.0.0.1:11434/v1", "m").api_key() == ""


def test_key_file_must_be_private(tmp_path: Path) -> None:
    key = tmp_path / "openai.key"
    key.write_text("sk-from-file\n")
    t = Target("openai", "https://api.openai.com/v1", "m", api_key_file=str(key))
    os.chmod(key, 0o644)
    with pytest.raises(CloudAuthError) as exc:
        t.api_key()
    assert str(exc.value) == (f"target 'openai': key file {key} has mode 0644 or another owner; run `chmod 600 {key}`")
    assert "sk-from-file" not in str(exc.value)
    os.chmod(key, 0o600)
    assert t.api_key() == "sk-from-file"


def test_missing_key_file(tmp_path: Path) -> None:
    t = Target("openai", "https://api.openai.com/v1", "m", api_key_file=str(tmp_path / "nope.key"))
    with pytest.raises(CloudAuthError, match=r"^target 'openai': cannot read key file .*nope\.key: No such file"):
        t.api_key()
