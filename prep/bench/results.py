"""What ``prep bench`` measures and what it finds: the grid, one cell per variant, the results.

A *variant* is a way to run a workload: an executor of the registry, ``auto``
(warm), ``auto_first`` (its first call, calibration included), or one of two
baselines people write without prep: ``loop`` (a Python loop and
``torch.stack``) and ``plain_joblib`` (``joblib.Parallel`` over row views).
A *group* is one workload at one rows-per-batch and one workers setting; its
*winner* is the contender with the lowest median (auto is judged against it,
not a contender, and neither is an estimated cell).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ..executors import REGISTRY, available_cores
from .workloads import WORKLOADS, Workload

__all__ = [
    "AUTO",
    "AUTO_FIRST",
    "LABELS",
    "LOOP",
    "PLAIN_JOBLIB",
    "POOLS",
    "Cell",
    "Grid",
    "Results",
    "Startup",
    "breakdown",
    "label",
    "uses_workers",
    "variants",
]

AUTO, AUTO_FIRST, LOOP, PLAIN_JOBLIB = "auto", "auto_first", "loop", "plain_joblib"
#: executors that start threads or processes, whose start-up is measured apart
POOLS = ("threads", "processes", "joblib")
LABELS = {
    AUTO_FIRST: "auto (first call, calibration included)",
    LOOP: "loop + torch.stack",
    PLAIN_JOBLIB: "plain joblib.Parallel",
}
#: auto counts as a good pick when its time is within this factor of the winner's
WITHIN = 1.25
SCHEMA = "prep.bench/1"

DEFAULT_WORKLOADS = (
    "noop",
    "tokenize",
    "python",
    "matmul",
    "sleep",
    "side_context_small",
    "side_context",
)
QUICK_WORKLOADS = ("python", "tokenize", "side_context_small", "sleep")


def variants() -> tuple[str, ...]:
    """Every name ``executors=`` accepts: the registry, ``auto`` and the two baselines."""
    return (*(n for n in REGISTRY if n != AUTO), AUTO, LOOP, PLAIN_JOBLIB)


def default_workers() -> tuple[int, ...]:
    """1 (every executor's fixed cost, alone) and one worker per core."""
    return tuple(sorted({1, available_cores()}))


def label(name: str) -> str:
    """How a variant is named in tables and pictures."""
    return LABELS.get(name, name)


def uses_workers(name: str) -> bool:
    """Whether the variant's time depends on the workers setting (serial's does not)."""
    return name in (*POOLS, PLAIN_JOBLIB, AUTO, AUTO_FIRST)


@dataclass(frozen=True)
class Grid:
    """Which workloads, variants, rows per batch and workers to time, and how often.

    ``workloads`` are names of :data:`prep.bench.workloads.WORKLOADS` or
    :class:`~prep.bench.workloads.Workload` objects; ``timeout`` bounds each call
    of a prep executor (seconds; None, the default, as in ``map_rows``).
    """

    workloads: tuple[str | Workload, ...] = DEFAULT_WORKLOADS
    executors: tuple[str, ...] = field(default_factory=variants)
    rows: tuple[int, ...] = (16, 64, 256)
    workers: tuple[int, ...] = field(default_factory=default_workers)
    repeat: int = 5
    # None, as users call map_rows: a timeout changes how some executors run (joblib warms
    # its workers first), so it would time something users do not get
    timeout: float | None = None

    @classmethod
    def quick(cls, **changes: Any) -> Grid:
        """A grid that finishes in well under a minute on 2 cores: a smoke test."""
        settings: dict[str, Any] = {
            "workloads": QUICK_WORKLOADS,
            "rows": (8, 64),
            "workers": (min(2, available_cores()),),
            "repeat": 2,
        }
        return cls(**{**settings, **changes})

    def __post_init__(self) -> None:
        for name in ("workloads", "executors", "rows", "workers"):
            value = getattr(self, name)
            if isinstance(value, (str, Workload)) or not isinstance(value, Sequence):
                raise ConfigError(f"Grid({name}={value!r}) needs a list or tuple")
            if not value:
                raise ConfigError(f"Grid({name}=()) is empty; give at least one")
            object.__setattr__(self, name, tuple(value))
        known = variants()
        bad = [e for e in self.executors if e not in known]
        if bad:
            raise ConfigError(
                f"executors {', '.join(map(repr, bad))} unknown; choose from {', '.join(known)}"
            )
        bad = [w for w in self.workloads if not isinstance(w, Workload) and w not in WORKLOADS]
        if bad:
            raise ConfigError(
                f"workloads {', '.join(map(repr, bad))} unknown; choose from "
                f"{', '.join(WORKLOADS)}, or give your own with --fn and --batch"
            )
        for name in ("rows", "workers"):
            bad = [
                n
                for n in getattr(self, name)
                if isinstance(n, bool) or not isinstance(n, int) or n < 1
            ]
            if bad:
                raise ConfigError(f"{name} {bad} are not positive integers; e.g. {name}=(16, 64)")
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 1:
            raise ConfigError(f"repeat={self.repeat!r} is not a positive integer; e.g. repeat=5")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"timeout={self.timeout!r} must be > 0 seconds, or None")

    def resolved(self) -> list[Workload]:
        """The workloads as objects, in order."""
        return [w if isinstance(w, Workload) else WORKLOADS[w] for w in self.workloads]

    def to_dict(self) -> dict[str, Any]:
        return {
            "workloads": [w.name for w in self.resolved()],
            "executors": list(self.executors),
            "rows": list(self.rows),
            "workers": list(self.workers),
            "repeat": self.repeat,
            "timeout_s": self.timeout,
        }


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
        """Whether it competes for the group's winner (auto and estimates do not)."""
        return self.executor not in (AUTO, AUTO_FIRST) and not self.estimated

    @property
    def label(self) -> str:
        return label(self.executor)

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
    """Everything one ``prep bench`` run found; ``to_dict()`` is ``results.json``."""

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
        """Groups whose workload itself failed: no cell ran, or serial raised."""
        return [
            key
            for key, cells in self.groups()
            if all(c.status != "ok" for c in cells)
            or any(c.executor == "serial" and c.status == "failed" for c in cells)
        ]

    def winner(self, key: tuple[str, int, int]) -> Cell | None:
        return next((c for c in self.cells if c.key == key and c.winner), None)

    def auto_summary(self) -> dict[str, Any]:
        """auto against the best executor of the registry, per group where it ran.

        Three figures, each a ratio to the best executor (the baselines are not
        executors; the table still names the overall winner):

        - ``auto_ratio``: warm auto's median over the best executor's median;
        - ``auto_first_ratio``: auto's first call alone, calibration included,
          over the best executor's warm median;
        - ``auto_calls_ratio``: a fresh pool's first ``calls`` calls (its measured
          first call, then warm auto's median for each later one), over the best
          executor's median for as many calls *plus* its pool's start-up (the
          start-up probe's): the way a pool is used, over a few batches. Medians
          on both sides, so one stray slow repeat moves neither.
        """
        entries = []
        starts = {(s.executor, s.workers): s.startup_s or 0.0 for s in self.startup}
        for key, cells in self.groups():
            winner = next((c for c in cells if c.winner), None)
            by_name = {c.executor: c for c in cells if c.status == "ok"}
            execs = [
                c
                for c in by_name.values()
                if c.executor in REGISTRY
                and c.executor != AUTO
                and c.median_s is not None
                and not c.estimated
            ]
            warm, first = by_name.get(AUTO), by_name.get(AUTO_FIRST)
            if not execs or not (warm or first):
                continue
            best = min(execs, key=lambda c: c.median_s or 0.0)
            entry = {
                "workload": key[0],
                "rows": key[1],
                "workers": key[2],
                "winner": winner.executor if winner else None,
                "winner_s": winner.median_s if winner else None,
                "best": best.executor,
                "best_s": best.median_s,
                "auto_s": warm.median_s if warm else None,
                "auto_first_s": first.median_s if first else None,
                "auto_ratio": _ratio(warm, best),
                "auto_first_ratio": _ratio(first, best),
                "calls": None,
                "auto_calls_s": None,
                "best_calls_s": None,
                "auto_calls_ratio": None,
            }
            if warm and first and first.median_s is not None and warm.median_s is not None:
                calls = 1 + len(warm.samples_s)
                auto_calls = first.median_s + (calls - 1) * warm.median_s
                best_calls = min(
                    starts.get((c.executor, c.workers), 0.0) + calls * (c.median_s or 0.0)
                    for c in execs
                )
                entry.update(
                    calls=calls,
                    auto_calls_s=auto_calls,
                    best_calls_s=best_calls,
                    auto_calls_ratio=auto_calls / best_calls if best_calls else None,
                )
            entries.append(entry)

        def within(field_name: str) -> float | None:
            ratios = [e[field_name] for e in entries if e[field_name] is not None]
            return sum(r <= WITHIN for r in ratios) / len(ratios) if ratios else None

        return {
            "threshold": WITHIN,
            "groups": entries,
            "auto_within": within("auto_ratio"),
            "auto_first_within": within("auto_first_ratio"),
            "auto_calls_within": within("auto_calls_ratio"),
        }

    def to_dict(self) -> dict[str, Any]:
        return _finite(
            {
                "schema": SCHEMA,
                "environment": self.environment,
                "grid": self.grid,
                "workloads": self.workloads,
                "wall_s": self.wall_s,
                "startup": [s.to_dict() for s in self.startup],
                "cells": [c.to_dict() for c in self.cells],
                "auto": self.auto_summary(),
            }
        )


