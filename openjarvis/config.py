"""Typed, layered settings: defaults < user file < repo ``.jarvis.toml`` < ``JARVIS_*`` < flags.

One frozen dataclass per section; every field has a default and a ``doc`` in its metadata, which
``jarvis config show`` prints. Loading validates everything and fails with one line naming the
file (or variable), the key and what is allowed, rather than letting a typo silently fall back
to a default.

Environment variables are ``JARVIS_<SECTION>_<KEY>`` in upper case, e.g. ``JARVIS_ENGINE_THREADS=2``;
flags are ``jarvis -c engine.threads=2``.

Example::

    cfg = load_config(overrides={"engine.threads": "2"})
    cfg.engine.threads            # 2
    cfg.source_of("engine.threads")  # "flag -c engine.threads"
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from openjarvis import paths
from openjarvis.errors import ConfigError

ENV_PREFIX = "JARVIS_"
REPO_FILE = ".jarvis.toml"
#: Keys holding lists of tables, read and validated by their owner rather than here.
RESERVED_KEYS = frozenset({"router.targets"})  # openjarvis/router/targets.py


def _doc(text: str, default: Any) -> Any:
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True, slots=True)
class ModelsConfig:
    pair: str = _doc("Catalog id of the drafter+verifier pair used for generation.", "qwen2.5-coder")
    drafter: str = _doc("Model id overriding the pair's drafter; empty keeps the pair's.", "")
    verifier: str = _doc("Model id overriding the pair's verifier; empty keeps the pair's.", "")
    dir: str = _doc("Where installed model files live; empty means $XDG_DATA_HOME/openjarvis/models.", "")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    backend: Literal["llama", "torch"] = _doc(
        "Inference backend: llama.cpp on CPU/Metal, or the torch GPU backend.", "llama"
    )
    threads: int = _doc("CPU threads for inference; 0 means the number of physical cores.", 0)
    context: int = _doc("Context window in tokens given to each model.", 8192)
    batch: int = _doc("Tokens evaluated per llama.cpp batch during prefill.", 512)
    gpu_layers: int = _doc("Layers offloaded to a GPU by llama.cpp (0 = CPU only, -1 = all).", 0)
    flash_attn: bool = _doc("Use llama.cpp flash attention (changes results slightly).", False)
    prefix_cache: bool = _doc(
        "Keep the KV state of the prompt's stable head (system prompt + repository map) on disk.", True
    )
    deterministic: bool = _doc(
        "Torch backend on a GPU: bit-identical results from run to run (no split-K float atomics); "
        "one-token steps ~4-8% slower, verify steps ~50% slower.",
        False,
    )
    drafter_backend: Literal["same", "llama", "torch"] = _doc(
        "Backend of the drafter model: same (as engine.backend), llama (llama.cpp on the CPU, "
        "e.g. beside a torch verifier on a GPU too small for both; slower where both fit: "
        "BENCHMARKS.md) or torch.",
        "same",
    )


#: The default of ``generation.loop_repeats``, and of ``Request.loop_repeats`` for callers that
#: build a request without the config (benchmarks, tests): one number, here.
LOOP_REPEATS = 4


@dataclass(frozen=True, slots=True)
class GenerationConfig:
    temperature: float = _doc("Sampling temperature; 0 means greedy.", 0.0)
    top_k: int = _doc("Sample only among the k most likely tokens (0 = no limit).", 0)
    top_p: float = _doc("Nucleus sampling mass (1.0 = no limit).", 1.0)
    max_tokens: int = _doc("Upper bound on tokens generated per answer.", 1024)
    drafter: Literal["auto", "model", "ngram", "none"] = _doc(
        "Speculative drafter: auto picks per step from measured costs.", "auto"
    )
    prompt_budget: int = _doc(
        "Most prompt tokens of context (code, map, history) per question; a 2-core CPU prefills ~150/s.", 2048
    )
    loop_repeats: int = _doc(
        "Stop an answer that ends in the same block of lines, or the same span within a line, "
        "written this many times in a row (a span in fenced code: four times as many; "
        "0 = never).", LOOP_REPEATS
    )


@dataclass(frozen=True, slots=True)
class IndexConfig:
    max_file_kb: int = _doc("Files larger than this are skipped by the indexer.", 1024)
    workers: int = _doc("Parser processes for indexing; 0 means one per core.", 0)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    cloud: Literal["never", "ask", "auto"] = _doc(
        "Whether a request may leave this machine: never (default), ask, or auto by policy.", "never"
    )
    offline: bool = _doc("Never open a connection to a non-loopback address.", False)
    never_leave: bool = _doc(
        "Nothing from this workspace goes beyond this machine (put it in the repo's .jarvis.toml).", False
    )
    target: str = _doc("Preferred [[router.targets]] entry by name; empty tries them in file order.", "")
    daily_spend_cap_usd: float = _doc("Most US dollars spent on paid targets per local day; 0 = free only.", 1.0)
    low_confidence_logprob: float = _doc(
        "A local answer whose mean token log-probability is below this counts as unsure.", -1.2
    )
    min_acceptance: float = _doc("A local answer whose draft acceptance rate is below this counts as unsure.", 0.0)


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    idle_unload_minutes: float = _doc("Unload models after this many idle minutes (0 = never).", 15.0)


@dataclass(frozen=True, slots=True)
class Config:
    """The effective configuration plus where each value came from."""

    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    #: "section.key" -> human description of the layer that set it ("default" if none did).
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The files that were read, in precedence order.
    files: tuple[Path, ...] = ()

    def source_of(self, key: str) -> str:
        return self.sources.get(key, "default")

    def get(self, key: str) -> Any:
        section, name = _split_key(key, origin="key")
        return getattr(getattr(self, section), name)

    def items(self) -> list[tuple[str, Any, str]]:
        """Every setting as (``section.key``, value, source), in declaration order."""
        out = []
        for section, cls in SECTIONS.items():
            for f in dataclasses.fields(cls):
                key = f"{section}.{f.name}"
                out.append((key, self.get(key), self.source_of(key)))
        return out


SECTIONS: dict[str, type] = {
    f.name: typing.get_type_hints(Config)[f.name]
    for f in dataclasses.fields(Config)
    if f.name not in ("sources", "files")
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One declared setting: its type, default and documentation."""

    key: str
    type: Any
    default: Any
    doc: str

    def describe_type(self) -> str:
        choices = _choices(self.type)
        if choices:
            return " | ".join(repr(c) for c in choices)
        return getattr(self.type, "__name__", str(self.type))


