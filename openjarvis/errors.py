"""Every exception Open Jarvis raises on purpose, in one tree.

Each message is one line a person can act on: what went wrong and what to do next. Third-party
errors are mapped to the most specific class here at the boundary (``raise ... from exc``), so
callers catch ours, never llama.cpp's or httpx's.

    JarvisError
    ├── ConfigError              bad TOML, unknown key, wrong type (names file and key)
    ├── ModelError
    │   ├── CatalogError         a manifest that does not parse or misses a field
    │   ├── UnknownModel         an id that no manifest declares
    │   ├── ModelNotInstalled    declared, but no verified file on disk
    │   ├── SourceUnavailable    no source can provide the bytes here (says what to run)
    │   ├── ChecksumMismatch     assembled or downloaded bytes differ from the manifest
    │   ├── InsufficientDisk     not enough free space for an install
    │   └── IncompatiblePair     drafter and verifier tokenizers differ
    ├── EngineError              a model failed to load or evaluate
    └── IndexStoreError          the workspace index cannot be opened or written
"""

from __future__ import annotations


class JarvisError(Exception):
    """Base of every error we raise on purpose; the CLI prints its message as one line."""

    exit_code: int = 1


class ConfigError(JarvisError):
    """Configuration that cannot be loaded: the message names the file, the key and the fix."""

    exit_code = 2


class ModelError(JarvisError):
    """Something about a model in the catalog or on disk."""


class CatalogError(ModelError):
    """A manifest in ``models/`` or the user's catalog that is malformed."""


class UnknownModel(ModelError):
    """An id (or pair id) that no manifest declares."""


class ModelNotInstalled(ModelError):
    """The catalog knows the model but its verified file is not on disk."""


class SourceUnavailable(ModelError):
    """None of a model's sources can provide its bytes on this machine right now."""


class ChecksumMismatch(ModelError):
    """Bytes on disk (or just assembled) do not match the manifest's sha256 or size."""


class InsufficientDisk(ModelError):
    """An install would not fit in the free space of the models directory."""


class IncompatiblePair(ModelError):
    """Two models cannot pair for speculative decoding (their tokenizers differ)."""


class EngineError(JarvisError):
    """An inference engine failed to load a model or to evaluate tokens."""


class IndexStoreError(JarvisError):
    """The workspace index database cannot be opened, migrated or written."""
