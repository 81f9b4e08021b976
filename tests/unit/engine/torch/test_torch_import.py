"""The package imports, and says what to install, on a machine without torch."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["torch"] = None  # as if the gpu extra were not installed
sys.modules["triton"] = None
import openjarvis.engine.torch as backend
from openjarvis.errors import EngineError
assert not backend.torch_available()
try:
    backend.load_engine("model.gguf")
except EngineError as exc:
    print(exc)
"""


def test_imports_without_torch_and_names_the_extra() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "the torch backend needs the gpu extra; run `pip install 'openjarvis[gpu]'`"
    )
