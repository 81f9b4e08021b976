"""Fixtures for the index tests: a small real workspace and an open store on it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from openjarvis.config import IndexConfig
from openjarvis.index.indexer import index_workspace
from openjarvis.index.store import Store, db_path_for

LANGUAGES = Path(__file__).resolve().parents[2] / "fixtures" / "languages"


@pytest.fixture
def sample_repo(workspace: Path) -> Path:
    """The workspace with every language fixture copied in, under ``src/<lang>/``."""
    for sample in sorted(LANGUAGES.glob("*/sample.*")):
        dest = workspace / "src" / sample.parent.name / sample.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sample, dest)
    return workspace


@pytest.fixture
def store(sample_repo: Path) -> Iterator[Store]:
    """An index of ``sample_repo``, built in-process."""
    with Store.open(db_path_for(sample_repo)) as s:
        index_workspace(s, sample_repo, IndexConfig(workers=1))
        yield s

