"""auto against the best executor of the registry, per group where auto ran.

Three figures a group, each a ratio to the best executor (the baselines are not
executors; the table still names the overall winner):

- ``auto_ratio``: warm auto's median over the best executor's median;
- ``auto_first_ratio``: auto's first call alone, calibration included, over the
  best executor's warm median;
- ``auto_calls_ratio``: a fresh pool's first ``calls`` calls (its measured first
  call, then warm auto's median for each later one), over the best executor's
  median for as many calls *plus* its pool's start-up (the start-up probe's):
  the way a pool is used, over a few batches. Medians on both sides, so one
  stray slow repeat moves neither.

:func:`summarize` adds, for each figure, the share of groups within
:data:`WITHIN` of the best.
"""

from __future__ import annotations

from typing import Any

from prep.registry import EXECUTORS as REGISTRY

from .grid import AUTO, AUTO_FIRST
from .results import Cell, Results

__all__ = ["WITHIN", "best_executor", "executors", "ratio", "share_within", "summarize"]

#: auto counts as a good pick when its time is within this factor of the winner's
WITHIN = 1.25


def summarize(results: Results) -> dict[str, Any]:
    """One entry per group where auto ran, and the share of them within ``WITHIN``."""
    starts = {(s.executor, s.workers): s.startup_s or 0.0 for s in results.startup}
    entries = [
        entry
        for key, cells in results.groups()
        if (entry := _entry(key, cells, starts)) is not None
    ]

    return {
        "threshold": WITHIN,
        "groups": entries,
        "auto_within": share_within(entries, "auto_ratio"),
        "auto_first_within": share_within(entries, "auto_first_ratio"),
        "auto_calls_within": share_within(entries, "auto_calls_ratio"),
    }


def share_within(entries: list[dict[str, Any]], field: str, limit: float = WITHIN) -> float | None:
    """The share of ``entries`` whose ``field`` (a ratio; None: not measured) is <= ``limit``."""
    ratios = [e[field] for e in entries if e[field] is not None]
    return sum(r <= limit for r in ratios) / len(ratios) if ratios else None


def executors(cells: list[Cell]) -> list[Cell]:
    """A group's cells of the registry's executors that have a time (auto and estimates aside)."""
    return [
        c
        for c in cells
        if c.status == "ok"
        and c.executor in REGISTRY
        and c.executor != AUTO
        and c.median_s is not None
        and not c.estimated
    ]


def best_executor(cells: list[Cell]) -> Cell | None:
    """The fastest of :func:`executors`; None where none has a time."""
    return min(executors(cells), key=lambda c: c.median_s or 0.0, default=None)


def _entry(
    key: tuple[str, int, int], cells: list[Cell], starts: dict[tuple[str, int], float]
) -> dict[str, Any] | None:
    """One group's figures (see the module docstring); None where auto or every executor
    is missing."""
    winner = next((c for c in cells if c.winner), None)
    by_name = {c.executor: c for c in cells if c.status == "ok"}
    execs = executors(cells)
    best = best_executor(execs)
    warm, first = by_name.get(AUTO), by_name.get(AUTO_FIRST)
    if best is None or not (warm or first):
        return None
    return {
        "workload": key[0],
        "rows": key[1],
        "workers": key[2],
        "winner": winner.executor if winner else None,
        "winner_s": winner.median_s if winner else None,
        "best": best.executor,
        "best_s": best.median_s,
        "auto_s": warm.median_s if warm else None,
        "auto_first_s": first.median_s if first else None,
        "auto_ratio": ratio(warm, best),
        "auto_first_ratio": ratio(first, best),
        **_calls(warm, first, execs, starts),
    }


def _calls(
    warm: Cell | None, first: Cell | None, execs: list[Cell], starts: dict[tuple[str, int], float]
) -> dict[str, Any]:
    """A fresh pool's first calls, auto's against the best executor's plus its start-up."""
    none = {"calls": None, "auto_calls_s": None, "best_calls_s": None, "auto_calls_ratio": None}
    if not (warm and first) or first.median_s is None or warm.median_s is None:
        return none
    calls = 1 + len(warm.samples_s)
    auto_calls = first.median_s + (calls - 1) * warm.median_s
    best_calls = min(
        starts.get((c.executor, c.workers), 0.0) + calls * (c.median_s or 0.0) for c in execs
    )
    return {
        "calls": calls,
        "auto_calls_s": auto_calls,
        "best_calls_s": best_calls,
        "auto_calls_ratio": auto_calls / best_calls if best_calls else None,
    }


def ratio(cell: Cell | None, best: Cell | None) -> float | None:
    """``cell``'s median over ``best``'s; None where either has no time."""
    if cell is None or best is None or cell.median_s is None or not best.median_s:
        return None
    return cell.median_s / best.median_s
