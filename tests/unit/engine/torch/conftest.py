"""Skip the torch tests cleanly where the gpu extra (torch) is not installed; mark them ``gpu``."""

from __future__ import annotations

import importlib.util

import pytest

NEEDS_TORCH = ["test_torch_model.py", "test_torch_kernels.py", "test_torch_weights.py",
               "test_torch_engine.py", "test_torch_speculative.py", "test_cuda_step.py",
               "test_on_gpu.py", "test_bench_scripts.py"]

if importlib.util.find_spec("torch") is None:
    collect_ignore = NEEDS_TORCH


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in NEEDS_TORCH:
            item.add_marker(pytest.mark.gpu)
