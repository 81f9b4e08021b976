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
    │   └── ContextOverflow      a prompt plus answer would not fit the model's context
    ├── CloudError               a request to a target (a cloud, or your own server) failed
    │   ├── CloudOffline         offline mode or never_leave forbids contacting that host
    │   ├── CloudAuthError       401/403 or a missing/unsafe key (names the variable or file)
    │   ├── CloudNotFound        404: wrong base_url or model name
    │   ├── CloudRateLimited     429 still, after the retries
    │   ├── CloudServerError     5xx still, after the retries
    │   ├── CloudUnavailable     cannot connect (refused, DNS, TLS)
    │   ├── CloudTimeout         no answer within the connect or read timeout
    │   └── CloudProtocolError   invalid JSON, an unexpected shape, a stream cut off
    ├── IndexStoreError          the workspace index cannot be opened or written
    │   ├── IndexNotBuilt        no index yet for this workspace (run `jarvis index`)
    │   ├── IndexCorrupt         the database file cannot be read (`jarvis index` rebuilds it)
    │   └── IndexPathError       a path given to the indexer is missing or not a directory
    ├── EditError                a proposed edit is malformed, ambiguous or unsafe (nothing changed)
    └── DaemonError              the daemon cannot start, be reached, or answered with an error
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


class ContextOverflow(EngineError):
    """The tokens to evaluate would not fit the context window (``engine.context``)."""


class CloudError(JarvisError):
    """A request to a router target failed; the message names the target and never its key."""


class CloudOffline(CloudError):
    """Offline mode (or ``router.never_leave``) forbids opening a connection to that host."""


class CloudAuthError(CloudError):
    """The target refused the key (401/403), or the key is missing or its file is unsafe."""


class CloudNotFound(CloudError):
    """404 from the target: its ``base_url`` or ``model`` is wrong."""


class CloudRateLimited(CloudError):
    """The target kept answering 429 after every retry."""


class CloudServerError(CloudError):
    """The target kept answering 5xx after every retry."""


class CloudUnavailable(CloudError):
    """No connection could be opened to the target (refused, DNS, TLS)."""


class CloudTimeout(CloudError):
    """The target did not connect or answer within the configured timeout."""


class CloudProtocolError(CloudError):
    """The target answered something that is not an OpenAI-compatible reply, or cut a stream off."""


class IndexStoreError(JarvisError):
    """The workspace index database cannot be opened, migrated or written."""


class IndexNotBuilt(IndexStoreError):
    """A query asked for the index of a workspace that has never been indexed."""


class IndexCorrupt(IndexStoreError):
    """The index database exists but SQLite cannot read it; ``jarvis index`` rebuilds it."""


class IndexPathError(IndexStoreError):
    """``jarvis index PATH`` was given a path that does not exist or is not a directory."""

    exit_code = 2


class EditError(JarvisError):
    """A proposed edit that cannot be applied as a whole; the message ends "nothing was changed"."""


class DaemonError(JarvisError):
    """The daemon cannot be started or reached, or a request to it failed.

    ``code`` is the protocol's error code when the daemon answered with one (see
    ``openjarvis.daemon.protocol.ErrorCode``), else None.
    """

    def __init__(self, message: str, code: int | None = None, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        #: The error object's ``data`` (e.g. ``{"needs_confirmation": true, ...}``), when any.
        self.data = data
