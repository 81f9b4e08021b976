"""Where Open Jarvis keeps things on disk, following the XDG base directory spec.

Every path is derived from the environment at call time (not import time) so tests can point
``XDG_*`` at a temporary home. ``jarvis locate`` prints them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

APP = "openjarvis"


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var, "")
    # The spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / fallback


def config_dir() -> Path:
    """User configuration: ``config.toml`` and user model manifests."""
    return _xdg("XDG_CONFIG_HOME", ".config") / APP


def data_dir() -> Path:
    """Large durable data: model files, history and telemetry databases."""
    return _xdg("XDG_DATA_HOME", ".local/share") / APP


def cache_dir() -> Path:
    """Rebuildable data: measured cost models, prefix KV caches, workspace indexes."""
    return _xdg("XDG_CACHE_HOME", ".cache") / APP


def state_dir() -> Path:
    """Logs and other state worth keeping across restarts but not backing up."""
    return _xdg("XDG_STATE_HOME", ".local/state") / APP


def runtime_dir() -> Path:
    """Directory for the daemon socket: ``$XDG_RUNTIME_DIR/openjarvis`` or a private 0700 fallback."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / APP
    return Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"


def user_config_file() -> Path:
    return config_dir() / "config.toml"


def user_models_dir() -> Path:
    """User-registered model manifests (``jarvis models add``)."""
    return config_dir() / "models"


def models_dir() -> Path:
    """Where installed model files live, unless the config says otherwise."""
    return data_dir() / "models"


def socket_path() -> Path:
    return runtime_dir() / "daemon.sock"


def find_workspace_root(start: Path | None = None) -> Path | None:
    """The nearest enclosing directory with ``.git`` or ``.jarvis.toml``, or None."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".git").exists() or (candidate / ".jarvis.toml").is_file():
            return candidate
    return None


@dataclass(frozen=True, slots=True)
class Locations:
    """A snapshot of every location, for ``jarvis locate`` and ``jarvis doctor``."""

    config_file: Path
    user_models: Path
    models: Path
    data: Path
    cache: Path
    state: Path
    socket: Path

    @classmethod
    def current(cls) -> Locations:
        return cls(
            config_file=user_config_file(),
            user_models=user_models_dir(),
            models=models_dir(),
            data=data_dir(),
            cache=cache_dir(),
            state=state_dir(),
            socket=socket_path(),
        )
