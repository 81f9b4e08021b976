"""The index end to end on a real repository no one here wrote, through the real entry point.

Uses the sources that ``scripts/bench_index.py --fetch`` downloads (rxjs from npm; its dist/
build output is skipped, ~270 files stay: enough for the process pool); skipped when they are
not on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# Read at import, before the autouse fixture points HOME into a temporary folder.
BENCH_CACHE = Path(os.environ.get("OPENJARVIS_BENCH_CACHE", str(Path.home() / ".cache" / "openjarvis-bench")))
RXJS = BENCH_CACHE / "rxjs" / "package"


def jarvis(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openjarvis", *argv], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.skipif(not RXJS.is_dir(), reason="run `python scripts/bench_index.py --fetch` first")
def test_index_and_search_rxjs_with_the_pool(scrubbed_env: Path) -> None:
    env = {**os.environ, "JARVIS_INDEX_WORKERS": "2"}
    built = jarvis("index", "--json", str(RXJS), env=env)
    assert built.returncode == 0, built.stderr
    summary = json.loads(built.stdout)
    assert summary["indexed"] > 200 and summary["errors"] == 0
    again = json.loads(jarvis("index", "--json", str(RXJS), env=env).stdout)
    assert (again["indexed"], again["deleted"]) == (0, 0)

    question = "subject that replays a buffer of old values to late subscribers"
    found = jarvis("search", question, "-k", "3", "--json", "-w", str(RXJS), env=env)
    hits = [json.loads(line) for line in found.stdout.splitlines()]
    assert (hits[0]["path"], hits[0]["symbol"]) == ("src/internal/ReplaySubject.ts", "ReplaySubject")
    found = jarvis("search", "debounceTime", "-k", "1", "--json", "-w", str(RXJS), env=env)
    assert json.loads(found.stdout)["path"] == "src/internal/operators/debounceTime.ts"
    where = jarvis("def", "switchMap", "-w", str(RXJS), env=env)
    assert where.stdout.startswith("src/internal/operators/switchMap.ts:")
