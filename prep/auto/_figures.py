"""What ``auto`` knows about one signature: the figures measured on its first batch,
the batches observed since, and what they cost (:class:`Figures`), with the log
of what happened to them (:class:`EventLog`). The decisions taken from them are
:class:`~prep.auto._decisions.Decisions`'; the report a user reads is
:class:`~prep.auto.Calibration`."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: threads or processes are chosen over the rest only when predicted this much faster
#: (the calibration's slices vary by 10-20% on a busy machine); ties go to no pool
POOL_MARGIN = 1.15
POOLS = ("threads", "processes")
#: observed batch times kept per executor (their median is the figure)
KEEP = 8
#: events kept for ``explain``
EVENTS = 8


class EventLog:
    """Switches, trials, fallbacks and pool starts, in order: the last ``EVENTS``."""

    def __init__(self) -> None:
        self._events: list[str] = []

    def note(self, event: str) -> None:
        self._events.append(event)
        del self._events[:-EVENTS]

    def __iter__(self) -> Iterator[str]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EventLog) and self._events == other._events

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, as a list

    def __repr__(self) -> str:
        return f"EventLog({self._events!r})"


@dataclass
class Figures:
    """What ``auto`` measured and observed for one signature, and what it chose."""

    rows: int
    workers: int
    #: the batch's pad= / on_error= options, as explain prints them ("" for none)
    options: str = ""
    #: seconds setup= took here (each new worker pays it once); 0 without setup=
    setup_seconds: float = 0.0
    serial_row: float = math.nan
    #: seconds per row serially with torch on one worker's share of intra-op threads,
    #: and how many cores' worth torch's own threads made serial faster by
    one_thread_row: float | None = None
    serial_cores: float = 1.0
    vectorized_row: float | None = None
    vmap_row: float | None = None
    thread_speedup: float | None = None
    process_dispatch: float | None = None
    #: seconds starting the process pool costs, measured here (None: not known yet)
    process_start: float | None = None
    bytes_per_row: int = 0
    sample: int = 0
    #: seconds a whole batch of ``rows`` rows is predicted to take, per executor (the
    #: process pool's figure is for a started pool: starting it is ``process_start``)
    predicted: dict[str, float] = field(default_factory=dict)
    #: seconds whole batches took, per executor, scaled to ``rows`` rows
    observed: dict[str, list[float]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    choice: str = "serial"
    seconds: float = 0.0
    #: seconds a started process pool would have saved on the batches run so far
    saved_by_processes: float = 0.0
    batches: int = 0
    #: switches, trials, fallbacks and pool starts, in order, for ``explain``
    events: EventLog = field(default_factory=EventLog)
    #: False: a batched form ran the first batch without winning outright; the next
    #: batch measures the pools against it
    settled: bool = True
    #: the process pool is up and its workers have loaded the function
    processes_ready: bool = False
    #: the dispatch cost was measured on a running pool (else it is assumed)
    dispatch_measured: bool = False
    #: seconds spent checking that rows run in worker processes equal serial's here
    check_seconds: float = 0.0
    #: when the choice was remembered from an earlier interpreter ("" if measured here)
    remembered: str = ""

    # ------------------------------------------------------------ figures

    @property
    def batched_rows(self) -> dict[str, float]:
        """Seconds a row, per batched form that ran (``Executor.estimate`` reads it)."""
        forms = {"vectorized": self.vectorized_row, "vmap": self.vmap_row}
        return {name: per_row for name, per_row in forms.items() if per_row is not None}

    def figure(self, name: str) -> float:
        """Seconds a batch of ``rows`` rows takes with ``name``: observed, else predicted."""
        seen = self.observed.get(name)
        return _median(seen) if seen else self.predicted[name]

    def cost(self, name: str) -> float:
        """:meth:`figure`, counted with ``POOL_MARGIN`` for a pool never observed."""
        # an unobserved pool has to save more than measurement noise to take the cores
        margin = POOL_MARGIN if name in POOLS and not self.observed.get(name) else 1.0
        return self.figure(name) * margin

    def candidates(self) -> list[str]:
        """Executors auto may run now (processes only once started and loaded)."""
        return [n for n in self.predicted if n != "processes" or self.processes_ready]

    def processes_would_save(self, rows: int) -> float:
        """Seconds a started process pool would save over the best other executor on
        ``rows`` rows (counted with ``POOL_MARGIN`` until it has been observed)."""
        others = [n for n in self.candidates() if n != "processes"]
        if self.processes_ready or "processes" not in self.predicted or not others:
            return 0.0
        best = min(self.cost(n) for n in others)
        return max(0.0, best - self.predicted["processes"] * POOL_MARGIN) * rows / self.rows

    # ------------------------------------------------------------ wisdom

    def to_wisdom(self) -> dict[str, Any]:
        """What a later interpreter needs to start where this one is."""
        return {
            "choice": self.choice,
            "rows": self.rows,
            "figures": {n: self.figure(n) for n in self.predicted},
            "serial_row": self.serial_row if math.isfinite(self.serial_row) else None,
            "process_start": self.process_start,
            "thread_speedup": self.thread_speedup,
        }

    def backing(self) -> Any:
        """What backs the choice, to tell when it moved (a new choice, an executor
        measured for the first time, a pool started, or the choice's own figure over
        2 and 8 batches; over 8 only for a choice remembered from an earlier run, whose
        figure already was a whole batch's there)."""
        seen = self.observed.get(self.choice, [])
        return (
            self.choice,
            tuple(sorted(self.observed)),
            self.processes_ready,
            len(seen) in ((8,) if self.remembered else (2, 8)),
        )


def _median(values: list[float]) -> float:
    # statistics.median costs microseconds a call; auto asks for a few medians a batch
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


__all__ = ["EVENTS", "KEEP", "POOLS", "POOL_MARGIN", "EventLog", "Figures"]