def breakdown(
    cell: Cell,
    serial: float | None,
    sizes: tuple[int, int],
    startup: list[Startup],
    done: dict[str, Cell],
) -> None:
    """Where the time goes, as far as it can be seen from outside the executor.

    The executors report no dispatch/compute/transfer split, so: start-up is the
    probe's, compute is serial's time split evenly over the workers (an ideal),
    overhead is the rest, and bytes moved follow from each executor's design.
    """
    if cell.status != "ok" or cell.median_s is None:
        return
    parts: dict[str, float] = {}
    name, workers = cell.executor, cell.workers
    found = [s for s in startup if s.executor == name and s.workers == workers]
    if found and found[0].startup_s is not None:
        parts["startup_s"] = found[0].startup_s
        if serial is not None and cell.median_s < serial:
            parts["calls_to_repay_startup"] = found[0].startup_s / (serial - cell.median_s)
    if name in (*POOLS, PLAIN_JOBLIB) and serial is not None:
        share = serial / min(workers, available_cores())  # more workers than cores share them
        parts["compute_est_s"] = share
        parts["overhead_est_s"] = cell.median_s - share
    if name == AUTO_FIRST and done.get(AUTO) and done[AUTO].median_s is not None:
        # below the noise of the warm calls it comes out negative: call that nothing
        parts["calibration_s"] = max(0.0, cell.median_s - done[AUTO].median_s)  # type: ignore[operator]
    batch_bytes, out_bytes = sizes
    # processes copy into shared memory and back even with 1 worker; joblib pickles each
    # chunk once each way, but with n_jobs=1 runs in this process and moves nothing
    if name == "processes" or (name == "joblib" and workers > 1):
        parts["moved_mb"] = (batch_bytes + out_bytes) / 2**20
    elif name == PLAIN_JOBLIB and workers > 1:  # every row view pickles the whole batch
        parts["moved_mb"] = (cell.rows * batch_bytes + out_bytes) / 2**20
    cell.breakdown = parts


def _best(cells: list[Cell]) -> Cell | None:
    ok = [c for c in cells if c.status == "ok" and c.contender and c.median_s is not None]
    return min(ok, key=lambda c: c.median_s) if ok else None  # type: ignore[arg-type,return-value]


def _ratio(cell: Cell | None, best: Cell) -> float | None:
    if cell is None or cell.median_s is None or not best.median_s:
        return None
    return cell.median_s / best.median_s


def _finite(value: Any) -> Any:
    """``value`` with inf/nan floats as None, so the JSON is standard."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
