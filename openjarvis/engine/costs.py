"""Measured engine costs: seconds to evaluate k tokens at once, cached per (model, device, threads).

Speculation pays only when verifying k tokens costs much less than k single steps, and that ratio
is a property of the machine: about 2x a step for k=3 on a 2-core laptop CPU, about 1.2x for k=8 on
a GPU. So the speculator measures rather than assumes. On first use of a model with a given
device and thread count it times ``eval`` of k tokens for each k in ``MEASURED_KS`` (median of a
few runs, at a realistic cache position, then rolled back) and stores the table in
``$XDG_CACHE_HOME/openjarvis/costs.json``. Any change of model file, CPU, thread count or
backend changes the key and triggers a new measurement. A corrupt cache file is ignored.

An engine that can give argmaxes alone (``eval_argmax``: the torch engine) is timed the way a
greedy request, the default, runs it (``greedy_eval``): on a GPU a logits call costs 1.3x a
greedy one at k = 8 (BENCHMARKS.md, "Greedy calls"), so logits timings would price verifying
too high and the planner would draft too little. Such an engine keeps a second table for sampled
requests, timed through ``eval`` (``MeasuredCosts.sampled_cost_model``, measured the first time
one comes, under the key with ``|logits`` added).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from openjarvis import paths
from openjarvis.engine.base import CostModel, Engine, greedy_eval

#: Batch sizes timed; the speculator interpolates between them.
MEASURED_KS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 17)
#: Cache position the timings are taken at (attention cost grows with it; this is typical).
MEASURE_POSITION = 256
#: Timed runs per k; the median is kept.
REPEATS = 5
COSTS_FILE = "costs.json"
FORMAT = 1


class Measurable(Engine, Protocol):
    def cost_key(self) -> str: ...


def costs_path() -> Path:
    return paths.cache_dir() / COSTS_FILE


def measure(engine: Engine, key: str, ks: tuple[int, ...] = MEASURED_KS,
            greedy: bool | None = None) -> CostModel:
    """Time ``eval`` of k tokens for each k (``greedy_eval`` where ``greedy``, by default where
    the engine has ``eval_argmax``); the engine's cache is restored afterwards."""
    base = engine.n_past
    filler = [(7 + 13 * i) % max(1, min(engine.n_vocab, 200)) for i in range(MEASURE_POSITION + max(ks) + 1)]
    if greedy is None:
        greedy = hasattr(engine, "eval_argmax")
    room = engine.n_ctx - base - max(*ks, 8)  # (8: the warm-up below)
    pad = max(0, min(MEASURE_POSITION - base, room))
    try:
        if pad:
            engine.eval(filler[:pad], last_only=True)
        pos = engine.n_past
        call: Callable[[list[int]], object] = (
            (lambda toks: greedy_eval(engine, toks)) if greedy else engine.eval)
        call(filler[:8])  # warm-up: first use allocates buffers (and captures graphs)
        engine.rollback(pos)
        seconds: dict[int, float] = {}
        for k in ks:
            runs = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                call(filler[pad : pad + k])
                runs.append(time.perf_counter() - t0)
                engine.rollback(pos)
            runs.sort()
            seconds[k] = runs[len(runs) // 2]
    finally:
        engine.rollback(base)
    return CostModel(key=key, seconds=_monotone(seconds))


def _monotone(seconds: dict[int, float]) -> dict[int, float]:
    """Noise can make verify(k+1) < verify(k); a larger batch is never cheaper, so clamp."""
    out: dict[int, float] = {}
    best = 0.0
    for k in sorted(seconds):
        best = max(best, seconds[k])
        out[k] = best
    return out


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def cached(key: str, path: Path | None = None) -> CostModel | None:
    """The cached cost model for ``key``, or None when absent or malformed."""
    entry = _read(path or costs_path()).get(key)
    if not isinstance(entry, dict):
        return None
    try:
        seconds = {int(k): float(v) for k, v in entry["seconds"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if 1 not in seconds or any(v <= 0 for v in seconds.values()):
        return None
    return CostModel(key=key, seconds=seconds)


def store(cost: CostModel, path: Path | None = None) -> None:
    """Add or replace one entry (atomic rename; concurrent writers lose at most an entry)."""
    path = path or costs_path()
    entries = _read(path)
    entries[cost.key] = {"seconds": {str(k): v for k, v in cost.seconds.items()}, "at": time.time()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "entries": entries}, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def load_or_measure(engine: Measurable, sampled: bool = False) -> CostModel:
    """The engine's cached table, or one measured now and cached; ``sampled``: the table of
    calls that return logits, for an engine whose default table times greedy calls."""
    key = engine.cost_key() + ("|logits" if sampled else "")
    hit = cached(key)
    if hit is not None:
        return hit
    cost = measure(engine, key, greedy=False if sampled else None)
    with contextlib.suppress(OSError):
        store(cost)
    return cost


class MeasuredCosts:
    """``cost_model`` / ``set_cost_model`` for an engine with a ``cost_key``: measured on first
    use and cached on disk (``load_or_measure``), or pinned by a caller (tests, benchmarks)."""

    _cost: CostModel | None = None
    _sampled: CostModel | None = None

    def cost_model(self) -> CostModel:
        if self._cost is None:
            self._cost = load_or_measure(self)  # type: ignore[arg-type]  # engines are Measurable
        return self._cost

    def sampled_cost_model(self) -> CostModel:
        """The costs of calls that return logits (sampled requests): ``cost_model`` itself
        unless that table times greedy calls (an engine with ``eval_argmax``)."""
        if not hasattr(self, "eval_argmax"):
            return self.cost_model()
        if self._sampled is None:
            self._sampled = load_or_measure(self, sampled=True)  # type: ignore[arg-type]
        return self._sampled

    def set_cost_model(self, cost: CostModel, sampled: CostModel | None = None) -> None:
        """Pin the costs (``sampled``: of sampled requests; by default the same table)."""
        self._cost = cost
        self._sampled = sampled or cost
