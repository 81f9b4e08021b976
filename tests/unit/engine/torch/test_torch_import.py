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
# engine.backend = "torch" from the config: the daemon and the CLI open engines this way
from pathlib import Path
from openjarvis.config import load_config
from openjarvis.engine.pair import open_engine
try:
    open_engine(Path("model.gguf"), load_config(overrides={"engine.backend": "torch"}))
except EngineError as exc:
    print(exc)
"""


def test_imports_without_torch_and_names_the_extra() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    msg = ("the torch backend needs the gpu extra; run `pip install 'openjarvis[gpu]'` "
           'or set engine.backend = "llama"')
    assert out.stdout.splitlines() == [msg, msg]