def settings() -> dict[str, Setting]:
    """Every declared setting by ``section.key``."""
    out: dict[str, Setting] = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            out[key] = Setting(key, hints[f.name], f.default, f.metadata.get("doc", ""))
    return out


def _choices(tp: Any) -> tuple[Any, ...]:
    return tuple(typing.get_args(tp)) if typing.get_origin(tp) is Literal else ()


def _split_key(key: str, *, origin: str) -> tuple[str, str]:
    section, _, name = key.partition(".")
    if section not in SECTIONS:
        raise ConfigError(f"{origin}: unknown section {section!r}; allowed sections: {', '.join(SECTIONS)}")
    names = [f.name for f in dataclasses.fields(SECTIONS[section])]
    if name not in names:
        raise ConfigError(f"{origin}: unknown key {key!r}; allowed keys in [{section}]: {', '.join(names)}")
    return section, name


def _check_typed(setting: Setting, value: Any, origin: str) -> Any:
    """Validate a value that already has a TOML type."""
    tp = setting.type
    choices = _choices(tp)
    if choices:
        if value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{origin}: {setting.key} = {value!r} is not allowed; use one of {allowed}")
        return value
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(
            f"{origin}: {setting.key} must be {setting.describe_type()}, got {type(value).__name__} {value!r}"
        )
    return float(value) if tp is float else value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_text(setting: Setting, text: str, origin: str) -> Any:
    """Parse a value given as text (environment, flag, ``config set``) into the setting's type."""
    tp = setting.type
    raw = text.strip()
    try:
        if tp is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError(raw)
        if tp is int:
            return int(raw)
        if tp is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"{origin}: {setting.key} must be {setting.describe_type()}, got {text!r}") from None
    return _check_typed(setting, raw, origin)


def read_toml(path: Path) -> dict[str, Any]:
    """Read one config file; a syntax error names the file and the position."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}; fix the file or remove it") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc


def _apply_file(values: dict[str, Any], sources: dict[str, str], path: Path, label: str) -> None:
    data = read_toml(path)
    known = settings()
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a [section] table")
        for name, value in table.items():
            key = f"{section}.{name}"
            if key in RESERVED_KEYS:
                continue
            _split_key(key, origin=str(path))
            values[key] = _check_typed(known[key], value, str(path))
            sources[key] = f"{label} {path}"


def _env_key(var: str) -> str | None:
    """``JARVIS_ENGINE_THREADS`` -> ``engine.threads``; None for variables of other sections."""
    rest = var[len(ENV_PREFIX) :].lower()
    for section in SECTIONS:
        if rest.startswith(section + "_"):
            return f"{section}.{rest[len(section) + 1 :]}"
    return None


def load_config(
    cwd: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    repo_file: bool = True,
) -> Config:
    """Build the effective configuration for a run started in ``cwd``.

    ``repo_file=False`` leaves out every repository's ``.jarvis.toml``: what the daemon, which
    serves many repositories, uses for its own process-wide settings.
    """
    env = os.environ if env is None else env
    known = settings()
    values: dict[str, Any] = {k: s.default for k, s in known.items()}
    sources: dict[str, str] = {}
    files: list[Path] = []

    user_file = paths.user_config_file()
    if user_file.is_file():
        _apply_file(values, sources, user_file, "user file")
        files.append(user_file)
    root = paths.find_workspace_root(cwd) if repo_file else None
    if root is not None and (root / REPO_FILE).is_file():
        _apply_file(values, sources, root / REPO_FILE, "repo file")
        files.append(root / REPO_FILE)

    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        key = _env_key(var)
        if key is None:
            continue
        _split_key(key, origin=f"environment variable {var}")
        values[key] = parse_text(known[key], env[var], f"environment variable {var}")
        sources[key] = f"env {var}"

    for key, text in (overrides or {}).items():
        _split_key(key, origin=f"flag -c {key}")
        values[key] = parse_text(known[key], text, f"flag -c {key}")
        sources[key] = f"flag -c {key}"

    sections: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        kwargs = {f.name: values[f"{section}.{f.name}"] for f in dataclasses.fields(cls)}
        sections[section] = cls(**kwargs)
    return Config(**sections, sources=types.MappingProxyType(sources), files=tuple(files))


def set_user_value(key: str, text: str, path: Path | None = None) -> Path:
    """Validate and write one value into the user file, keeping its comments and layout."""
    import tomlkit

    path = path or paths.user_config_file()
    section, name = _split_key(key, origin="jarvis config set")
    value = parse_text(settings()[key], text, "jarvis config set")
    if path.is_file():
        read_toml(path)  # refuse to rewrite a file we cannot parse
        doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    else:
        doc = tomlkit.document()
        doc.add(tomlkit.comment("Open Jarvis user configuration; `jarvis config show` explains each key."))
    table = doc.get(section)
    if table is None:
        table = tomlkit.table()
        doc[section] = table
    table[name] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomlkit.dumps(doc), encoding="utf-8")
    os.replace(tmp, path)
    return path
