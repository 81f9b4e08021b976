"""Redaction: what it takes out, what it leaves alone, and two properties (idempotent, no leaks)."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openjarvis.router.redact import is_secret_name, known_secrets_from_env, redact

B62 = string.ascii_letters + string.digits
URLSAFE = B62 + "-_"

EXAMPLES = [
    ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx\n", "OPENAI_API_KEY=[REDACTED:openai_key]\n", "openai_key"),
    (
        'Anthropic(api_key="sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123")',
        'Anthropic(api_key="[REDACTED:anthropic_key]")',
        "anthropic_key",
    ),
    ("id AKIAIOSFODNN7EXAMPLE here", "id [REDACTED:aws_access_key] here", "aws_access_key"),
    (
        "git clone https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/a/b",
        "git clone https://[REDACTED:github_token]@github.com/a/b",
        "github_token",
    ),
    ("t = github_pat_11ABCDEFG0123456789_abcdefghijkl", "t = [REDACTED:github_token]", "github_token"),
    ("SLACK xoxb-123456789012-abcdefABCDEF", "SLACK [REDACTED:slack_token]", "slack_token"),
    ('key: "AIzaSyA1234567890abcdefghijklmnopqrstuv"', 'key: "[REDACTED:google_api_key]"', "google_api_key"),
    ("stripe.api_key = sk_live_4eC39HqLyjWDarjtT1zdp7dc", "stripe.api_key = [REDACTED:stripe_key]", "stripe_key"),
    (
        "Cookie: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "Cookie: [REDACTED:jwt]",
        "jwt",
    ),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\nok",
        "[REDACTED:private_key]\nok",
        "private_key",
    ),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA (truncated paste", "[REDACTED:private_key]", "private_key"),
    (
        "postgres://admin:hunter2@db.internal:5432/app",
        "postgres://admin:[REDACTED:url_password]@db.internal:5432/app",
        "url_password",
    ),
    ("Authorization: Bearer abcdefghijklmnop.1234", "Authorization: Bearer [REDACTED:bearer_token]", "bearer_token"),
    ("HF_HUB=hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "HF_HUB=[REDACTED:huggingface_token]", "huggingface_token"),
    ("remote glpat-xxxxxxxxxxxxxxxxxxxx1234", "remote [REDACTED:gitlab_token]", "gitlab_token"),
    ("//registry.npmjs.org/:_auth npm_" + "a1B2" * 9, "//registry.npmjs.org/:_auth [REDACTED:npm_token]", "npm_token"),
    ("pw pypi-AgEIcHlwaS5vcmc" + "x9Y8" * 14, "pw [REDACTED:pypi_token]", "pypi_token"),
    (
        "SG.abcdefghijklmnopqrstuv.ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefg",
        "[REDACTED:sendgrid_key]",
        "sendgrid_key",
    ),
    ("DB_PASSWORD=swordfish\n", "DB_PASSWORD=[REDACTED:secret_assignment]\n", "secret_assignment"),
    (
        'DB_PASSPHRASE="correct horse battery staple"',
        'DB_PASSPHRASE="[REDACTED:secret_assignment]"',
        "secret_assignment",
    ),
    (
        "export GITLAB_TOKEN=glpat-xyz123abc\n",
        "export GITLAB_TOKEN=[REDACTED:secret_assignment]\n",
        "secret_assignment",
    ),
    ("password: correct-horse\n", "password: [REDACTED:secret_assignment]\n", "secret_assignment"),
    ("password: hunter_22\n", "password: [REDACTED:secret_assignment]\n", "secret_assignment"),
    ("password: Winter2024\n", "password: [REDACTED:secret_assignment]\n", "secret_assignment"),
    ('{"client_secret": "abc123def"}', '{"client_secret": "[REDACTED:secret_assignment]"}', "secret_assignment"),
    ("dbPassword = 'letmein!'", "dbPassword = '[REDACTED:secret_assignment]'", "secret_assignment"),
    ("salt 9fKx2LmQ8vRt4WzN7bHj3YpS6cGd1TaE5uVo", "salt [REDACTED:high_entropy]", "high_entropy"),
]


@pytest.mark.parametrize(("text", "expected", "kind"), EXAMPLES, ids=[e[2] + str(i) for i, e in enumerate(EXAMPLES)])
def test_takes_out_each_kind(text: str, expected: str, kind: str) -> None:
    r = redact(text)
    assert r.text == expected
    assert r.counts == {kind: 1}


ORDINARY = [
    # Python that talks about secrets without containing any.
    'token = request.headers["Authorization"]\napi_key = os.environ["OPENAI_API_KEY"]\n',
    "password = getpass.getpass()\nSECRET_KEY = settings.SECRET_KEY\nauth = f'Bearer {token}'\n",
    'max_tokens: int = _doc("Upper bound on tokens generated per answer.", 1024)\ntokenizer = "qwen2"\n',
    "def check_password(password: str) -> bool:\n    return hmac.compare_digest(hash_(password), stored)\n",
    "if token_type == 'bearer':\n    pass\nAUTHOR = 'Jane Doe'\n",
    'password_help = "Enter the password you chose when you signed up"\n',
    "def f(token: object, password: str, SecretStr: str,\n       api_key: Token) -> None: ...\n",
    'bos_token = "<|im_start|>"\nstart_token = "class "\n',
    "e.g. `https://user:pass@host:port/path` or smb://workgroup;user:password@server/share\n",
    "conn(key_password=None, token=self.token,\n     password=key_password,\n)\n",
    'token.tag = "strong"\nToken: "#d8dee9",\n',
    "alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_'\n",
    # Identifiers, paths and URLs.
    "class AbstractSingletonProxyFactoryBeanImpl2:\n    pass\n",
    "test_route_sends_to_the_preferred_target_when_asked_v2()\n",
    "see https://github.com/openjarvis/openjarvis/blob/4f3a9c2e1b7d8f6a5c4b3a2e1d0f9c8b7a6e5d4c/README.md\n",
    "/home/me/src/openjarvis/tests/unit/router/test_redact_property_based_v2.py\n",
    "https://user@example.com/path and ssh://git@github.com:22/a/b.git\n",
    # Lockfiles and digests: kept by design (see the module docstring).
    'checksum = "ff0ab6f0a3b2c9c05ef3d9d42a86e3d1e4c7a1d0f1c0b2e1d7e37ad9d6f3e8c0"\n',
    "requests==2.32.3 --hash=sha256:70761cfe03c773ceb22aa2f671b4757976145175cdfca038c02654d061d6dcc6\n",
    '"integrity": "sha512-Vp2K9wqCzrqAqEvKV3XBlwrbdpwpcjsYHDc7+KU1dL7M5eqpuUe3b4KuYxjVsLZzVdqwAGbM8CWsQ1ZxFA7M5Q=="\n',
    "github.com/pkg/errors v0.9.1 h1:FEBLx1zS214owpjy7qsBeixbURkuhQAwrK5UwLGTwt4=\n",
    "id = 123e4567-e89b-12d3-a456-426614174000\ncommit 1467019a5e0c3b3c2f1d4e5a6b7c8d9e0f1a2b3c\n",
    # Placeholders and references in config.
    'api_key = "OPENAI_API_KEY"\nsecret = "~/.config/openjarvis/openai.key"\ntoken: /run/secrets/token\n',
    "API_KEY=${OPENAI_API_KEY}\npassword: <your password here>\ntoken: xxxx\nSECRET={{ vault.secret }}\n",
    "DB_PASSWORD=\nAPI_TOKEN=\n",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_leaves_ordinary_code_alone(text: str) -> None:
    r = redact(text)
    assert r.counts == {} and r.text == text


def test_random_base62_and_urlsafe_secrets_are_caught_by_entropy() -> None:
    rng = random.Random(20261130)
    planted = ["".join(rng.choice(B62) for _ in range(40)) for _ in range(300)]
    # Shaped like secrets.token_urlsafe(32) (43 characters of the URL-safe alphabet), but drawn
    # from the seeded generator: an unseeded draw made this test fail about once in 500 runs.
    planted += ["".join(rng.choice(URLSAFE) for _ in range(43)) for _ in range(100)]
    missed = [s for s in planted if s in redact(f"value: {s}\n").text]
    # Statistical by nature: a random string with no digit (about 1 in 1,500 of these) or that
    # happens to look like words is kept; see the module docstring. Seeded, so this is one fixed
    # sample: it shows the detector's miss rate on it, and fails only if the detector changes.
    assert len(missed) <= 1, missed


def test_known_secrets_are_removed_wherever_they_appear() -> None:
    env = {"MY_SERVICE_TOKEN": "plain-words-but-secret", "PATH": "/usr/bin:/bin", "SHORT_TOKEN": "abc"}
    known = known_secrets_from_env(env)
    assert known == ("plain-words-but-secret",)
    r = redact("log: auth with plain-words-but-secret failed; PATH=/usr/bin:/bin", known)
    assert r.text == "log: auth with [REDACTED:known_secret] failed; PATH=/usr/bin:/bin"
    assert r.counts == {"known_secret": 1}


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("API_KEY", True),
        ("dbPassword", True),
        ("client-secret", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("auth_token", True),
        ("max_tokens", False),
        ("tokenizer", False),
        ("author", False),
        ("sort_key", False),
        ("keyboard", False),
        ("api_key_env", False),
        ("password_file", False),
        ("token_type", False),
        ("bos_token", False),
        ("pad_token_secret", True),
        ("settings.API_KEY", True),
        ("token.tag", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


# Properties. Provider secrets are generated in each provider's own alphabet and planted in
# arbitrary text, separated by something that can sit next to a secret in real files.

_alnum = st.text(alphabet=B62, min_size=1)


def _fixed(prefix: str, alphabet: str, size: int) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=size, max_size=size + 20).map(lambda body: prefix + body)


PLANTED = st.one_of(
    _fixed("sk-", B62 + "_-", 24),
    _fixed("sk-proj-", B62 + "_-", 40),
    _fixed("sk-ant-api03-", B62 + "_-", 40),
    st.text(alphabet=string.ascii_uppercase + string.digits, min_size=16, max_size=16).map(lambda b: "AKIA" + b),
    _fixed("ghp_", B62, 36),
    _fixed("github_pat_", B62 + "_", 40),
    _fixed("xoxb-", B62 + "-", 24),
    st.text(alphabet=B62 + "_-", min_size=35, max_size=35).map(lambda b: "AIza" + b),
    _fixed("sk_live_", B62, 24),
    _fixed("hf_", B62, 34),
    _fixed("glpat-", B62 + "_-", 20),
    _fixed("npm_", B62, 36),
)
SEPARATORS = st.sampled_from([" ", "\n", "'", '"', "=", ": ", "(", ",", "\t", "`"])
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(before=TEXT, sep1=SEPARATORS, secret=PLANTED, sep2=SEPARATORS, after=TEXT)
def test_a_planted_provider_secret_never_survives(before: str, sep1: str, secret: str, sep2: str, after: str) -> None:
    r = redact(before + sep1 + secret + sep2 + after)
    assert secret not in r.text
    assert r.total >= 1


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.one_of(TEXT, PLANTED, SEPARATORS, st.sampled_from([e[0] for e in EXAMPLES] + ORDINARY)), max_size=8
    )
)
def test_redaction_is_idempotent(parts: list[str]) -> None:
    once = redact("".join(parts))
    twice = redact(once.text)
    assert twice.text == once.text
    assert twice.counts == {}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("unit", ["a", "a.", "a=", "a:", "https://a", "Bearer ", "eyJa.", "API_KEY=x\n", "a = ", "ab/"])
def test_adversarial_input_takes_linear_time(unit: str) -> None:
    # A quadratic regex here takes minutes on 200 kB (it did, before names got a left boundary).
    text = unit * (200_000 // len(unit))
    assert redact(redact(text).text).counts == {}
