"""Secrets out before any byte leaves: ``redact(text) -> Redaction(text, counts)``.

Everything the cloud client sends goes through :func:`redact` first. Each secret is replaced by a
placeholder naming its kind, ``[REDACTED:github_token]``, so the remote model still sees that a
value was there, and the counts per kind go into the audit log.

What is found, in this order (earlier rules win where two overlap):

- known secrets: exact values the caller passes (the target's own key, secret-named variables of
  the environment, see :func:`known_secrets_from_env`);
- private key blocks (``-----BEGIN ... PRIVATE KEY-----`` to its END line, or to the end of the
  text when the END line is missing);
- provider formats: OpenAI ``sk-...``, Anthropic ``sk-ant-...``, AWS access key ids ``AKIA...``,
  GitHub ``ghp_/gho_/ghu_/ghs_/ghr_`` and ``github_pat_``, Slack ``xox?-``, Google ``AIza...``,
  Stripe ``sk_live_/sk_test_/rk_live_``, Hugging Face ``hf_``, GitLab ``glpat-``, npm ``npm_``,
  PyPI ``pypi-AgE...``, SendGrid ``SG.x.y``, JWTs, ``Bearer`` tokens;
- passwords in URLs (``scheme://user:PASSWORD@host``: only the password goes);
- assignments to secret-looking names: ``API_KEY=...``, ``password: ...``, ``"token": "..."``
  (.env, YAML, TOML, JSON, source code); the name stays, the value goes;
- high-entropy strings: runs of 32+ base64/base62 characters that mix letters and digits and
  whose Shannon entropy per character is near that of random text (:data:`ENTROPY_BITS`).

The tradeoffs, chosen on purpose:

- Hex strings are never high-entropy here: hex tops out at 4 bits per character, below the
  threshold, so git SHAs, sha256 sums in lockfiles (Cargo.lock, uv.lock, pip ``--hash``), UUIDs
  and our own model catalog pass unchanged. A secret that is pure hex (some vendors' 32-hex keys)
  is only caught when it is assigned to a secret-looking name.
- Base64 digests with a digest prefix (``sha512-...`` SRI integrity in package-lock/yarn/pnpm,
  Nix ``sha256-...``, go.sum ``h1:...``) are kept; other long base64 blobs (embedded images,
  certificates) are redacted: the remote model loses nothing it could use.
- Long identifiers made of words (``AbstractSingletonProxyFactoryBean2``) are not random, and a
  path or URL is judged segment by segment, so only a random segment of its own goes.
- The entropy rule is statistical: a random 40-character base62 secret is caught with
  probability above 99.9%; a random string 32 long, about 99.5%. Provider formats and secret
  names catch the common keys deterministically.
- Source code that assigns a bare identifier to a secret-looking name (``token = token_value``)
  is kept; uppercase names, ``NAME=value`` without spaces and ``name: value`` (env, INI, YAML)
  lose their value. Code shapes are kept: keyword arguments (``token=None,``), annotations
  (``token: Token``, so a YAML ``password: Winter`` is kept too), attributes (``token.tag = ...``:
  the last dotted part decides), tokenizer vocabulary (``bos_token``), doc placeholders
  (``user:password@host``).

Redaction is idempotent (placeholders are never matched again and the rules run to a fixpoint),
which the property tests check along with "a planted secret never survives".

Example::

    r = redact("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx\\n")
    r.text     # "OPENAI_API_KEY=[REDACTED:openai_key]\\n"
    r.counts   # {"openai_key": 1}
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

PLACEHOLDER = "[REDACTED:{kind}]"
_PLACEHOLDER_RE = re.compile(r"\[REDACTED:[a-z_]+\]")

#: Minimum length of a high-entropy candidate.
ENTROPY_MIN_LEN = 32
#: Bits per character a candidate needs; the bound is lowered for short strings, whose empirical
#: entropy cannot reach it (a string of n distinct characters has at most log2(n) bits per char).
ENTROPY_BITS = 4.3
#: How far below log2(len) a short random string's entropy typically falls.
ENTROPY_SHORT_SLACK = 0.9
#: Share of characters in runs of 3+ lowercase letters above which a string reads as words
#: (``AbstractSingletonProxyFactoryBean2``); random base62 stays under it 99.9% of the time.
WORDY_SHARE = 0.6
#: Environment values shorter than this are not treated as known secrets (too many collisions).
KNOWN_SECRET_MIN_LEN = 8


@dataclass(frozen=True, slots=True)
class Redaction:
    """Redacted text and how many secrets of each kind were taken out of it."""

    text: str
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Secrets taken out, all kinds together."""
        return sum(self.counts.values())


