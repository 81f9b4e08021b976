"""Open Jarvis: a local-first AI coding assistant.

The package root stays light on purpose: ``jarvis --help`` and ``import openjarvis`` must not
pull in llama.cpp, torch or tree-sitter. Heavy parts are imported where they are used.
"""

from __future__ import annotations

from openjarvis.errors import JarvisError

__version__ = "0.1.0"

__all__ = ["JarvisError", "__version__"]
