"""Which of an engine's calls a component makes: the tests that check a greedy request never
asks for logits rows, and that the planner's costs are timed the way requests run."""

from __future__ import annotations

from typing import Any

import pytest


def record_calls(engine: object, names: tuple[str, ...],
                 monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Wrap ``engine``'s methods ``names`` so each call is appended, as (name, how many tokens
    its first argument holds; 1 for a single token), to the list returned; the calls still run."""
    calls: list[tuple[str, int]] = []
    for name in names:
        real = getattr(engine, name)

        def spy(first: Any, *a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls.append((_name, len(first) if isinstance(first, list | tuple) else 1))
            return _real(first, *a, **k)

        monkeypatch.setattr(engine, name, spy)
    return calls
