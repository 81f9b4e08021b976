"""``python -m openjarvis`` runs the same CLI as ``jarvis``."""

from __future__ import annotations

from openjarvis.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
