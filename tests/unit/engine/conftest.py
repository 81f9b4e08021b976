"""Engines over the tiny GGUF models, opened per test and always closed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from openjarvis.engine.llama import LlamaEngine


@pytest.fixture
def verifier(tiny_verifier_path: Path) -> Iterator[LlamaEngine]:
    with LlamaEngine(tiny_verifier_path, context=1024, batch=64, threads=1) as engine:
        yield engine


@pytest.fixture
def drafter(tiny_drafter_path: Path) -> Iterator[LlamaEngine]:
    with LlamaEngine(tiny_drafter_path, context=1024, batch=64, threads=1) as engine:
        yield engine


@pytest.fixture
def other(tiny_other_path: Path) -> Iterator[LlamaEngine]:
    with LlamaEngine(tiny_other_path, context=1024, batch=64, threads=1) as engine:
        yield engine
