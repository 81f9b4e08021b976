"""Router targets: the OpenAI-compatible endpoints a request may go to, read from the user file.

A target is any server that speaks OpenAI's ``/v1/chat/completions``: a cloud provider, or the
person's own vLLM, llama.cpp server or Ollama. They are declared as a list of tables in the *user*
configuration file, next to the flat ``[router]`` keys that ``openjarvis.config`` owns::

    [router]
    cloud = "ask"

    [[router.targets]]
    name = "openai"
    base_url = "https://api.openai.com/v1"
    model = "gpt-4o-mini"
    api_key_env = "OPENAI_API_KEY"
    input_usd_per_1k = 0.00015
    output_usd_per_1k = 0.0006

    [[router.targets]]
    name = "workstation"
    base_url = "http://10.0.0.5:8000/v1"   # your own vLLM
    model = "Qwen/Qwen2.5-Coder-32B-Instruct"
    local = true                           # yours: allowed even when router.cloud = "never"
    context = 32768

Why only the user file: a repository's ``.jarvis.toml`` arrives with ``git clone``; if it could add
a target, a stranger's repository could send your code, and the key named by ``api_key_env``, to
a server of its choosing. A repository may *narrow* the policy (``never_leave = true``, a lower
spend cap, ``cloud = "never"``) but never widen it; see :func:`load_router`.

Keys come from an environment variable or from a file that only its owner can read (mode 0600);
they are read when a request is made, never stored in a record, never logged.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from openjarvis import paths
from openjarvis.config import REPO_FILE, Config, RouterConfig, read_toml
from openjarvis.errors import CloudAuthError, ConfigError
from openjarvis.netguard import is_loopback
from openjarvis.router.policy import CLOUD_MODES, CloudMode, Policy


@dataclass(frozen=True, slots=True)
class Target:
    """One OpenAI-compatible endpoint; prices are US dollars per 1,000 tokens."""

    name: str
    base_url: str
    model: str
    api_key_env: str = ""
    api_key_file: str = ""
    input_usd_per_1k: float = 0.0
    output_usd_per_1k: float = 0.0
    #: The person's own engine (their vLLM, llama.cpp server, Ollama): ``router.cloud`` does not
    #: gate it, but offline mode and ``never_leave`` still do unless it is on this machine.
    local: bool = False
    #: Context window of ``model`` in tokens; 0 = unknown (assumed large enough).
    context: int = 0

    @property
    def host(self) -> str:
        """Host name only, for audit rows and error lines (never the URL's credentials or path)."""
        return urlsplit(self.base_url).hostname or ""

    @property
    def on_this_machine(self) -> bool:
        """True when the endpoint is a loopback address: bytes sent there never leave the machine."""
        return is_loopback(self.base_url)

    def cost_usd(self, tokens_in: int, tokens_out: int) -> float:
        """US dollars for a request of that size at this target's prices (0 for your own engines)."""
        return tokens_in / 1000 * self.input_usd_per_1k + tokens_out / 1000 * self.output_usd_per_1k

    def api_key(self, environ: Mapping[str, str] | None = None) -> str:
        """The key for this target, read now; "" when the target declares no key source.

        A key file must be a regular file owned by you with no permissions for group or others,
        like ssh refuses a private key that others can read.
        """
        if self.api_key_env:
            key = (os.environ if environ is None else environ).get(self.api_key_env, "").strip()
            if not key:
                raise CloudAuthError(
                    f"target {self.name!r}: environment variable {self.api_key_env} is not set or empty; "
                    "export it or use api_key_file"
                )
            return key
        if self.api_key_file:
            return read_key_file(Path(self.api_key_file).expanduser(), self.name)
        return ""


def read_key_file(path: Path, target: str) -> str:
    """Read a key from a file that only its owner can read; refuse anything looser."""
    try:
        st = path.stat()
    except OSError as exc:
        raise CloudAuthError(f"target {target!r}: cannot read key file {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise CloudAuthError(f"target {target!r}: key file {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 or st.st_uid != os.getuid():
        raise CloudAuthError(
            f"target {target!r}: key file {path} has mode {mode:04o} or another owner; run `chmod 600 {path}`"
        )
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise CloudAuthError(f"target {target!r}: key file {path} is empty")
    return key


_FIELDS: dict[str, type] = {
    "name": str,
    "base_url": str,
    "model": str,
    "api_key_env": str,
    "api_key_file": str,
    "input_usd_per_1k": float,
    "output_usd_per_1k": float,
    "local": bool,
    "context": int,
}
_REQUIRED = ("name", "base_url", "model")


def parse_targets(raw: Any, origin: str) -> tuple[Target, ...]:
    """Validate ``router.targets`` as read from TOML; every error is one line naming file and key."""
    if not isinstance(raw, list):
        raise ConfigError(f"{origin}: router.targets must be a list of tables ([[router.targets]])")
    out: list[Target] = []
    seen: set[str] = set()
    for i, table in enumerate(raw):
        where = f"{origin}: router.targets[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table with name, base_url and model")
        for key in table:
            if key not in _FIELDS:
                raise ConfigError(f"{where}: unknown key {key!r}; allowed: {', '.join(_FIELDS)}")
        for key in _REQUIRED:
            if not isinstance(table.get(key), str) or not table[key].strip():
                raise ConfigError(f"{where}: {key} is required and must be a non-empty string")
        values: dict[str, Any] = {}
        for key, value in table.items():
            values[key] = _check(f"{where}.{key}", _FIELDS[key], value)
        name = values["name"]
        where = f"{origin}: router.targets[{i}] ({name})"
        if name in seen:
            raise ConfigError(f"{where}: a target named {name!r} is already declared; names must be unique")
        seen.add(name)
        url = urlsplit(values["base_url"])
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"{where}: base_url must be an http(s) URL, e.g. https://api.openai.com/v1")
        if url.password or url.username:
            raise ConfigError(f"{where}: base_url must not carry credentials; use api_key_env or api_key_file")
        if url.scheme == "http" and not is_loopback(values["base_url"]) and not values.get("local", False):
            raise ConfigError(f"{where}: a cloud target needs https (plain http is allowed for local = true only)")
        if values.get("api_key_env") and values.get("api_key_file"):
            raise ConfigError(f"{where}: give api_key_env or api_key_file, not both")
        for price in ("input_usd_per_1k", "output_usd_per_1k"):
            if values.get(price, 0.0) < 0:
                raise ConfigError(f"{where}: {price} must be >= 0")
        if values.get("context", 0) < 0:
            raise ConfigError(f"{where}: context must be >= 0 tokens")
        out.append(Target(**values))
    return tuple(out)


def _check(where: str, tp: type, value: Any) -> Any:
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(f"{where} must be {tp.__name__}, got {type(value).__name__} {value!r}")
    return float(value) if tp is float else value


_STRICTNESS = {mode: i for i, mode in enumerate(reversed(CLOUD_MODES))}  # never is strictest


def load_router(config: Config, cwd: Path | None = None) -> Policy:
    """The effective router policy: ``config``'s ``[router]`` keys plus the user file's targets.

    A value the repository's ``.jarvis.toml`` set can only make the policy stricter than what
    the user file (or the default) says: ``cloud`` takes the stricter mode; the spend cap and
    the two confidence thresholds the lower value (fewer answers count as unsure); ``offline``
    and ``never_leave`` stay on once on. Environment variables and flags are the person's own
    and apply as given. A repository file that declares targets is an error, not silently
    ignored, so nobody believes they are in use.
    """
    user_file = paths.user_config_file()
    user: Mapping[str, Any] = {}
    targets: tuple[Target, ...] = ()
    if user_file.is_file():
        router = read_toml(user_file).get("router", {})
        user = router if isinstance(router, dict) else {}
        if "targets" in user:
            targets = parse_targets(user["targets"], str(user_file))
    root = paths.find_workspace_root(cwd)
    if root is not None and (root / REPO_FILE).is_file():
        repo_router = read_toml(root / REPO_FILE).get("router", {})
        if isinstance(repo_router, dict) and "targets" in repo_router:
            raise ConfigError(
                f"{root / REPO_FILE}: router.targets is read only from your user file {user_file}: "
                "a repository may not choose where your code and keys go; move the targets there"
            )

    r = config.router

    def from_repo(key: str) -> bool:
        return config.source_of(f"router.{key}").startswith("repo file")

    cloud = r.cloud
    if from_repo("cloud"):
        below: CloudMode = next((m for m in CLOUD_MODES if m == user.get("cloud", "never")), "never")
        cloud = max(cloud, below, key=lambda m: _STRICTNESS[m])

    def lowest(key: str) -> float:
        """A number where lower leaves less often: the repo's value only when below the user's."""
        value = float(getattr(r, key))
        if from_repo(key):
            below = user.get(key, getattr(RouterConfig(), key))
            value = min(value, float(below)) if isinstance(below, int | float) else value
        return value

    offline = r.offline or (from_repo("offline") and bool(user.get("offline", False)))
    never_leave = r.never_leave or (from_repo("never_leave") and bool(user.get("never_leave", False)))
    return Policy(
        cloud=cloud,
        offline=offline,
        never_leave=never_leave,
        daily_spend_cap_usd=lowest("daily_spend_cap_usd"),
        low_confidence_logprob=lowest("low_confidence_logprob"),
        min_acceptance=lowest("min_acceptance"),
        preferred=r.target,
        targets=targets,
    )
