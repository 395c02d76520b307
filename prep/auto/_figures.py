"""What ``auto`` knows about one signature: the figures measured on its first batch,
the batches observed since, and what they cost (:class:`Figures`), with the log
of what happened to them (its ``events``). The decisions taken from them are
:class:`~prep.auto._decisions.Decisions`'; the report a user reads is
:class:`~prep.auto.Calibration`.

What an executor measured of itself is kept under its name (each cost model fills its
own), and what role an executor plays (a pool, one auto rents or buys) is its cost
model's word (:func:`.models.model`): no executor is named here."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .models import model

#: a pool (``CostModel.pooled``) is chosen over the rest only when predicted this much
#: faster (the calibration's slices vary by 10-20% on a busy machine); ties go to no pool
POOL_MARGIN = 1.15
#: observed batch times kept per executor (their median is the figure)
KEEP = 8
#: events kept for ``explain``
EVENTS = 8


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
    #: seconds a row, per batched form that ran on the sample
    batched_rows: dict[str, float] = field(default_factory=dict)
    #: how many times serial's speed, per pool measured on the sample
    speedup: dict[str, float] = field(default_factory=dict)
    #: seconds a batch costs a started executor beyond its rows, per executor
    dispatch: dict[str, float] = field(default_factory=dict)
    #: seconds starting an executor costs, measured here (absent: not known yet)
    start: dict[str, float] = field(default_factory=dict)
    bytes_per_row: int = 0
    sample: int = 0
    #: seconds a whole batch of ``rows`` rows is predicted to take, per executor (a
    #: figure for a started executor: starting it is ``start``)
    predicted: dict[str, float] = field(default_factory=dict)

    #: seconds whole batches took, per executor, scaled to ``rows`` rows
    observed: dict[str, list[float]] = field(default_factory=dict)
    #: why each executor left out was not weighed, by its name
    dropped: dict[str, str] = field(default_factory=dict)
    choice: str = "serial"
    seconds: float = 0.0
    #: seconds a started executor (one auto rents or buys) would have saved on the
    #: batches run so far, per executor
    saved: dict[str, float] = field(default_factory=dict)
    batches: int = 0
    #: switches, trials, fallbacks and pool starts, in order, for ``explain``: the last
    #: ``EVENTS`` of them
    events: deque[str] = field(default_factory=lambda: deque(maxlen=EVENTS))
    #: False: a batched form ran the first batch without winning outright; the next
    #: batch measures the pools against it
    settled: bool = True
    #: executors auto rents or buys that are up, their workers having loaded the function
    started: set[str] = field(default_factory=set)
    #: the dispatch cost was measured on a running pool (else it is assumed)
    dispatch_measured: bool = False
    #: seconds spent checking that rows run in worker processes equal serial's here
    check_seconds: float = 0.0
    #: when the choice was remembered from an earlier interpreter ("" if measured here)
    remembered: str = ""

    def drop(self, names: tuple[str, ...], reason: str) -> None:
        """``names`` are not weighed, each for ``reason``."""
        for name in names:
            self.dropped[name] = reason

    # ------------------------------------------------------------ figures

    def figure(self, name: str) -> float:
        """Seconds a batch of ``rows`` rows takes with ``name``: observed, else predicted."""
        seen = self.observed.get(name)
        return _median(seen) if seen else self.predicted[name]

    def cost(self, name: str) -> float:
        """:meth:`figure`, counted with ``POOL_MARGIN`` for a pool never observed."""
        # an unobserved pool has to save more than measurement noise to take the cores
        margin = POOL_MARGIN if model(name).pooled and not self.observed.get(name) else 1.0
        return self.figure(name) * margin

    def candidates(self) -> list[str]:
        """Executors auto may run now (one it rents or buys only once started and loaded)."""
        return [n for n in self.predicted if not model(n).rent_or_buy or n in self.started]

    def to_start(self) -> list[str]:
        """Executors predicted that auto rents or buys and has not started."""
        return [n for n in self.predicted if model(n).rent_or_buy and n not in self.started]

    def would_save(self, name: str, rows: int) -> float:
        """Seconds ``name``, once started, would save over the best other executor on
        ``rows`` rows (counted with ``POOL_MARGIN`` until it has been observed)."""
        others = [n for n in self.candidates() if n != name]
        if name in self.started or name not in self.predicted or not others:
            return 0.0
        best = min(self.cost(n) for n in others)
        return max(0.0, best - self.predicted[name] * POOL_MARGIN) * rows / self.rows

    # ------------------------------------------------------------ wisdom

    def to_wisdom(self) -> dict[str, Any]:
        """What a later interpreter needs to start where this one is."""
        return {
            "choice": self.choice,
            "rows": self.rows,
            "figures": {n: self.figure(n) for n in self.predicted},
            "serial_row": self.serial_row if math.isfinite(self.serial_row) else None,
            "start": dict(self.start),
            "speedup": dict(self.speedup),
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
            tuple(sorted(self.started)),
            len(seen) in ((8,) if self.remembered else (2, 8)),
        )


def _median(values: list[float]) -> float:
    # statistics.median costs microseconds a call; auto asks for a few medians a batch
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


__all__ = ["EVENTS", "KEEP", "POOL_MARGIN", "Figures"]
