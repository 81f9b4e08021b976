"""Skip this directory cleanly where the gpu extra (torch) is not installed."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "engine/torch" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
