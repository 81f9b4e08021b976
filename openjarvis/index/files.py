"""Which files of a workspace the index reads, and which rule skipped each of the others.

Rules, checked in this order (the first that applies names the skip in ``jarvis index status``):

- ``vcs``, ``venv``, ``dependencies``, ``build``, ``cache``: built-in directory skips;
- ``gitignore``: ``.gitignore`` files at any depth and ``.git/info/exclude``;
- ``jarvisignore``: ``.jarvisignore`` files, same syntax, at any depth;
- ``secret``: names that usually hold secrets (``.env*``, ``*.pem``, ``*.key``, ``id_rsa*``, ...),
  never indexed, whatever the ignore files say;
- ``symlink``: links (a link's target inside the workspace is indexed under its own path; one
  pointing outside is never followed);
- ``binary``: known binary suffixes (a NUL byte in the content is caught when the file is read);
- ``too-large``: over ``index.max_file_kb``;
- ``bad-name``: names that are not valid UTF-8 (they cannot be stored or shown as text).

Example::

    scan = scan_workspace(Path("."), max_bytes=1 << 20)
    scan.files[0].path, dict(scan.skipped)   # ("README.md", {"vcs": 1, "secret": 2})
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".jj", ".bzr"})
DEPENDENCY_DIRS = frozenset({"node_modules", "bower_components", "vendor", "site-packages", ".bundle"})
VENV_DIRS = frozenset({".venv", "venv", ".virtualenv", ".tox", ".nox", ".conda"})
BUILD_DIRS = frozenset({"build", "dist", "target", "out", ".next", ".nuxt", ".eggs", "_build"})
CACHE_DIRS = frozenset({
    "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".cache", ".gradle", ".idea",
    ".hypothesis", ".parcel-cache", ".turbo", "coverage", "htmlcov",
})  # fmt: skip

SECRET_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", ".netrc", ".pgpass", ".npmrc", ".pypirc",
    "credentials", "credentials.*", "*credentials*.json", "*.tfstate", "secrets.y*ml",
    "service-account*.json", ".htpasswd",
)  # fmt: skip

BINARY_SUFFIXES = frozenset(
    (
        ".png .jpg .jpeg .gif .bmp .ico .webp .tiff .psd .pdf .zip .gz .tgz .bz2 .xz .zst .7z .rar "
        ".tar .jar .war .whl .egg .so .dylib .dll .exe .o .a .lib .obj .class .pyc .pyo .pyd .wasm "
        ".bin .dat .db .sqlite .sqlite3 .mo .woff .woff2 .ttf .otf .eot .mp3 .mp4 .wav .ogg .flac "
        ".avi .mov .mkv .webm .gguf .safetensors .pt .pth .onnx .npy .npz .pkl .parquet .ico .icns"
    ).split()
)


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A file the index should hold: path relative to the workspace root, in POSIX form."""

    path: str
    size: int
    mtime_ns: int


@dataclass(slots=True)
class Scan:
    files: list[FileEntry] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def is_secret(name: str) -> bool:
    """Whether a file name looks like it holds credentials or keys."""
    lower = name.lower()
    return any(fnmatch.fnmatchcase(lower, pattern) for pattern in SECRET_PATTERNS)


def _dir_rule(name: str, path: str) -> str | None:
    if name in VCS_DIRS:
        return "vcs"
    if name in VENV_DIRS or os.path.isfile(os.path.join(path, "pyvenv.cfg")):
        return "venv"
    if name in DEPENDENCY_DIRS:
        return "dependencies"
    if name in BUILD_DIRS or name.endswith(".egg-info"):
        return "build"
    if name in CACHE_DIRS:
        return "cache"
    return None


class _Ignores:
    """Stacked ignore files: the innermost file with a matching pattern decides (gitignore semantics)."""

    def __init__(self) -> None:
        self.layers: list[tuple[str, str, Any]] = []  # (dir prefix, rule, spec)

    def load(self, root: Path, rel_dir: str, filename: str, rule: str) -> bool:
        path = root / rel_dir / filename
        if not path.is_file():
            return False
        import pathspec

        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return False
        prefix = f"{rel_dir}/" if rel_dir else ""
        self.layers.append((prefix, rule, pathspec.GitIgnoreSpec.from_lines(lines)))
        return True

    def rule_for(self, rel_path: str, is_dir: bool) -> str | None:
        probe = rel_path + "/" if is_dir else rel_path
        for prefix, rule, spec in reversed(self.layers):
            if not probe.startswith(prefix):
                continue
            result = spec.check_file(probe[len(prefix) :])
            if result.include is True:
                return str(rule)
            if result.include is False:
                return None
        return None


