"""Which files are indexed, and which rule skipped the others."""

from __future__ import annotations

import os
from pathlib import Path

from openjarvis.index.files import is_secret, scan_workspace


def write(root: Path, rel: str, content: str | bytes = "x = 1\n") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def test_rules_and_counts(workspace: Path, tmp_path: Path) -> None:
    write(workspace, "app.py")
    write(workspace, "README.md", "# hi\n")
    write(workspace, ".gitignore", "*.log\ngenerated/\n")
    write(workspace, "debug.log")
    write(workspace, "generated/out.py")
    write(workspace, "pkg/.gitignore", "local_*.py\n!local_keep.py\n")
    write(workspace, "pkg/local_tmp.py")
    write(workspace, "pkg/local_keep.py")
    write(workspace, "pkg/mod.py")
    write(workspace, ".jarvisignore", "fixtures/\n")
    write(workspace, "fixtures/big.json", "{}")
    write(workspace, "node_modules/lib/index.js")
    write(workspace, ".venv/lib/site.py")
    write(workspace, "myenv/pyvenv.cfg", "home = /usr\n")
    write(workspace, "build/lib/app.py")
    write(workspace, "__pycache__/app.cpython-311.pyc", b"\0\0")
    write(workspace, ".env", "TOKEN=1\n")
    write(workspace, ".env.production", "TOKEN=2\n")
    write(workspace, "deploy/server.pem", "-----BEGIN-----\n")
    write(workspace, "keys/id_rsa", "secret\n")
    write(workspace, "logo.png", b"\x89PNG")
    write(workspace, "huge.txt", "a" * 5000)
    outside = write(tmp_path, "elsewhere/notes.py")
    os.symlink(outside, workspace / "linked.py")

    scan = scan_workspace(workspace, max_bytes=4096)

    assert [f.path for f in scan.files] == [
        ".gitignore", ".jarvisignore", "README.md", "app.py",
        "pkg/.gitignore", "pkg/local_keep.py", "pkg/mod.py",
    ]  # fmt: skip
    assert dict(scan.skipped) == {
        "vcs": 1, "gitignore": 3, "jarvisignore": 1, "dependencies": 1, "venv": 2, "build": 1,
        "cache": 1, "secret": 4, "binary": 1, "too-large": 1, "symlink": 1,
    }  # fmt: skip


def test_only_judges_the_given_paths(workspace: Path) -> None:
    write(workspace, ".gitignore", "*.log\n")
    write(workspace, "a.py")
    write(workspace, "b.log")
    write(workspace, "node_modules/x.js")
    write(workspace, ".env")
    scan = scan_workspace(workspace, 4096, only=["a.py", "b.log", "node_modules/x.js", ".env", "gone.py"])
    assert [f.path for f in scan.files] == ["a.py"]
    assert dict(scan.skipped) == {"gitignore": 1, "dependencies": 1, "secret": 1}


def test_secret_names() -> None:
    secrets = [".env", ".env.local", "prod.env", "id_ed25519.pub", "cert.PEM", "credentials.json", ".netrc"]
    assert all(is_secret(n) for n in secrets)
    assert not any(is_secret(n) for n in ["environment.py", "keys.py", "README.md", "envelope.txt"])


def test_names_that_are_not_utf8_are_skipped(workspace: Path) -> None:
    write(workspace, "good.py")
    with open(os.path.join(os.fsencode(workspace), b"bad-\xff.py"), "wb") as fh:
        fh.write(b"x = 1\n")
    scan = scan_workspace(workspace, 4096)
    assert [f.path for f in scan.files] == ["good.py"]
    assert scan.skipped["bad-name"] == 1