def placeholder(kind: str) -> str:
    """What a secret of ``kind`` becomes: ``[REDACTED:kind]``, never matched by any rule."""
    return PLACEHOLDER.format(kind=kind)


# Provider formats. Prefixes are distinctive, so the left boundary only excludes characters of
# the same token; bodies take the provider's whole alphabet so a longer key is covered entirely.
_PROVIDERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("anthropic_key", re.compile(r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}")),
    ("openai_key", re.compile(r"(?<![A-Za-z0-9_-])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}")),
    ("aws_access_key", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("github_token", re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("slack_token", re.compile(r"(?<![A-Za-z0-9_-])xox[abposre]-[A-Za-z0-9-]{10,}")),
    ("slack_webhook", re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9_/]+")),
    ("google_api_key", re.compile(r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}")),
    ("stripe_key", re.compile(r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}")),
    ("jwt", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")),
    ("huggingface_token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}")),
    ("gitlab_token", re.compile(r"(?<![A-Za-z0-9_-])glpat-[A-Za-z0-9_-]{20,}")),
    ("npm_token", re.compile(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36,}")),
    ("pypi_token", re.compile(r"(?<![A-Za-z0-9_-])pypi-AgE[A-Za-z0-9_-]{50,}")),
    ("sendgrid_key", re.compile(r"(?<![A-Za-z0-9_-])SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}")),
)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?(?:-----END[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)", re.S
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]{16,})")
_URL_PASSWORD = re.compile(r"((?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"<>\[\]]+:)([^\s@/'\"<>]+)(@)")
_QUOTED_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<close>[\"']?)(?P<sep>\s*(?:=>|:=|[:=])\s*)"
    r"(?P<q>[\"'])(?P<value>[^\"'\n]{4,})(?P=q)"
)
_BARE_ASSIGNMENT = re.compile(
    r"^(?P<lead>[ \t]*(?:export[ \t]+)?)(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>[ \t]*[=:][ \t]*)"
    r"(?P<value>[^\s\"'#]{4,})(?P<tail>[ \t]*(?:#.*)?)$",
    re.M,
)
_ENTROPY_CANDIDATE = re.compile(
    rf"(?<![A-Za-z0-9+/_=-])[A-Za-z0-9+/_-]{{{ENTROPY_MIN_LEN},}}={{0,2}}(?![A-Za-z0-9+/_=-])"
)
_DIGEST_PREFIX = re.compile(r"(?:sha1|sha256|sha384|sha512|md5)-")
_HEX = re.compile(r"[0-9a-fA-F-]+")
_WORD = re.compile(r"[a-z]{3,}")
_PATH_SEGMENT = re.compile(r"[a-z][a-z0-9_.-]{2,}")

_SECRET_WORDS = frozenset(
    {
        "secret",
        "token",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "credential",
        "credentials",
        "apikey",
        "authorization",
        "bearer",
        "privatekey",
    }
)
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("access", "key"),
        ("private", "key"),
        ("secret", "key"),
        ("signing", "key"),
        ("encryption", "key"),
        ("master", "key"),
        ("client", "secret"),
        ("auth", "token"),
    }
)
#: Last name parts that make a secret-looking name describe a secret rather than hold one.
_ABOUT_A_SECRET = frozenset(
    {"env", "file", "path", "dir", "name", "type", "url", "header", "field", "label", "prompt", "help", "hint"}
    | {"length", "len", "count", "size", "id", "ttl", "expiry", "expires"}
)
_VOCABULARY_TOKENS = frozenset(
    {"bos", "eos", "eot", "unk", "sep", "cls", "mask", "pad", "start", "end", "stop", "special", "fim", "begin"}
    | {"next", "prev", "first", "last", "image", "audio"}
)
_NOT_A_VALUE = re.compile(
    r"""(?x)
    ^(?:\$|%\(|%s$|\{\{|<.*>$|\*+$|[xX]+$|\.\.\.|\[REDACTED:)  # references, templates, masks, placeholders
    | ^(?i:true|false|null|none|nil|yes|no|undefined)$        # literals
    | ^(?i:password|passwd|pass|pwd|pw|secret|token|mypassword|your[_-]?password|placeholder)$  # doc examples
    | ^\#[0-9A-Fa-f]{3,8}$                                   # a colour: Token: "#d8dee9"
    | ,$                                                     # an argument: f(token=None, key_password=x,
    | ^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+$  # dotted attribute: settings.API_KEY
    | ^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$                        # the name of a variable: OPENAI_API_KEY
    | ^(?:~|\.{1,2})?/[\w./-]*$                              # a path: ~/.config/openjarvis/key
    | [()\[\]{}]                                            # calls, indexing
    """
)
#: A value after ``name:`` that is a type annotation in source code, not a YAML value.
_TYPE_ANNOTATION = re.compile(r"(?:str|int|bytes|object|bool|float|dict|list|tuple|set|[A-Z][a-z]+(?:[A-Z][a-z]+)*),?")
_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_SECRET_ENV = re.compile(r"(?i)(secret|token|passw|api_?key|access_?key|private_?key|credential)")


def is_secret_name(name: str) -> bool:
    """True for names like ``API_KEY``, ``dbPassword``, ``client-secret``; false for ``max_tokens``."""
    name = name.rsplit(".", 1)[-1]  # token.tag, settings.API_KEY: the attribute decides
    parts = [p.lower() for p in _NAME_SPLIT.split(name) if p]
    if not parts or parts[-1] in _ABOUT_A_SECRET:
        return False
    for i, part in enumerate(parts):
        if part == "token" and i and parts[i - 1] in _VOCABULARY_TOKENS:
            continue  # bos_token, pad_token: a tokenizer's vocabulary, not a credential
        if part in _SECRET_WORDS:
            return True
    return any(pair in _SECRET_PAIRS for pair in zip(parts, parts[1:], strict=False))


def shannon_bits(text: str) -> float:
    """Shannon entropy in bits per character of ``text`` taken as a sample of its own characters."""
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values()) if n else 0.0


def _looks_random(token: str) -> bool:
    body = token.rstrip("=")
    if _HEX.fullmatch(body):
        return False  # digests, git SHAs, UUIDs: see the module docstring
    if not (any(c.isdigit() for c in body) and any(c.isalpha() for c in body)):
        return False
    if sum(len(w) for w in _WORD.findall(body)) >= WORDY_SHARE * len(body):
        return False  # identifiers made of words
    if sum(ord(b) - ord(a) == 1 for a, b in zip(body, body[1:], strict=False)) >= len(body) / 2:
        return False  # an alphabet: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    threshold = min(ENTROPY_BITS, math.log2(len(body)) - ENTROPY_SHORT_SLACK)
    return shannon_bits(body) >= threshold


def known_secrets_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Values of secret-named environment variables (``*_TOKEN``, ``*_API_KEY``...), longest first.

    A key the person exported for some other tool can end up in a pasted log or a generated file;
    passing these to :func:`redact` removes them wherever they appear, whatever their format.
    """
    values = {
        v.strip()
        for k, v in environ.items()
        if _SECRET_ENV.search(k) and len(v.strip()) >= KNOWN_SECRET_MIN_LEN and "\n" not in v.strip()
    }
    return tuple(sorted(values, key=len, reverse=True))


class _Pass:
    """One pass over the text, counting per kind; placeholders are never counted twice."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def hide(self, kind: str) -> str:
        self.counts[kind] += 1
        return placeholder(kind)

    def whole(self, kind: str) -> Callable[[re.Match[str]], str]:
        def fn(m: re.Match[str]) -> str:
            return m.group(0) if _PLACEHOLDER_RE.fullmatch(m.group(0)) else self.hide(kind)

        return fn


def _one_pass(text: str, known: tuple[str, ...], p: _Pass) -> str:
    for secret in known:
        if secret in text:
            p.counts["known_secret"] += text.count(secret)
            text = text.replace(secret, placeholder("known_secret"))
    text = _PRIVATE_KEY.sub(p.whole("private_key"), text)
    for kind, pattern in _PROVIDERS:
        text = pattern.sub(p.whole(kind), text)

    def bearer(m: re.Match[str]) -> str:
        return m.group(0) if m.group(2).startswith("[REDACTED") else m.group(1) + p.hide("bearer_token")

    text = _BEARER.sub(bearer, text)

    def url_password(m: re.Match[str]) -> str:
        if _PLACEHOLDER_RE.fullmatch(m.group(2)) or _NOT_A_VALUE.search(m.group(2)):
            return m.group(0)
        return m.group(1) + p.hide("url_password") + m.group(3)

    text = _URL_PASSWORD.sub(url_password, text)

    def quoted(m: re.Match[str]) -> str:
        value = m.group("value")
        if not is_secret_name(m.group("name")) or _NOT_A_VALUE.search(value):
            return m.group(0)
        q = m.group("q")
        return f"{m.group('name')}{m.group('close')}{m.group('sep')}{q}{p.hide('secret_assignment')}{q}"

    text = _QUOTED_ASSIGNMENT.sub(quoted, text)

    def bare(m: re.Match[str]) -> str:
        name, sep, value = m.group("name"), m.group("sep"), m.group("value")
        env_style = name.isupper() or ":" in sep or sep == "=" or not value.isidentifier()
        if not env_style or not is_secret_name(name) or _NOT_A_VALUE.search(value):
            return m.group(0)
        if ":" in sep and (value.endswith(",") or _TYPE_ANNOTATION.fullmatch(value)):
            return m.group(0)  # ``token: object,`` in a signature
        return f"{m.group('lead')}{name}{sep}{p.hide('secret_assignment')}{m.group('tail')}"

    text = _BARE_ASSIGNMENT.sub(bare, text)

    def entropy(m: re.Match[str]) -> str:
        token = m.group(0)
        before = m.string[max(0, m.start() - 3) : m.start()]
        if _DIGEST_PREFIX.match(token) or before == "h1:":
            return token
        segments = token.split("/")
        if sum(bool(_PATH_SEGMENT.fullmatch(seg)) for seg in segments) >= 2:  # a path or URL: judge its parts
            return "/".join(
                p.hide("high_entropy") if len(seg) >= ENTROPY_MIN_LEN and _looks_random(seg) else seg
                for seg in segments
            )
        return p.hide("high_entropy") if _looks_random(token) else token

    return _ENTROPY_CANDIDATE.sub(entropy, text)


def redact(text: str, known: Iterable[str] = ()) -> Redaction:
    """Replace every secret found in ``text`` by a placeholder and count them by kind.

    ``known`` are exact values to remove wherever they appear (the target's key, values of
    secret-named environment variables); each must be at least :data:`KNOWN_SECRET_MIN_LEN` long.
    """
    usable = {k for k in known if len(k) >= KNOWN_SECRET_MIN_LEN and k not in placeholder("known_secret")}
    known_values = tuple(sorted(usable, key=len, reverse=True))
    total: Counter[str] = Counter()
    # Run to a fixpoint, so that redacting a redacted text finds nothing more. A pass can reveal a
    # secret glued to the previous one (its left boundary was a secret's last character). It ends:
    # every replacement removes characters that are not part of a placeholder, which never matches.
    while True:
        p = _Pass()
        new = _one_pass(text, known_values, p)
        total.update(p.counts)
        if new == text:
            break
        text = new
    return Redaction(text, dict(sorted(total.items())))