def scan_workspace(root: Path, max_bytes: int, only: Iterable[str] | None = None) -> Scan:
    """Walk ``root`` applying the rules; with ``only``, judge just those relative paths."""
    root = root.resolve()
    scan = Scan()
    if only is not None:
        wanted = sorted(set(only))
        for rel in wanted:
            entry = _judge_path(root, rel, max_bytes, scan.skipped)
            if entry is not None:
                scan.files.append(entry)
        return scan
    ignores = _Ignores()
    ignores.load(root, ".git/info", "exclude", "gitignore")
    _walk(root, "", ignores, max_bytes, scan)
    scan.files.sort(key=lambda f: f.path)
    return scan


def _walk(root: Path, rel_dir: str, ignores: _Ignores, max_bytes: int, scan: Scan) -> None:
    pushed = ignores.load(root, rel_dir, ".gitignore", "gitignore")
    pushed_j = ignores.load(root, rel_dir, ".jarvisignore", "jarvisignore")
    try:
        entries = sorted(os.scandir(root / rel_dir if rel_dir else root), key=lambda e: e.name)
    except OSError:
        entries = []
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        if not _encodable(entry.name):
            scan.skipped["bad-name"] += 1
            continue
        if entry.is_symlink():
            scan.skipped["symlink"] += 1
            continue
        if entry.is_dir(follow_symlinks=False):
            rule = _dir_rule(entry.name, entry.path) or ignores.rule_for(rel, True)
            if rule:
                scan.skipped[rule] += 1
                continue
            _walk(root, rel, ignores, max_bytes, scan)
        elif entry.is_file(follow_symlinks=False):
            rule = ignores.rule_for(rel, False) or _file_rule(entry.name)
            if rule is None:
                st = entry.stat(follow_symlinks=False)
                if st.st_size > max_bytes:
                    rule = "too-large"
                else:
                    scan.files.append(FileEntry(rel, st.st_size, st.st_mtime_ns))
                    continue
            scan.skipped[rule] += 1
    if pushed_j:
        ignores.layers.pop()
    if pushed:
        ignores.layers.pop()


def _encodable(name: str) -> bool:
    """Names that are not valid UTF-8 (undecodable bytes on Linux) cannot be stored as text."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _file_rule(name: str) -> str | None:
    if is_secret(name):
        return "secret"
    dot = name.rfind(".")
    if dot > 0 and name[dot:].lower() in BINARY_SUFFIXES:
        return "binary"
    return None


def _judge_path(root: Path, rel: str, max_bytes: int, skipped: Counter[str]) -> FileEntry | None:
    """Apply every rule to one path (for the watcher); None if it is gone or skipped."""
    parts = rel.split("/")
    if not _encodable(rel):
        skipped["bad-name"] += 1
        return None
    ignores = _Ignores()
    ignores.load(root, ".git/info", "exclude", "gitignore")
    for i, name in enumerate(parts[:-1]):
        rel_dir = "/".join(parts[:i])
        ignores.load(root, rel_dir, ".gitignore", "gitignore")
        ignores.load(root, rel_dir, ".jarvisignore", "jarvisignore")
        sub = "/".join(parts[: i + 1])
        rule = _dir_rule(name, str(root / sub)) or ignores.rule_for(sub, True)
        if rule:
            skipped[rule] += 1
            return None
    rel_dir = "/".join(parts[:-1])
    ignores.load(root, rel_dir, ".gitignore", "gitignore")
    ignores.load(root, rel_dir, ".jarvisignore", "jarvisignore")
    path = root / rel
    if path.is_symlink():
        skipped["symlink"] += 1
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    if not path.is_file():
        return None
    rule = ignores.rule_for(rel, False) or _file_rule(parts[-1])
    if rule is None and st.st_size > max_bytes:
        rule = "too-large"
    if rule:
        skipped[rule] += 1
        return None
    return FileEntry(rel, st.st_size, st.st_mtime_ns)
