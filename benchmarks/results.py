"""What a benchmarks run finds: one cell per variant and group, start-up probes, the results.

A *group* is one workload at one rows-per-batch and one workers setting (the
variants and the grid are :mod:`benchmarks.grid`'s); its *winner* is the
contender with the lowest median (auto is judged against it, not a contender,
and neither is a first call or an estimated cell; the peers are contenders).

These are the figures and nothing made of them: what they say about auto is
:mod:`benchmarks.auto_vs_best`'s judgement, about prep against its peers
:mod:`benchmarks.alternatives`'s, and the table, the report, the summary and the
pictures are drawn from them by :mod:`~benchmarks.report`, :mod:`~benchmarks.summary`
and :mod:`~benchmarks.plots`. Each reads a Results; none is part of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from prep.executors import available_cores

from .grid import AUTO, AUTO_FIRST, FIRST_CALLS, PLAIN_JOBLIB, POOLS, label
from .peers import PEERS as PEER_NAMES

__all__ = ["SCHEMA", "Cell", "Results", "Startup"]

SCHEMA = "prep.bench/1"


@dataclass
class Cell:
    """One variant on one workload, rows per batch and workers: its figures or why none.

    ``status`` is ``ok``, ``failed`` (``note`` has the error) or ``skipped``
    (``note`` says why). Times are seconds per call of the whole batch;
    ``speedup`` is serial's median over this one; ``estimated`` cells were timed
    on fewer rows and scaled.
    """

    workload: str
    rows: int
    workers: int
    executor: str
    status: str
    median_s: float | None = None
    low_s: float | None = None
    high_s: float | None = None
    spread: float | None = None
    samples_s: list[float] = field(default_factory=list)
    rows_per_s: float | None = None
    speedup: float | None = None
    estimated: bool = False
    winner: bool = False
    breakdown: dict[str, float] = field(default_factory=dict)
    note: str = ""

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.workload, self.rows, self.workers)

    @property
    def contender(self) -> bool:
        """Whether it competes for the group's winner (auto, first calls and estimates do not)."""
        return self.executor != AUTO and self.executor not in FIRST_CALLS and not self.estimated

    @property
    def label(self) -> str:
        return label(self.executor)

    def add_breakdown(
        self,
        serial: float | None,
        sizes: tuple[int, int],
        startup: list[Startup],
        done: dict[str, Cell],
    ) -> None:
        """Where the time goes, as far as it can be seen from outside the executor.

        The executors report no dispatch/compute/transfer split, so: start-up is the
        probe's (a first call's: its excess over the warm median), compute is
        serial's time split evenly over the workers (an ideal),
        overhead is the rest, and bytes moved follow from each executor's design.
        """
        if self.status != "ok" or self.median_s is None:
            return
        parts: dict[str, float] = {}
        name, workers = self.executor, self.workers
        found = [s for s in startup if s.executor == name and s.workers == workers]
        if found and found[0].startup_s is not None:
            parts["startup_s"] = found[0].startup_s
            if serial is not None and self.median_s < serial:
                parts["calls_to_repay_startup"] = found[0].startup_s / (serial - self.median_s)
        if (name in (*POOLS, PLAIN_JOBLIB) or name in PEER_NAMES) and serial is not None:
            share = serial / min(workers, available_cores())  # more workers than cores share them
            parts["compute_est_s"] = share
            parts["overhead_est_s"] = self.median_s - share
        warm = done.get(FIRST_CALLS.get(name, ""))
        if warm is not None and warm.median_s is not None:
            # below the noise of the warm calls it comes out negative: call that nothing
            extra = max(0.0, self.median_s - warm.median_s)
            parts["calibration_s" if name == AUTO_FIRST else "startup_s"] = extra
        batch_bytes, out_bytes = sizes
        # processes copy into shared memory and back even with 1 worker; joblib pickles each
        # chunk once each way, but with n_jobs=1 runs in this process and moves nothing
        if name == "processes" or (name == "joblib" and workers > 1):
            parts["moved_mb"] = (batch_bytes + out_bytes) / 2**20
        elif name == PLAIN_JOBLIB and workers > 1:  # every row view pickles the whole batch
            parts["moved_mb"] = (self.rows * batch_bytes + out_bytes) / 2**20
        self.breakdown = parts

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["contender"] = self.contender
        d["label"] = self.label
        return _finite(d)


@dataclass(frozen=True)
class Startup:
    """A fresh ``prep.Pool``: its first call (start-up included) and its warm calls."""

    executor: str
    workers: int
    first_call_s: float | None
    warm_s: float | None
    error: str | None = None

    @property
    def startup_s(self) -> float | None:
        if self.first_call_s is None or self.warm_s is None:
            return None
        return max(0.0, self.first_call_s - self.warm_s)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "startup_s": self.startup_s}


@dataclass
class Results:
    """Everything one ``python -m benchmarks`` run found; ``to_dict()`` is ``results.json``."""

    environment: dict[str, Any]
    grid: dict[str, Any]
    workloads: dict[str, str]
    startup: list[Startup]
    cells: list[Cell]
    wall_s: float

    def groups(self) -> Iterator[tuple[tuple[str, int, int], list[Cell]]]:
        """``(workload, rows, workers) -> cells``, in the order they ran."""
        found: dict[tuple[str, int, int], list[Cell]] = {}
        for cell in self.cells:
            found.setdefault(cell.key, []).append(cell)
        yield from found.items()

    def mark_winners(self) -> None:
        """Set ``winner`` on the contender with the lowest median of each group."""
        for _, cells in self.groups():
            best = _best(cells)
            for cell in cells:
                cell.winner = cell is best

    def broken(self) -> list[tuple[str, int, int]]:
        """Groups whose workload itself failed: no cell ran, or serial raised (a workload
        skipped for a library missing here is not broken)."""
        return [
            key
            for key, cells in self.groups()
            if (
                all(c.status == "failed" for c in cells if c.status != "skipped")
                and any(c.status == "failed" for c in cells)
            )
            or any(c.executor == "serial" and c.status == "failed" for c in cells)
        ]

    def winner(self, key: tuple[str, int, int]) -> Cell | None:
        return next((c for c in self.cells if c.key == key and c.winner), None)

    def to_dict(self) -> dict[str, Any]:
        """Every figure as JSON types (what they add up to is the analyses' and the
        report's: :func:`benchmarks.report.write` adds them to results.json)."""
        found = {
            "schema": SCHEMA,
            "environment": self.environment,
            "grid": self.grid,
            "workloads": self.workloads,
            "wall_s": self.wall_s,
            "startup": [s.to_dict() for s in self.startup],
            "cells": [c.to_dict() for c in self.cells],
        }
        return _finite(found)


def _best(cells: list[Cell]) -> Cell | None:
    ok = [c for c in cells if c.status == "ok" and c.contender and c.median_s is not None]
    return min(ok, key=lambda c: c.median_s) if ok else None  # type: ignore[arg-type,return-value]


def _finite(value: Any) -> Any:
    """``value`` with inf/nan floats as None, so the JSON is standard."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
